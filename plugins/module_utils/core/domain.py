# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libvirt domain of a machine: its XML, the record kept in its metadata, and the fields we own.

The owned fields are declared with their options (options.py) and read and written through the functions here.
Edits are made in place on libvirt's own XML so its defaults survive.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements

try:
    from lxml import etree
    HAS_LXML = True
except ImportError:  # reported by the module base with a pointer to the package
    etree = None
    HAS_LXML = False


NAMESPACE = "https://machinery.compute/xmlns/machine/1"
PREFIX = "machinery"
RECORD_TAG = "{%s}machine" % NAMESPACE
RECORD_VERSION = 1
SPARE_ROOT_PORTS = 4
GUEST_AGENT = "org.qemu.guest_agent.0"
IGNITION_FWCFG = "opt/com.coreos/config"


def derive_mac(machine, nic):
    """A stable locally-administered MAC in QEMU's 52:54:00 range from the machine and NIC names."""
    digest = hashlib.sha256(("%s/%s" % (machine, nic)).encode()).digest()
    return "52:54:00:%02x:%02x:%02x" % (digest[0], digest[1], digest[2])


def device_names(count, taken=(), prefix="vd"):
    """The first ``count`` free names vda, vdb, ... vdz, vdaa ... skipping those in ``taken``."""
    names = []
    index = 0
    taken = set(taken)
    while len(names) < count:
        suffix = ""
        number = index
        while True:
            suffix = chr(ord("a") + number % 26) + suffix
            number = number // 26 - 1
            if number < 0:
                break
        candidate = prefix + suffix
        if candidate not in taken:
            names.append(candidate)
        index += 1
    return names


def boot_config_hash(ignition, cloud_init, ssh_keys):
    """A hash of the boot configuration: the record keeps this, never the (secret) configuration itself."""
    if ignition is None and not cloud_init and not ssh_keys:
        return None
    canonical = json.dumps({"ignition": ignition, "cloud_init": cloud_init, "ssh_keys": ssh_keys or []},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- the record in <metadata> ---------------------------------------------------------------------------------

def read_record(tree):
    """The machine record of a parsed domain, or None when the collection did not create it."""
    node = tree.find("metadata/" + RECORD_TAG)
    if node is None or not (node.text or "").strip():
        return None
    try:
        record = json.loads(node.text)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "spec" in record else None


def record_element(record):
    node = etree.Element(RECORD_TAG, nsmap={PREFIX: NAMESPACE})
    node.text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return node


def write_record(tree, record):
    metadata = tree.find("metadata")
    if metadata is None:
        metadata = etree.Element("metadata")
        name = tree.find("name")
        anchor = tree.find("uuid") if tree.find("uuid") is not None else name
        anchor.addnext(metadata)
    old = metadata.find(RECORD_TAG)
    if old is not None:
        metadata.remove(old)
    metadata.append(record_element(record))


def record_xml(record):
    """The record element for virDomainSetMetadata, which adds the namespace itself."""
    node = etree.Element("machine")
    node.text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return etree.tostring(node).decode()


# --- owned fields ---------------------------------------------------------------------------------------------

def _set_text(tree, tag, text, attrib=None):
    node = tree.find(tag)
    if node is None:
        node = etree.SubElement(tree, tag)
    node.text = text
    for key, value in (attrib or {}).items():
        node.set(key, value)


CPU_PERIOD = 100000  # µs: the kernel's default CFS period, the period of a fractional machine's quota
CPU_TUNES = ("global_period", "global_quota")


def read_cpu(tree, _record=None):
    """The machine's CPUs: its vCPUs, or the fraction its CFS quota allows them (<cputune> global_quota over
    global_period, below the vCPU count: a machine of 500m has one vCPU and a quota of half the period)."""
    node = tree.find("vcpu")
    if node is None:
        return None
    count = int(node.get("current") or node.text)
    quota, period = tree.findtext("cputune/global_quota"), tree.findtext("cputune/global_period")
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):
        return count
    if 0 < quota < count * period:
        return round(quota / float(period), 3)
    return count


