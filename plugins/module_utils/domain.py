# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The libvirt domain of a machine: its XML, the record kept in its metadata, and the fields we own.

Every owned field is declared once in FIELDS: how it is read from a domain, written into it, and whether a
running guest can take the change. Edits are made in place on libvirt's own XML so its defaults survive.
"""

from __future__ import annotations

import hashlib
import json
import re

try:
    from lxml import etree
    HAS_LXML = True
except ImportError:  # reported by the module base with a pointer to the package
    etree = None
    HAS_LXML = False

from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity

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

def _kib(tree, tag):
    node = tree.find(tag)
    if node is None:
        return None
    scale = {"b": 1, "bytes": 1, "KiB": 1024, "k": 1024, "MiB": 2 ** 20, "M": 2 ** 20, "GiB": 2 ** 30,
             "G": 2 ** 30}.get(node.get("unit", "KiB"), 1024)
    return int(node.text) * scale


def _set_text(tree, tag, text, attrib=None):
    node = tree.find(tag)
    if node is None:
        node = etree.SubElement(tree, tag)
    node.text = text
    for key, value in (attrib or {}).items():
        node.set(key, value)


def _read_cpu(tree, _record):
    node = tree.find("vcpu")
    return int(node.get("current") or node.text) if node is not None else None


def _write_cpu(tree, record, value):
    record["spec"]["cpu"] = value
    node = tree.find("vcpu")
    if node is not None and "current" in node.attrib:
        del node.attrib["current"]
    _set_text(tree, "vcpu", str(value))


def _write_memory(tree, record, value):
    record["spec"]["memory"] = value
    kib = str(value // 1024)
    _set_text(tree, "memory", kib, {"unit": "KiB"})
    _set_text(tree, "currentMemory", kib, {"unit": "KiB"})


def _spec_reader(key):
    def read(_tree, record):
        return (record or {}).get("spec", {}).get(key)
    return read


def _spec_writer(key):
    def write(_tree, record, value):
        record["spec"][key] = value
    return write


class Field:
    """One owned field: ``read(tree, record)``, ``write(tree, record, value)``, ``show`` for diffs, and
    ``live``: how a running domain takes the change ('metadata' live, 'balloon' when shrinking, or None)."""

    def __init__(self, name, read, write, show=None, live=None):
        self.name = name
        self.read = read
        self.write = write
        self.show = show or (lambda value: value)
        self.live = live


FIELDS = (
    Field("cpu", _read_cpu, _write_cpu),
    Field("memory", lambda tree, _record: _kib(tree, "memory"), _write_memory,
          show=lambda value: None if value is None else format_quantity(value), live="balloon"),
    Field("machine_class", _spec_reader("machine_class"), _spec_writer("machine_class"), live="metadata"),
    Field("labels", _spec_reader("labels"), _spec_writer("labels"), live="metadata"),
    Field("boot_config", _spec_reader("boot_config"), _spec_writer("boot_config"), live="metadata"),
)
FIELD_BY_NAME = {field.name: field for field in FIELDS}

# Fixed at creation: changing them would mean a new machine.
IMMUTABLE = ("image_checksum", "firmware")


def owned_values(tree, record):
    return {field.name: field.read(tree, record) for field in FIELDS}


def changed_fields(tree, record, desired):
    """Names of owned fields whose desired value differs from the domain's (only the fields the user set)."""
    current = owned_values(tree, record)
    return [name for name in current if name in desired and desired[name] != current[name]]


def apply_fields(tree, record, desired, names):
    for name in names:
        FIELD_BY_NAME[name].write(tree, record, desired[name])
    write_record(tree, record)


def shown(values):
    return {name: FIELD_BY_NAME[name].show(value) if name in FIELD_BY_NAME else value
            for name, value in values.items()}


# --- building a new domain ------------------------------------------------------------------------------------

def _sub(parent, tag, text=None, **attrib):
    node = etree.SubElement(parent, tag, {k.rstrip("_"): str(v) for k, v in attrib.items() if v is not None})
    if text is not None:
        node.text = str(text)
    return node


