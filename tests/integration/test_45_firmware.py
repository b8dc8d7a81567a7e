"""Firmware of busybox guests: the emulated TPM 2.0, Secure Boot, UEFI variables carried by a move, and UEFI
variables written by efi_vars (and IronCore's efiVars), read by the guest (efivarfs) and from the store.

The guest's kernel finds the CRB TPM (/dev/tpm0, /sys/class/tpm/tpm0); a value extended into PCR 16 with a raw
TPM2_PCR_Extend written to /dev/tpm0 is read back after a live move; libvirt keeps the swtpm state under the
pool's /var/lib/libvirt/swtpm/<uuid>, which the lab binds below its pool directory, and removes it when the
machine is deleted. Secure Boot is read from the loader libvirt chose; UEFI variables OVMF wrote are read back,
byte for byte, on the pool a cold move took the machine to.
"""

import base64
import hashlib
import os
import shutil
import struct
import subprocess
import time

import pytest
from lxml import etree

from conftest import REPO, Pool, first_pool, load_lab, register, run_module, warnings_of
from test_39_images import agent_of, shell

from ansible_collections.machinery.compute.plugins.module_utils.core import varstore

MACHINE = "fw-tpm"


def octal(data):
    """Bytes as the octal escapes the guest's printf writes."""
    return "".join("\\%03o" % byte for byte in data)


# the authorization area of a command under an empty password session: its size (9), TPM_RS_PW, no nonce, no
# attributes, no password
PASSWORD_SESSION = struct.pack(">IIHBH", 9, 0x40000009, 0, 0, 0)
# TPM2_PCR_Extend (tag TPM_ST_SESSIONS, 65 bytes, command 0x182) of PCR 16, the debug PCR, with one sha256 digest
# of 32 bytes 0x41
EXTEND = octal(struct.pack(">HIII", 0x8002, 65, 0x182, 16) + PASSWORD_SESSION + struct.pack(">IH", 1, 0x000B) +
               b"A" * 32)
# PCR 16 after that one extension from its reset value: sha256(32 zero bytes || 32 bytes 0x41)
EXTENDED = hashlib.sha256(bytes(32) + b"A" * 32).hexdigest().upper()
PCR16 = "cat /sys/class/tpm/tpm0/pcr-sha256/16"
# TPM2_NV_Read (35 bytes, command 0x14E) of the first 128 bytes of the NV index 0x01c00002, the RSA endorsement
# key's certificate that swtpm_setup wrote when libvirt first started the TPM (the index authorizes its own
# reads): unique to this TPM, and kept across power cycles
READ_EK_CERT = octal(struct.pack(">HIIII", 0x8002, 35, 0x14E, 0x01C00002, 0x01C00002) + PASSWORD_SESSION +
                     struct.pack(">HH", 128, 0))


@pytest.fixture(scope="module")
def fw_pool():
    with first_pool(clean) as pool:
        yield pool


def clean(_pool):
    for entry in load_lab()["pools"][:2]:  # the TPM test moves its machine to the second pool
        pool = Pool(entry["name"], entry["uri"])
        if pool.domain(MACHINE) is not None:
            run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)


def swtpm_state(pool, uuid):
    """The pool's swtpm state directory of the domain ``uuid`` (the lab binds /var/lib/libvirt below its dir)."""
    entry = next(item for item in load_lab()["pools"] if item["name"] == pool.name)
    pool_dir = os.path.dirname(os.path.dirname(entry["uri"].split("socket=", 1)[1]))
    return os.path.join(pool_dir, "lib", "swtpm", uuid)


def tpm_command(agent, command):
    """The TPM's response to a raw command (octal escapes) written to /dev/tpm0 in the guest, as hex bytes."""
    return shell(agent, "exec 3<>/dev/tpm0; printf '%s' >&3; dd bs=4096 count=1 <&3 2>/dev/null | od -An -tx1"
                 % command).split()


def tpm_of(pool):
    return tpm_of_machine(pool, MACHINE)