def write_cpu(tree, record, value):
    """``value`` CPUs: that many vCPUs when whole; a fraction is the vCPUs it rounds up to with a CFS quota of
    the domain as a whole (<cputune> global_period and global_quota: the share of the period all its vCPUs may
    run together, as a Kubernetes CPU limit is), so 500m runs at most half of one host CPU's time."""
    record["spec"]["cpu"] = value
    node = tree.find("vcpu")
    if node is not None and "current" in node.attrib:
        del node.attrib["current"]
    count = int(math.ceil(value))
    _set_text(tree, "vcpu", str(count), {"placement": "static"} if node is None else None)
    tune = tree.find("cputune")
    if count != value:
        if tune is None:
            tune = etree.SubElement(tree, "cputune")
        _set_text(tune, "global_period", str(CPU_PERIOD))
        _set_text(tune, "global_quota", str(int(round(value * CPU_PERIOD))))
    elif tune is not None:
        for name in CPU_TUNES:
            for found in tune.findall(name):
                tune.remove(found)
        if len(tune) == 0 and not (tune.text or "").strip():
            tree.remove(tune)


def read_firmware(tree, _record=None):
    return "uefi" if tree.find("os[@firmware='efi']") is not None else "bios"


def write_firmware(tree, record, value):
    """UEFI through libvirt's firmware auto-selection (it finds OVMF and makes the NVRAM), BIOS by default."""
    record["spec"]["firmware"] = value
    node = tree.find("os")
    if value == "uefi":
        node.set("firmware", "efi")
    elif "firmware" in node.attrib:
        del node.attrib["firmware"]


def read_memory(tree, _record=None):
    return elements.size_of(tree.find("memory"), "KiB")


