"""Machine capabilities (issue 13) against the lab, proven from libvirt and from inside one busybox guest:
CPU topology, swap, disk QoS (iotune, changed live), a fixed DHCP address and an encrypted (LUKS) volume. The
guest boots from an encrypted full copy of the image (issue 50: vitistack's encrypted boot disk), not an overlay.

One guest of 2 vCPUs serves every assertion; its user-data script reports what the guest sees on the console.
Changes that wait for a restart (topology, a new fixed address) are checked in the persistent definition and on
the network, without a second boot (a TCG boot of 2 vCPUs is the bulk of this file's time).
"""

import json
import os
import re
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest

from conftest import Pool, load_lab, register, run_module, unheld_addresses, warnings_of

NAME = "cap-1"
OTHER = "cap-2"
PASSPHRASE = "machinery capabilities 7f3a passphrase"
MARKER = "MACHINERY-LUKS-MARK-5c2e"
DATA_SECTORS = 64 * 2048  # the 64Mi data volume, as the guest counts it
# The guest's report: its CPUs' topology, its disks (with serials), swap on the disk whose serial is
# machinery-swap, and a marker written to the encrypted volume (the one of 96Mi less its LUKS header).
SCRIPT = """#!/bin/sh
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  t=$c/topology
  echo "CAP-CPU ${c##*/} package=$(cat $t/physical_package_id) core=$(cat $t/core_id) siblings=$(cat $t/thread_siblings_list)"
done
for b in /sys/block/vd*; do
  d=${b##*/}; serial=$(cat $b/serial 2>/dev/null); sectors=$(cat $b/size)
  echo "CAP-DISK $d serial=$serial sectors=$sectors"
  if [ "$serial" = machinery-swap ]; then
    mkswap /dev/$d >/dev/null 2>&1 && swapon /dev/$d && echo "CAP-SWAPON $d"
  elif [ "$sectors" -gt 150000 ] && [ "$sectors" -le 196608 ]; then
    echo %(marker)s | dd of=/dev/$d bs=512 conv=sync 2>/dev/null; sync
    echo "CAP-READBACK $d $(dd if=/dev/$d bs=512 count=1 2>/dev/null | head -c %(length)d)"
  fi
done
sed 's/^/CAP-SWAPS /' /proc/swaps
""" % {"marker": MARKER, "length": len(MARKER)}


def addresses(pool):
    """The two highest addresses of the DHCP range of the pool's network machinery that no host entry reserves and
    no lease holds (a fixed pick met the lease of a guest an earlier file had deleted)."""
    net = pool.conn.networkLookupByName("machinery")
    return unheld_addresses(net, ET.fromstring(net.XMLDesc(0)).find("ip/dhcp/range").get("end"), 2)


def hosts(pool):
    tree = ET.fromstring(pool.conn.networkLookupByName("machinery").XMLDesc(0))
    return [host.attrib for host in tree.findall("ip/dhcp/host")]