def tpm_of_machine(pool, name):
    tree = etree.fromstring(pool.domain(name).XMLDesc(2))
    return [(node.get("model"), node.find("backend").get("type"), node.find("backend").get("version"))
            for node in tree.findall("devices/tpm")]


def test_tpm_seen_by_the_guest_and_deleted_with_the_machine(fw_pool):
    pool = fw_pool
    args = dict(uri=pool.uri, name=MACHINE, machine_class="small", image=load_lab()["image"],
                network_interfaces=[], shutdown_timeout=10, tpm=True)
    planned = run_module("machine", check=True, **args)
    assert planned["changed"] and pool.domain(MACHINE) is None, planned
    made = run_module("machine", **args)
    assert made["changed"] and not made.get("failed"), made
    assert tpm_of(pool) == [("tpm-crb", "emulator", "2.0")]
    again = run_module("machine", **args)
    assert again["changed"] is False, again
    agent = agent_of(pool, MACHINE)
    assert shell(agent, "cat /sys/class/tpm/tpm0/tpm_version_major").strip() == "2"
    assert shell(agent, "test -c /dev/tpm0 && echo present").strip() == "present"
    uuid = pool.domain(MACHINE).UUIDString()
    assert os.path.isdir(swtpm_state(pool, uuid))
    # a value extended into a PCR, read back by the guest's kernel
    assert shell(agent, PCR16).strip() == "0" * 64
    response = tpm_command(agent, EXTEND)
    assert response[6:10] == ["00", "00", "00", "00"], response  # TPM_RC_SUCCESS
    assert shell(agent, PCR16).strip() == EXTENDED

    # a live move carries the whole TPM state, PCRs included, in QEMU's migration stream
    other = next((Pool(entry["name"], entry["uri"]) for entry in load_lab()["pools"][1:2]), None)
    if other is not None:
        register(other)
        moved = run_module("machine_migrate", uri=pool.uri, machine=MACHINE, target=other.uri, mode="live")
        assert moved["changed"] and not moved.get("failed"), moved
        assert shell(agent_of(other, MACHINE), PCR16).strip() == EXTENDED
        assert os.path.isdir(swtpm_state(other, uuid)) and not os.path.exists(swtpm_state(pool, uuid))
        # a cold move restarts the guest (its PCRs start again from zero, as at any power on) with the same TPM:
        # the endorsement key's certificate in its NV memory is the one it had
        certificate = tpm_command(agent_of(other, MACHINE), READ_EK_CERT)
        assert certificate[6:10] == ["00", "00", "00", "00"] and len(certificate) > 100, certificate
        moved = run_module("machine_migrate", uri=other.uri, machine=MACHINE, target=pool.uri, mode="cold",
                           shutdown_timeout=10)
        assert moved["changed"] and not moved.get("failed"), moved
        agent = agent_of(pool, MACHINE)
        assert shell(agent, PCR16).strip() == "0" * 64
        assert tpm_command(agent, READ_EK_CERT) == certificate

        # a backup keeps the TPM: its state lost from the host and the backup restored, the same endorsement
        # certificate is back (a TPM made anew at the start would have another)
        taken = run_module("machine_backup", uri=pool.uri, machine=MACHINE, name="with-tpm")
        assert taken["changed"] and not taken.get("failed"), taken
        assert any(".backup.with-tpm.tpm." in name for name in pool.volumes()), pool.volumes()
        stopped = run_module("machine", **dict(args, state="stopped"))
        assert not stopped.get("failed") and not pool.domain(MACHINE).isActive(), stopped
        shutil.rmtree(swtpm_state(pool, uuid))
        restored = run_module("machine_backup", uri=pool.uri, machine=MACHINE, name="with-tpm", restore=True)
        assert restored["changed"] and not restored.get("failed"), restored
        assert os.path.isdir(swtpm_state(pool, uuid))
        started = run_module("machine", **dict(args, state="running"))
        assert not started.get("failed"), started
        assert tpm_command(agent_of(pool, MACHINE), READ_EK_CERT) == certificate
        dropped = run_module("machine_backup", uri=pool.uri, machine=MACHINE, name="with-tpm", state="absent")
        assert dropped["changed"] and not any(".backup.with-tpm." in name for name in pool.volumes()), dropped

    gone = run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)
    assert gone["changed"], gone
    assert pool.domain(MACHINE) is None
    assert not os.path.exists(swtpm_state(pool, uuid))