def write_memory(tree, record, value):
    record["spec"]["memory"] = value
    kib = str(value // 1024)
    _set_text(tree, "memory", kib, {"unit": "KiB"})
    _set_text(tree, "currentMemory", kib, {"unit": "KiB"})


# A run strategy (KubeVirt's runStrategy) as the domain carries it: on_crash restart for the strategies that bring
# a crashed guest back; autostart (not in the XML) is converged by the machine's plan.
RESTARTED_AFTER_CRASH = ("always", "on_failure")


def crash_action(strategy):
    return "restart" if strategy in RESTARTED_AFTER_CRASH else "destroy"


def read_run_strategy(tree, record=None):
    """The recorded strategy while the domain's on_crash agrees with it, else None (converged again)."""
    strategy = (record or {}).get("spec", {}).get("run_strategy")
    if strategy is None or (tree.findtext("on_crash") or "destroy") != crash_action(strategy):
        return None
    return strategy


def write_run_strategy(tree, record, value):
    record["spec"]["run_strategy"] = value
    if value is not None:
        _set_text(tree, "on_crash", crash_action(value))


# --- building a new domain ------------------------------------------------------------------------------------

def _sub(parent, tag, text=None, **attrib):
    node = etree.SubElement(parent, tag, {k.rstrip("_"): str(v) for k, v in attrib.items() if v is not None})
    if text is not None:
        node.text = str(text)
    return node


def generation_volume(machine, generation, kind):
    """The volume of a machine's root disk or boot file (``kind``: root.qcow2, cidata.iso, ignition.json) as
    made by its creation (generation 0: web-1-root.qcow2) or by its n-th rebuild (web-1.r2-root.qcow2). A machine
    name has no dot, so no other machine's volume has such a name."""
    return "%s-%s" % (machine, kind) if not generation else "%s.r%d-%s" % (machine, generation, kind)


def root_volume(spec):
    """The root disk volume of a machine's recorded spec (a rebuilt machine records its own)."""
    return spec.get("root_volume") or generation_volume(spec["name"], 0, "root.qcow2")


def volume_alias(name):
    """Device aliases allow letters, digits, '_' and '-': a volume name like data.qcow2 becomes data-qcow2."""
    return "ua-vol-%s" % re.sub(r"[^A-Za-z0-9_-]", "-", name)


def nic_alias(name):
    return "ua-nic-%s" % name


def nic_element(nic):
    """The <interface> of a NIC entry of the record ({name, mac, network | bridge, model}); ``filter`` names the
    nwfilter of its security groups."""
    return elements.interface(nic["mac"], nic.get("model") or "virtio", network=nic.get("network"),
                              bridge=nic.get("bridge"), alias=nic_alias(nic["name"]), filterref=nic.get("filter"))


def build_domain(plan):
    """The skeleton of a new machine's domain from a plan (machine.MachineResource._create_locked): name,
    record, devices and the fixed conventions. The owned fields (cpu, memory, topology, firmware) are not
    written here: each is written by its declaration in options.py (options.write_created), the same writer that
    changes it later."""
    root = etree.Element("domain", type=plan["virt_type"])
    _sub(root, "name", plan["name"])
    metadata = _sub(root, "metadata")
    metadata.append(record_element(plan["record"]))
    # places for the owned fields, in libvirt's order; their writers fill them
    _sub(root, "memory", unit="KiB")
    _sub(root, "currentMemory", unit="KiB")
    _sub(root, "vcpu", placement="static")
    if plan.get("ignition_path"):
        sysinfo = _sub(root, "sysinfo", type="fwcfg")
        _sub(sysinfo, "entry", name=IGNITION_FWCFG, file=plan["ignition_path"])
    os_node = _sub(root, "os")
    _sub(os_node, "type", "hvm", arch="x86_64", machine="q35")
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if plan["virt_type"] == "kvm":
        _sub(root, "cpu", mode="host-passthrough", check="none", migratable="on")
    clock = _sub(root, "clock", offset="utc")
    _sub(clock, "timer", name="rtc", tickpolicy="catchup")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "restart")
    _sub(root, "on_crash", "destroy")
    devices = _sub(root, "devices")
    devices.append(elements.controller("pci", "pcie-root", index=0))
    for disk in plan["disks"]:
        devices.append(elements.disk(disk["path"], disk["format"], disk["device"], disk.get("bus", "virtio"),
                                     volume_alias(disk["name"]), shareable=bool(disk.get("shareable")),
                                     boot_order=1 if disk.get("boot") else None, serial=disk.get("serial"),
                                     iotune=disk.get("iotune"), secret=disk.get("secret")))
    if plan.get("seed_path"):
        # The NoCloud seed on a virtio-scsi cdrom: cloud kernels (Debian's cloud flavour has no AHCI driver) see
        # virtio-scsi where a SATA cdrom would be invisible to them.
        devices.append(elements.controller("scsi", "virtio-scsi"))
        devices.append(elements.disk(plan["seed_path"], "raw", "sda", "scsi", "ua-cidata", device="cdrom",
                                     readonly=True))
    for nic in plan["nics"]:
        devices.append(nic_element(nic))
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "log", file=plan["console_path"], append="off")
    _sub(serial, "target", port=0)
    console = _sub(devices, "console", type="pty")
    _sub(console, "target", type="serial", port=0)
    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "target", type="virtio", name=GUEST_AGENT)
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(devices, "memballoon", model="virtio")
    # the pvpanic device: a guest kernel that panics tells QEMU, and libvirt then applies on_crash (the run
    # strategy's: restart for always and on_failure, destroy for the others, so a panicked guest is off, not hung)
    _sub(devices, "panic", model="isa")
    devices.append(elements.controller("usb", "none"))
    # libvirt puts every PCIe device on a root port of its own (virtio disks and NICs, the virtio-serial, rng and
    # balloon devices, the seed's virtio-scsi controller); keep SPARE_ROOT_PORTS free for hot-plug.
    pcie_devices = len([disk for disk in plan["disks"] if disk.get("bus", "virtio") == "virtio"]) + \
        len(plan["nics"]) + 3 + (1 if plan.get("seed_path") else 0)
    for _port in range(pcie_devices + SPARE_ROOT_PORTS):
        devices.append(elements.controller("pci", "pcie-root-port"))
    return root


def tostring(tree):
    return etree.tostring(tree, encoding="unicode")


def parse(xml):
    return elements.parse(xml)


def defined_domains(conn):
    """(domain, its parsed persistent XML) of every domain of the host that is still defined when its XML is read:
    another run may undefine a machine between the listing and the read, and a run must not fail because of a
    machine that is not its own (it is simply no longer there)."""
    for dom in conn.listAllDomains(0):
        try:
            xml = dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
        except lv.libvirt.libvirtError as exc:
            if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
                continue
            raise
        yield dom, elements.parse(xml)
