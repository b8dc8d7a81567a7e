"""The emulated TPM 2.0 of a busybox guest: in the domain, seen by the guest, its state deleted with the machine.

The guest's kernel finds the CRB TPM (/dev/tpm0, /sys/class/tpm/tpm0) and asks it for random bytes through the
guest agent; libvirt keeps the swtpm state under the pool's /var/lib/libvirt/swtpm/<uuid>, which the lab binds
below its pool directory, and removes it when the machine is deleted.
"""

import os

import pytest
from lxml import etree

from conftest import first_pool, load_lab, run_module
from test_34_images import agent_of, shell

MACHINE = "fw-tpm"


@pytest.fixture(scope="module")
def fw_pool():
    with first_pool(clean) as pool:
        yield pool


def clean(pool):
    if pool.domain(MACHINE) is not None:
        run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)


def swtpm_state(pool, uuid):
    """The pool's swtpm state directory of the domain ``uuid`` (the lab binds /var/lib/libvirt below its dir)."""
    entry = next(item for item in load_lab()["pools"] if item["name"] == pool.name)
    pool_dir = os.path.dirname(os.path.dirname(entry["uri"].split("socket=", 1)[1]))
    return os.path.join(pool_dir, "lib", "swtpm", uuid)


def tpm_of(pool):
    tree = etree.fromstring(pool.domain(MACHINE).XMLDesc(2))
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

    gone = run_module("machine", uri=pool.uri, name=MACHINE, state="absent", shutdown_timeout=0)
    assert gone["changed"], gone
    assert pool.domain(MACHINE) is None
    assert not os.path.exists(swtpm_state(pool, uuid))


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