BROKEN = "fw-broken"


def test_tpm_that_cannot_start_leaves_the_machine_whole(fw_pool):
    """swtpm_setup fails (the pool's swtpm local CA not writable by libvirt's swtpm user): the create fails naming
    tpm and libvirt's cause, says the machine was created, and leaves it whole, stopped; a re-run once the pool
    is mended starts it with its TPM; deleting it leaves nothing."""
    pool = fw_pool
    entry = next(item for item in load_lab()["pools"] if item["name"] == pool.name)
    localca = os.path.join(os.path.dirname(os.path.dirname(entry["uri"].split("socket=", 1)[1])), "swtpm-localca")
    mode = os.stat(localca).st_mode
    args = dict(uri=pool.uri, name=BROKEN, machine_class="small", image=load_lab()["image"], network_interfaces=[],
                shutdown_timeout=0, wait="none", tpm=True)
    try:
        os.chmod(localca, 0)
        failed = run_module("machine", **args)
        assert failed.get("failed") and failed["field"] == "tpm" and failed["reason"] == "LibvirtError", failed
        assert "swtpm_setup" in failed["msg"] and failed["changed"] and failed["done"] == ["create %s" % BROKEN]
        assert pool.domain(BROKEN).state()[0] == 5  # shut off: defined, with its disks
        assert {"%s-root.qcow2" % BROKEN, "%s-console.log" % BROKEN} <= set(pool.volumes())
        status = run_module("machine_info", uri=pool.uri, name=BROKEN)["machines"][0]
        assert status["phase"] == "Pending" and "swtpm_setup" in status["last_error"], status
        again = run_module("machine", **args)
        assert again.get("failed") and not again.get("changed") and again["field"] == "tpm", again
        os.chmod(localca, mode)
        mended = run_module("machine", **args)
        # what the failed run left: the start, and the autostart of its run strategy that follows it
        assert mended["changed"] and not mended.get("failed") and mended["actions"][0] == "start", mended
        assert pool.domain(BROKEN).isActive() and tpm_of_machine(pool, BROKEN) == [("tpm-crb", "emulator", "2.0")]
        uuid = pool.domain(BROKEN).UUIDString()
        assert os.path.isdir(swtpm_state(pool, uuid))
        gone = run_module("machine", uri=pool.uri, name=BROKEN, state="absent", shutdown_timeout=0)
        assert gone["changed"] and not gone.get("failed"), gone
        assert pool.domain(BROKEN) is None and not [name for name in pool.volumes() if name.startswith(BROKEN)]
        assert not os.path.exists(swtpm_state(pool, uuid))
    finally:
        os.chmod(localca, mode)
        if pool.domain(BROKEN) is not None:
            run_module("machine", uri=pool.uri, name=BROKEN, state="absent", shutdown_timeout=0)


SECURE = "fw-secure"


def test_secure_boot_firmware_chosen_by_libvirt(fw_pool):
    pool = fw_pool
    args = dict(uri=pool.uri, name=SECURE, machine_class="small", image=load_lab()["image"],
                network_interfaces=[], shutdown_timeout=0, wait="none")
    try:
        refused = run_module("machine", firmware="bios", secure_boot=True, **args)
        assert refused.get("failed") and refused["field"] == "secure_boot" and "UEFI" in refused["msg"], refused
        assert pool.domain(SECURE) is None
        made = run_module("machine", firmware="uefi", secure_boot=True, **args)
        assert made["changed"] and not made.get("failed"), made
        # the running domain: libvirt picked the OVMF build with the keys enrolled, and its variables' template
        live = etree.fromstring(pool.domain(SECURE).XMLDesc(0))
        loader = live.find("os/loader")
        assert loader.get("secure") == "yes" and loader.text.endswith(".ms.fd"), etree.tostring(loader)
        assert live.find("os/nvram").get("template").endswith("OVMF_VARS_4M.ms.fd")
        assert live.find("features/smm").get("state") == "on"
        again = run_module("machine", firmware="uefi", secure_boot=True, **args)
        assert again["changed"] is False, again
        changed = run_module("machine", firmware="uefi", secure_boot=False, **args)
        assert changed.get("failed") and changed["field"] == "secure_boot", changed
    finally:
        if pool.domain(SECURE) is not None:
            run_module("machine", uri=pool.uri, name=SECURE, state="absent", shutdown_timeout=0)