def _disk(devices, path, fmt, target, bus, alias, device="disk", readonly=False):
    disk = _sub(devices, "disk", type="file", device=device)
    driver = _sub(disk, "driver", name="qemu", type=fmt)
    if device == "disk":
        driver.set("discard", "unmap")
    _sub(disk, "source", file=path)
    _sub(disk, "target", dev=target, bus=bus)
    if readonly:
        _sub(disk, "readonly")
    _sub(disk, "alias", name=alias)
    return disk


def volume_alias(name):
    """Device aliases allow letters, digits, '_' and '-': a volume name like data.qcow2 becomes data-qcow2."""
    return "ua-vol-%s" % re.sub(r"[^A-Za-z0-9_-]", "-", name)


def nic_alias(name):
    return "ua-nic-%s" % name


def build_domain(plan):
    """The XML of a new machine from a plan (see machine.MachinePlan.domain_inputs)."""
    root = etree.Element("domain", type=plan["virt_type"])
    _sub(root, "name", plan["name"])
    metadata = _sub(root, "metadata")
    metadata.append(record_element(plan["record"]))
    _sub(root, "memory", plan["memory"] // 1024, unit="KiB")
    _sub(root, "currentMemory", plan["memory"] // 1024, unit="KiB")
    _sub(root, "vcpu", plan["cpu"], placement="static")
    if plan.get("ignition_path"):
        sysinfo = _sub(root, "sysinfo", type="fwcfg")
        _sub(sysinfo, "entry", name=IGNITION_FWCFG, file=plan["ignition_path"])
    os_node = _sub(root, "os", firmware="efi" if plan["firmware"] == "uefi" else None)
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
    _sub(devices, "controller", type="pci", index=0, model="pcie-root")
    for disk in plan["disks"]:
        node = _disk(devices, disk["path"], disk["format"], disk["device"], disk.get("bus", "virtio"),
                     volume_alias(disk["name"]))
        if disk.get("boot"):
            _sub(node, "boot", order=1)
    if plan.get("seed_path"):
        _disk(devices, plan["seed_path"], "raw", "sda", "sata", "ua-cidata", device="cdrom", readonly=True)
    for nic in plan["nics"]:
        kind = "network" if nic.get("network") else "bridge"
        node = _sub(devices, "interface", type=kind)
        _sub(node, "mac", address=nic["mac"])
        _sub(node, "source", **{kind: nic[kind]})
        _sub(node, "model", type=nic.get("model") or "virtio")
        _sub(node, "alias", name=nic_alias(nic["name"]))
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
    _sub(devices, "controller", type="usb", model="none")
    # libvirt puts every PCIe device on a root port of its own; keep SPARE_ROOT_PORTS free for hot-plug.
    pcie_devices = len([disk for disk in plan["disks"] if disk.get("bus", "virtio") == "virtio"]) + \
        len(plan["nics"]) + 3
    for _port in range(pcie_devices + SPARE_ROOT_PORTS):
        _sub(devices, "controller", type="pci", model="pcie-root-port")
    return root


def tostring(tree):
    return etree.tostring(tree, encoding="unicode")


def parse(xml):
    return etree.fromstring(xml.encode() if isinstance(xml, str) else xml)


# --- reading devices back -------------------------------------------------------------------------------------

def _child_attr(node, child, attribute):
    found = node.find(child)
    return found.get(attribute) if found is not None else None


def disks(tree):
    """[{alias, device, bus, path, format, type}] of file-backed disks and cdroms."""
    return [{"alias": _child_attr(disk, "alias", "name"), "device": _child_attr(disk, "target", "dev"),
             "bus": _child_attr(disk, "target", "bus"), "path": _child_attr(disk, "source", "file"),
             "format": _child_attr(disk, "driver", "type"), "type": disk.get("device")}
            for disk in tree.findall("devices/disk")]


def interfaces(tree):
    """[{alias, mac, network, bridge, model, type}] of the NICs."""
    return [{"alias": _child_attr(nic, "alias", "name"), "mac": _child_attr(nic, "mac", "address"),
             "network": _child_attr(nic, "source", "network"), "bridge": _child_attr(nic, "source", "bridge"),
             "model": _child_attr(nic, "model", "type"), "type": nic.get("type")}
            for nic in tree.findall("devices/interface")]