def plain_blocks(image, size=4096):
    """The image's distinct 4 KiB blocks that are not all one byte, read as the guest reads them (raw)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "image.raw")
        subprocess.run(["qemu-img", "convert", "-O", "raw", image, raw], check=True)
        with open(raw, "rb") as handle:
            data = handle.read()
    blocks = {data[offset:offset + size] for offset in range(0, len(data), size)}
    return {block for block in blocks if len(set(block)) > 1}


def secrets(pool):
    return sorted(secret.UUIDString() for secret in pool.conn.listAllSecrets(0))


def args(pool, image, ip, **extra):
    """The machine: no image of its own, it boots its first volume, an encrypted copy of ``image``; ``volumes``
    in ``extra`` are the ones after it."""
    boot = {"name": "boot", "image": image, "encrypted": True, "passphrase": PASSPHRASE}
    base = dict(uri=pool.uri, name=NAME, cpu=2, memory="128Mi", wait="address", wait_timeout=900,
                topology={"sockets": 2, "cores": 1, "threads": 1}, swap="64Mi", shutdown_timeout=30,
                volumes=[{"name": "data", "size": "64Mi", "iops": 500, "throughput": 200},
                         {"name": "secure", "size": "96Mi", "encrypted": True, "passphrase": PASSPHRASE}],
                network_interfaces=[{"name": "eth0", "network": "machinery", "ip_address": ip}],
                cloud_init={"user_data": SCRIPT})
    base.update(extra)
    base["volumes"] = [boot] + base["volumes"]
    return base


def report(pool):
    text = pool.wait_console(NAME, "MACHINERY-SCRIPT-END", timeout=900)
    return text[text.rindex("MACHINERY-SCRIPT-BEGIN"):]


@pytest.fixture(scope="module")
def lab_pool():
    lab = load_lab()
    pool = Pool(lab["pools"][0]["name"], lab["pools"][0]["uri"])
    register(pool)
    for name in (NAME, OTHER):
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    yield pool, lab["image"]
    for name in (NAME, OTHER):
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)


@pytest.fixture(scope="module")
def guest(lab_pool):
    """The guest created with every capability (after a check-mode run that creates nothing)."""
    pool, image = lab_pool
    ip, other = addresses(pool)
    before = (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool))
    checked = run_module("machine", check=True, **args(pool, image, ip))
    assert checked.get("changed") and checked["actions"] == ["create", "start"], checked
    after = checked["plan"][0]["after"]
    assert after["topology"] == {"sockets": 2, "cores": 1, "threads": 1} and after["swap"] == "64Mi"
    assert after["disk_qos"] == {"data": {"iops": 500, "throughput": 200}}
    assert after["ip_reservations"] == {"eth0": ip}
    assert (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool)) == before
    started = time.monotonic()
    created = run_module("machine", **args(pool, image, ip))
    assert not created.get("failed"), created
    return {"pool": pool, "image": image, "ip": ip, "other": other, "created": created, "seconds": time.monotonic() - started,
            "report": report(pool), "secrets": before[2], "volumes": args(pool, image, ip)["volumes"]}


def test_created_with_every_capability(guest):
    machine = guest["created"]["machine"]
    assert machine["topology"] == {"sockets": 2, "cores": 1, "threads": 1}
    assert machine["swap"] == "64Mi"
    volumes = {vol["name"]: vol for vol in machine["volumes"]}
    assert (volumes["data"]["iops"], volumes["data"]["throughput"]) == (500, 200)
    assert volumes["secure"]["encrypted"] is True and volumes["swap"]["size"] == "64Mi"
    assert volumes["boot"]["encrypted"] is True and volumes["boot"]["size"] == "24Mi"  # the image's own size
    assert machine["network_interfaces"][0]["ip_address"] == guest["ip"]
    assert guest["ip"] in machine["ip_addresses"]
    dom = guest["pool"].domain(NAME)
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert tree.find("cpu/topology").get("sockets") == "2"
    swap = [disk for disk in tree.findall("devices/disk") if disk.findtext("serial") == "machinery-swap"]
    assert len(swap) == 1 and swap[0].find("source").get("file").endswith("/%s-swap.qcow2" % NAME)


def test_rerun_changes_nothing(guest):
    pool = guest["pool"]
    again = run_module("machine", **args(pool, guest["image"], guest["ip"]))
    assert not again["changed"], again
    assert again["actions"] == []


def test_guest_sees_topology_swap_and_its_address(guest):
    text = guest["report"]
    cpus = re.findall(r"CAP-CPU cpu(\d+) package=(\d+) core=(\d+) siblings=(\S+)", text)
    assert sorted(package for _cpu, package, _core, _siblings in cpus) == ["0", "1"], text
    assert all(siblings == cpu for cpu, _package, _core, siblings in cpus), text
    assert re.search(r"CAP-SWAPON vd[a-z]", text), text
    swap_device = re.search(r"CAP-SWAPON (vd[a-z])", text).group(1)
    assert re.search(r"CAP-SWAPS /dev/%s\s+partition\s+65532" % swap_device, text), text
    console = guest["pool"].console(NAME)
    assert "MACHINERY-ADDRESS eth0 %s" % guest["ip"] in console, console[-2000:]
    assert re.search(r"CAP-READBACK vd[a-z] %s" % MARKER, text), text
    # it booted from vda, the encrypted copy of the 24Mi image, which it reads as a plain disk of that size
    assert re.search(r"CAP-DISK vda serial=\S* sectors=%d" % (24 * 2048), text), text


def test_qos_changes_live(guest):
    pool = guest["pool"]
    volumes = [{"name": "data", "size": "64Mi", "iops": 1000, "throughput": 300},
               {"name": "secure", "size": "96Mi", "encrypted": True, "passphrase": PASSPHRASE}]
    changed = run_module("machine", **args(pool, guest["image"], guest["ip"], volumes=volumes))
    assert changed["changed"] and changed["actions"] == ["update disk_qos"], changed
    assert changed["diff"]["before"]["disk_qos"]["data"] == {"iops": 500, "throughput": 200}
    assert changed["diff"]["after"]["disk_qos"]["data"] == {"iops": 1000, "throughput": 300}
    assert changed["restart_required"] is False
    dom = pool.domain(NAME)
    live = dom.blockIoTune("vdb", libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert (live["total_iops_sec"], live["total_bytes_sec"]) == (1000, 300 * 10 ** 6), live
    persistent = dom.blockIoTune("vdb", libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert (persistent["total_iops_sec"], persistent["total_bytes_sec"]) == (1000, 300 * 10 ** 6)
    again = run_module("machine", **args(pool, guest["image"], guest["ip"], volumes=volumes))
    assert not again["changed"], again
    guest["volumes"] = volumes


def test_an_address_held_by_another_machine_is_refused(guest):
    pool = guest["pool"]
    before = (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool))
    taken = run_module("machine", uri=pool.uri, name=OTHER, machine_class="small", image=guest["image"],
                       state="present", wait="none",
                       network_interfaces=[{"name": "eth0", "network": "machinery", "ip_address": guest["ip"]}])
    assert taken.get("failed") and taken["field"] == "network_interfaces[0].ip_address", taken
    assert "reserved" in taken["msg"] and NAME in taken["msg"], taken["msg"]
    assert (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool)) == before


def test_topology_and_address_change_at_restart(guest):
    pool = guest["pool"]
    new_ip = guest["other"]
    changed = run_module("machine", **args(pool, guest["image"], new_ip,
                                           topology={"sockets": 1, "cores": 2, "threads": 1},
                                           volumes=guest["volumes"]))
    assert changed["changed"] and changed["actions"] == ["update topology, ip_reservations"], changed
    assert changed["diff"]["before"]["topology"] == {"sockets": 2, "cores": 1, "threads": 1}
    assert changed["diff"]["after"]["ip_reservations"] == {"eth0": new_ip}
    assert changed["restart_required"] is True
    assert any("next restart" in text for text in warnings_of(changed))
    mac = changed["machine"]["network_interfaces"][0]["mac"]
    assert [host for host in hosts(pool) if host["mac"] == mac] == [{"mac": mac, "ip": new_ip, "name": NAME}]
    tree = ET.fromstring(pool.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    assert (tree.find("cpu/topology").get("sockets"), tree.find("cpu/topology").get("cores")) == ("1", "2")
    live = ET.fromstring(pool.domain(NAME).XMLDesc(0))
    assert live.find("cpu/topology").get("sockets") == "2"  # the running guest keeps its topology until restarted
    guest["ip"] = new_ip


def test_encrypted_volume_holds_no_plain_text_and_no_passphrase_leaks(guest):
    pool = guest["pool"]
    stopped = run_module("machine", **args(pool, guest["image"], guest["ip"], state="stopped",
                                           topology={"sockets": 1, "cores": 2, "threads": 1},
                                           volumes=guest["volumes"]))
    assert not stopped.get("failed") and stopped["actions"] == ["stop"], stopped
    content = pool.download("%s-secure.luks" % NAME)
    assert content[:6] == b"LUKS\xba\xbe", content[:16]
    assert MARKER.encode() not in content
    # the boot disk: LUKS too, a full copy (no backing image), and none of the image's data in the clear
    boot = pool.download("%s-boot.luks" % NAME)
    assert boot[:6] == b"LUKS\xba\xbe" and len(boot) > 24 * 2 ** 20, boot[:16]
    disks = ET.fromstring(pool.domain(NAME).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)).findall("devices/disk")
    vda = [disk for disk in disks if disk.find("target").get("dev") == "vda"]
    assert len(vda) == 1 and vda[0].find("source").get("file").endswith("/%s-boot.luks" % NAME)
    assert vda[0].find("source/encryption") is not None and vda[0].find("backingStore/source") is None
    # LUKS puts its data at a 4 KiB-aligned offset: a block of the image left in the clear would be one of these
    plain = plain_blocks(guest["image"])
    assert len(plain) >= 16 and not plain & {boot[offset:offset + 4096] for offset in range(0, len(boot), 4096)}
    dom = pool.domain(NAME)
    for xml in (dom.XMLDesc(0), dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)):
        assert PASSPHRASE not in xml
    assert PASSPHRASE not in json.dumps(stopped) and PASSPHRASE not in json.dumps(guest["created"])
    path = next(source.get("file") for source in ET.fromstring(dom.XMLDesc(0)).findall("devices/disk/source")
                if source.find("encryption") is not None)
    secret = pool.conn.secretLookupByUsage(libvirt.VIR_SECRET_USAGE_TYPE_VOLUME, path)
    assert "private='yes'" in secret.XMLDesc(0)
    with pytest.raises(libvirt.libvirtError):
        secret.value()


def test_delete_releases_everything(guest):
    pool = guest["pool"]
    deleted = run_module("machine", uri=pool.uri, name=NAME, state="absent", shutdown_timeout=5)
    assert deleted["changed"], deleted
    assert pool.domain(NAME) is None
    assert not [name for name in pool.volumes() if name.startswith(NAME + "-")]
    assert not [host for host in hosts(pool) if host.get("name") == NAME]
    assert secrets(pool) == guest["secrets"]
    again = run_module("machine", uri=pool.uri, name=NAME, state="absent")
    assert not again["changed"], again


def test_batch_takes_the_same_options_and_masks_the_passphrase(lab_pool):
    pool, image = lab_pool
    before = (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool))
    machine = {"name": "cap-batch", "cpu": 2, "memory": "128Mi", "image": image, "state": "present",
               "topology": {"cores": 2}, "swap": "32Mi", "network_interfaces": [],
               "volumes": [{"name": "secure", "size": "16Mi", "encrypted": True, "passphrase": PASSPHRASE},
                           {"name": "data", "size": "16Mi", "iops": 100, "throughput": 125}]}
    planned = run_module("machine_batch", check=True, pools=[pool.uri], machines=[machine])
    assert not planned.get("failed") and planned["changed"], planned
    assert PASSPHRASE not in json.dumps(planned)
    refused = run_module("machine_batch", check=True, pools=[pool.uri],
                         machines=[dict(machine, topology={"cores": 3})])
    assert refused.get("failed") and PASSPHRASE not in json.dumps(refused), refused
    assert any(failure.get("field") == "machines[0].topology" for failure in refused.get("failures") or []) or \
        "topology" in refused["msg"], refused
    assert (pool.domain_names(), pool.volumes(), secrets(pool), hosts(pool)) == before