UEFI = "fw-uefi"
VARS_TEMPLATE = "/usr/share/OVMF/OVMF_VARS_4M.fd"


def nvram_digest(pool, name):
    return hashlib.sha256(pool.download("%s-nvram.fd" % name)).hexdigest()


def test_uefi_variables_move_with_the_machine():
    lab = load_lab()
    if len(lab["pools"]) < 2:
        pytest.skip("a move needs two pools")
    first, second = (Pool(entry["name"], entry["uri"]) for entry in lab["pools"][:2])
    for pool in (first, second):
        register(pool)
        if pool.domain(UEFI) is not None:
            run_module("machine", uri=pool.uri, name=UEFI, state="absent", shutdown_timeout=0)
        run_module("machine_backup", uri=pool.uri, machine=UEFI, name="b1", state="absent")
    args = dict(name=UEFI, machine_class="small", image=lab["image"], network_interfaces=[], shutdown_timeout=0,
                firmware="uefi", wait="none")
    try:
        made = run_module("machine", uri=first.uri, **args)
        assert made["changed"] and not made.get("failed"), made
        nvram = etree.fromstring(first.domain(UEFI).XMLDesc(2)).findtext("os/nvram")
        assert nvram.endswith("/%s-nvram.fd" % UEFI), nvram
        with open(VARS_TEMPLATE, "rb") as handle:
            template = hashlib.sha256(handle.read()).hexdigest()
        # OVMF writes its variables (boot entries, its counters) while it runs: wait until it has
        deadline = time.monotonic() + 240
        while nvram_digest(first, UEFI) == template:
            assert time.monotonic() < deadline, "OVMF wrote no variable"
            time.sleep(2)
        stopped = run_module("machine", uri=first.uri, state="stopped", **args)
        assert not stopped.get("failed"), stopped
        before = nvram_digest(first, UEFI)
        assert before != template
        moved = run_module("machine_migrate", uri=first.uri, machine=UEFI, target=second.uri, mode="cold",
                           shutdown_timeout=0, wait="none")
        assert moved["changed"] and not moved.get("failed"), moved
        assert first.domain(UEFI) is None and "%s-nvram.fd" % UEFI not in first.volumes()
        moved_xml = etree.fromstring(second.domain(UEFI).XMLDesc(2))
        assert moved_xml.findtext("os/nvram") == nvram.replace(
            os.path.dirname(nvram), storage_dir(second))
        assert nvram_digest(second, UEFI) == before
        # a backup keeps the variables; a boot since changes them (OVMF counts boots in them); a restore brings
        # back the ones of the backup
        backup = dict(uri=second.uri, machine=UEFI, name="b1")
        taken = run_module("machine_backup", **backup)
        assert taken["changed"] and not taken.get("failed"), taken
        assert hashlib.sha256(second.download("%s.backup.b1.nvram.fd" % UEFI)).hexdigest() == before
        assert not run_module("machine", uri=second.uri, state="running", **args).get("failed")
        deadline = time.monotonic() + 240
        while nvram_digest(second, UEFI) == before:
            assert time.monotonic() < deadline, "OVMF wrote no variable at its second boot"
            time.sleep(2)
        assert not run_module("machine", uri=second.uri, state="stopped", **args).get("failed")
        restored = run_module("machine_backup", restore=True, **backup)
        assert restored["changed"] and not restored.get("failed"), restored
        assert nvram_digest(second, UEFI) == before
        dropped = run_module("machine_backup", state="absent", **backup)
        assert dropped["changed"] and "%s.backup.b1.nvram.fd" % UEFI not in second.volumes()
        gone = run_module("machine", uri=second.uri, name=UEFI, state="absent", shutdown_timeout=0)
        assert gone["changed"], gone
        assert "%s-nvram.fd" % UEFI not in second.volumes()
    finally:
        for pool in (first, second):
            if pool.domain(UEFI) is not None:
                run_module("machine", uri=pool.uri, name=UEFI, state="absent", shutdown_timeout=0)


def storage_dir(pool):
    return etree.fromstring(pool.conn.storagePoolLookupByName("machinery").XMLDesc(0)).findtext("target/path")


# a vendor GUID of our own for the test's variable, and bytes with a NUL, a 0xff and a newline among them
VENDOR = "5f0b7a3e-91c4-4d2a-8e6f-2c7d9b1a4e08"
VARIABLE = "MachineryTest"
DATA = b"\x00machinery\xffefi\n\x01"
# NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS, little endian: the first 4 bytes efivarfs shows
ATTRIBUTES = b"\x07\x00\x00\x00"


def stored_variable(pool, name, vendor=VENDOR, variable=VARIABLE):
    """The data of the variable in the machine's store as the pool holds it (read through libvirt), or None."""
    found = varstore.variables(pool.download("%s-nvram.fd" % name)).get((vendor, variable))
    return None if found is None else (found.attributes, found.data)


def efi_entry(data):
    return {"name": VARIABLE, "guid": VENDOR, "value": base64.b64encode(data).decode()}


SIGNED = "fw-signed"


def secureboot_image():
    """$MACHINERY_SECUREBOOT_IMAGE, else built beside the lab's test image from it and Debian's signed shim and
    GRUB (lab/image/secureboot/build.sh; cached by its recipe)."""
    path = os.environ.get("MACHINERY_SECUREBOOT_IMAGE")
    if path:
        return path
    image = load_lab()["image"]
    script = os.path.join(REPO, "lab", "image", "secureboot", "build.sh")
    built = subprocess.run([script, os.path.dirname(image), image], capture_output=True, text=True, timeout=600,
                           check=False)
    if built.returncode != 0:
        pytest.skip("cannot build the Secure Boot test image: %s" % built.stderr[-2000:])
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def signed(fw_pool):
    """A machine of the Secure Boot image with Secure Boot on and a variable of our own given by efi_vars, made and
    booted once for the tests below (in this order), deleted after them."""
    pool = fw_pool
    args = dict(uri=pool.uri, name=SIGNED, cpu=1, memory="384Mi", image=secureboot_image(), network_interfaces=[],
                firmware="uefi", secure_boot=True, shutdown_timeout=10, efi_vars=[efi_entry(DATA)])
    try:
        planned = run_module("machine", check=True, **args)
        assert planned["changed"] and "update efi_vars" in planned["actions"], planned
        assert pool.domain(SIGNED) is None
        made = run_module("machine", **args)
        assert made["changed"] and not made.get("failed"), made
        assert made["actions"][:3] == ["create", "update efi_vars", "start"], made["actions"]
        pool.wait_console(SIGNED, "MACHINERY-READY", timeout=300)
        yield pool, args
    finally:
        if pool.domain(SIGNED) is not None:
            run_module("machine", uri=pool.uri, name=SIGNED, state="absent", shutdown_timeout=0)


def test_secure_boot_reported_by_the_guest(signed):
    """Debian's signed shim and GRUB start Debian's signed kernel under Secure Boot; the guest says it is on (the
    keys enrolled from the template were kept when the machine's variable was written into its store)."""
    pool, _args = signed
    agent = agent_of(pool, SIGNED)
    # the kernel reads the firmware's SecureBoot variable at boot and locks itself down when it is set
    kernel_log = shell(agent, "dmesg")
    assert "secureboot: Secure boot enabled" in kernel_log, kernel_log[-3000:]
    assert "Kernel is locked down from EFI Secure Boot" in kernel_log


def test_efi_vars_written_before_the_first_boot_are_read_by_the_guest(signed):
    """The variable written into the store before the first boot is the guest's (efivarfs: its attributes, then
    the bytes given); a second run changes nothing; a new value waits while it runs; check mode writes nothing;
    the stop writes it."""
    pool, args = signed
    assert stored_variable(pool, SIGNED) == (7, DATA)
    shown = shell(agent_of(pool, SIGNED), "od -An -tx1 -v /sys/firmware/efi/efivars/%s-%s" % (VARIABLE, VENDOR))
    assert bytes.fromhex("".join(shown.split())) == ATTRIBUTES + DATA
    again = run_module("machine", **args)
    assert again["changed"] is False and not again.get("failed"), again

    # running: QEMU holds the store, so a new value is not written, and the run says it waits
    second = dict(args, efi_vars=[efi_entry(b"second value")])
    waiting = run_module("machine", **second)
    assert waiting["changed"] is False and waiting["restart_required"] is True, waiting
    assert any("efi_vars of the running machine %s (%s)" % (SIGNED, VARIABLE) in text
               for text in warnings_of(waiting)), warnings_of(waiting)
    assert stored_variable(pool, SIGNED) == (7, DATA)
    stopping = dict(second, state="stopped")
    checked = run_module("machine", check=True, **stopping)
    assert checked["changed"] and checked["actions"][-2:] == ["stop", "update efi_vars"], checked
    assert checked["diff"]["before"]["efi_vars"][0]["value"] == base64.b64encode(DATA).decode(), checked
    assert pool.domain(SIGNED).isActive() and stored_variable(pool, SIGNED) == (7, DATA)
    stopped = run_module("machine", **stopping)
    assert stopped["changed"] and not stopped.get("failed"), stopped
    assert not pool.domain(SIGNED).isActive() and stored_variable(pool, SIGNED) == (7, b"second value")
    assert run_module("machine", **stopping)["changed"] is False


IC_MACHINE = "fw-ic-vars"


def ironcore_documents():
    klass = {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "MachineClass",
             "metadata": {"name": "fw-ic-tiny"}, "capabilities": {"cpu": 1, "memory": "128Mi"}}
    machine = {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine", "metadata": {"name": IC_MACHINE},
               "spec": {"machineClassRef": {"name": "fw-ic-tiny"}, "image": load_lab()["image"],
                        "networkInterfaces": [],
                        "efiVars": [{"name": VARIABLE, "uuid": VENDOR.upper(),
                                     "value": base64.b64encode(DATA).decode()}]}}
    return [klass, machine]


def test_an_ironcore_machine_gets_its_efivars(fw_pool):
    """IronCore's spec.efiVars: the Machine is made a UEFI machine whose store holds the variable before its first
    boot; a re-apply and the re-apply of its export change nothing."""
    pool = fw_pool
    try:
        made = run_module("manifest", pools=[pool.uri], definition=ironcore_documents(), wait="none")
        assert made["changed"] and not made.get("failed"), made
        assert etree.fromstring(pool.domain(IC_MACHINE).XMLDesc(2)).find("os").get("firmware") == "efi"
        assert stored_variable(pool, IC_MACHINE) == (7, DATA)
        again = run_module("manifest", pools=[pool.uri], definition=ironcore_documents(), wait="none")
        assert again["changed"] is False and not again.get("failed"), again
        exported = run_module("manifest_info", pools=[pool.uri], dialect="ironcore", name=[IC_MACHINE])
        machine = next(doc for doc in exported["documents"] if doc["kind"] == "Machine")
        assert machine["spec"]["efiVars"] == [{"name": VARIABLE, "uuid": VENDOR,
                                               "value": base64.b64encode(DATA).decode()}], machine
        reapplied = run_module("manifest", pools=[pool.uri], definition=exported["documents"], wait="none")
        assert reapplied["changed"] is False and not reapplied.get("failed"), reapplied
    finally:
        run_module("manifest", pools=[pool.uri], definition=ironcore_documents(), state="absent",
                   shutdown_timeout=0)
