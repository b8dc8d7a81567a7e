# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One builder and one reader per libvirt XML element kind: disk, interface, controller, storage pool, volume,
network, and the KVM probe domain.

Builders return lxml elements and readers return plain dicts, so creation and hot-plug share one spelling of
each element, and names or paths holding quotes, '<', '&' or any letter are escaped by lxml, never by hand.
"""

from __future__ import annotations

import ipaddress

try:
    from lxml import etree
    HAS_LXML = True
except ImportError:  # reported by the module base with a pointer to the package
    etree = None
    HAS_LXML = False

# Sizes in libvirt XML carry a unit attribute; KB, MB ... are powers of 1000, k, KiB ... powers of 1024.
UNITS = {"b": 1, "bytes": 1,
         "KB": 10 ** 3, "k": 2 ** 10, "K": 2 ** 10, "KiB": 2 ** 10,
         "MB": 10 ** 6, "M": 2 ** 20, "MiB": 2 ** 20,
         "GB": 10 ** 9, "G": 2 ** 30, "GiB": 2 ** 30,
         "TB": 10 ** 12, "T": 2 ** 40, "TiB": 2 ** 40,
         "PB": 10 ** 15, "P": 2 ** 50, "PiB": 2 ** 50,
         "EB": 10 ** 18, "E": 2 ** 60, "EiB": 2 ** 60}
NETWORK_MODES = ("nat", "isolated")
PROBE_CMDLINE = "console=ttyS0 panic=-1"


def to_string(element):
    """The element as a unicode string, ready for any libvirt call that takes XML."""
    return etree.tostring(element, encoding="unicode")


def parse(xml):
    """The root element of ``xml`` (str or bytes). Entities are not expanded and nothing is fetched."""
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    return etree.fromstring(xml.encode("utf-8") if isinstance(xml, str) else xml, parser)


def _element(tag, text=None, **attrib):
    node = etree.Element(tag, {key: str(value) for key, value in attrib.items() if value is not None})
    if text is not None:
        node.text = str(text)
    return node


def _sub(parent, tag, text=None, **attrib):
    node = _element(tag, text, **attrib)
    parent.append(node)
    return node


def _attr(node, path, attribute):
    found = node.find(path)
    return found.get(attribute) if found is not None else None


def size_of(node, default_unit="bytes"):
    """The public name of ``_bytes``: the size an element holds, by the one table of units (UNITS)."""
    return _bytes(node, default_unit)


def _bytes(node, default_unit="bytes"):
    """The size held by ``node`` in bytes, honouring its unit attribute; None when the node is missing."""
    if node is None or node.text is None or not node.text.strip():
        return None
    unit = node.get("unit", default_unit)
    if unit not in UNITS:
        raise ValueError("unknown size unit %r in <%s>" % (unit, node.tag))
    return int(node.text) * UNITS[unit]


# --- disk -----------------------------------------------------------------------------------------------------

def disk(path, fmt, target, bus="virtio", alias=None, device="disk", readonly=False, shareable=False,
         boot_order=None, serial=None, iotune=None, secret=None):
    """A file-backed disk or cdrom. Disks unmap discarded blocks; a shareable one is opened without host cache
    instead, so two guests see each other's writes. ``serial`` is what the guest reads as the disk's serial,
    ``iotune`` {total_iops_sec, total_bytes_sec} its limits (0 for none), ``secret`` the uuid of the LUKS
    passphrase secret of an encrypted volume."""
    node = _element("disk", type="file", device=device)
    driver = _sub(node, "driver", name="qemu", type=fmt)
    if shareable:
        driver.set("cache", "none")
    elif device == "disk":
        driver.set("discard", "unmap")
    source = _sub(node, "source", file=path)
    if secret is not None:
        encryption = _sub(source, "encryption", format="luks")
        _sub(encryption, "secret", type="passphrase", uuid=secret)
    _sub(node, "target", dev=target, bus=bus)
    limits = {key: value for key, value in (iotune or {}).items() if value}
    if limits:
        tune = _sub(node, "iotune")
        for key in ("total_bytes_sec", "total_iops_sec"):
            if key in limits:
                _sub(tune, key, int(limits[key]))
    if serial is not None:
        _sub(node, "serial", serial)
    if readonly:
        _sub(node, "readonly")
    if shareable:
        _sub(node, "shareable")
    if boot_order is not None:
        _sub(node, "boot", order=int(boot_order))
    if alias is not None:
        _sub(node, "alias", name=alias)
    return node


def read_disk(node):
    """{alias, device, bus, path, format, type, readonly, shareable, boot_order} of one <disk>."""
    boot = _attr(node, "boot", "order")
    tune = node.find("iotune")
    secret = _attr(node, "source/encryption/secret", "uuid") or _attr(node, "encryption/secret", "uuid")
    return {"alias": _attr(node, "alias", "name"), "device": _attr(node, "target", "dev"),
            "bus": _attr(node, "target", "bus"), "path": _attr(node, "source", "file"),
            "format": _attr(node, "driver", "type"), "type": node.get("device"),
            "readonly": node.find("readonly") is not None, "shareable": node.find("shareable") is not None,
            "boot_order": int(boot) if boot is not None else None, "serial": node.findtext("serial"),
            "iotune": {child.tag: int(child.text) for child in tune if child.text} if tune is not None else {},
            "secret": secret}


def read_disks(tree):
    """The disks and cdroms of a domain, in document order."""
    return [read_disk(node) for node in tree.findall("devices/disk")]


def disk_files(tree):
    """{alias: source file} of a domain's disks and cdroms: what a status needs of them (read_disks reads all)."""
    files = {}
    for node in tree.iterfind("devices/disk"):
        alias = node.find("alias")
        if alias is not None:
            source = node.find("source")
            files[alias.get("name")] = source.get("file") if source is not None else None
    return files


# --- interface ------------------------------------------------------------------------------------------------

def interface(mac, model="virtio", network=None, bridge=None, alias=None, filterref=None):
    """A NIC on a libvirt network or on a host bridge: exactly one of the two; ``filterref`` names the nwfilter
    that guards it."""
    if bool(network) == bool(bridge):
        raise ValueError("an interface needs exactly one of network or bridge")
    kind = "network" if network else "bridge"
    node = _element("interface", type=kind)
    _sub(node, "mac", address=mac)
    _sub(node, "source", **{kind: network or bridge})
    _sub(node, "model", type=model)
    if filterref is not None:
        _sub(node, "filterref", filter=filterref)
    if alias is not None:
        _sub(node, "alias", name=alias)
    return node


def read_interface(node):
    """{alias, mac, network, bridge, model, type, filterref} of one <interface>."""
    return {"alias": _attr(node, "alias", "name"), "mac": _attr(node, "mac", "address"),
            "network": _attr(node, "source", "network"), "bridge": _attr(node, "source", "bridge"),
            "model": _attr(node, "model", "type"), "type": node.get("type"),
            "filterref": _attr(node, "filterref", "filter")}


def set_filterref(node, name):
    """Point an <interface> at the nwfilter ``name``, or (None) at none, in place."""
    old = node.find("filterref")
    if old is not None:
        node.remove(old)
    if name is not None:
        ref = _element("filterref", filter=name)
        model = node.find("model")
        if model is not None:
            model.addnext(ref)
        else:
            node.append(ref)
    return node


# --- nwfilter -------------------------------------------------------------------------------------------------

def nwfilter(name, rules=(), filterrefs=(), uuid=None):
    """A network filter: ``rules`` [{action, direction, priority, protocol, match {attribute: value}}] and the
    names of the filters it includes. ``uuid`` keeps the identity of a filter that is being redefined."""
    node = _element("filter", name=name, chain="root")
    if uuid:
        _sub(node, "uuid", uuid)
    for ref in filterrefs:
        _sub(node, "filterref", filter=ref)
    for rule in rules:
        entry = _sub(node, "rule", action=rule["action"], direction=rule["direction"],
                     priority=rule.get("priority"), statematch=rule.get("statematch"))
        _sub(entry, rule["protocol"], **rule.get("match") or {})
    return node


def read_nwfilter(tree):
    """{name, uuid, rules, filterrefs} of a network filter, in the shape nwfilter() takes."""
    rules = []
    for entry in tree.findall("rule"):
        protocol = entry[0] if len(entry) else None
        priority = entry.get("priority")
        rules.append({"action": entry.get("action"), "direction": entry.get("direction"),
                      "priority": int(priority) if priority is not None else None,
                      "statematch": entry.get("statematch"),
                      "protocol": protocol.tag if protocol is not None else None,
                      "match": dict(protocol.attrib) if protocol is not None else {}})
    return {"name": tree.get("name"), "uuid": tree.findtext("uuid"), "rules": rules,
            "filterrefs": [ref.get("filter") for ref in tree.findall("filterref")]}


def read_interfaces(tree):
    """The NICs of a domain, in document order."""
    return [read_interface(node) for node in tree.findall("devices/interface")]


def interface_macs(tree):
    """The MAC addresses of a domain's NICs."""
    return {node.get("address") for node in tree.iterfind("devices/interface/mac")}


# --- controller -----------------------------------------------------------------------------------------------

def controller(kind, model=None, index=None):
    """A controller such as pci/pcie-root, pci/pcie-root-port, usb/none or scsi/virtio-scsi."""
    return _element("controller", type=kind, index=index, model=model)


# --- storage pool ---------------------------------------------------------------------------------------------

def storage_pool(name, path, mode="0711"):
    """A directory storage pool."""
    node = _element("pool", type="dir")
    _sub(node, "name", name)
    target = _sub(node, "target")
    _sub(target, "path", path)
    permissions = _sub(target, "permissions")
    _sub(permissions, "mode", mode)
    return node


def read_storage_pool(tree):
    """{name, type, path, mode} of a storage pool."""
    return {"name": tree.findtext("name"), "type": tree.get("type"), "path": tree.findtext("target/path"),
            "mode": tree.findtext("target/permissions/mode")}


# --- volume ---------------------------------------------------------------------------------------------------

def volume(name, capacity, fmt="raw", mode=None, backing=None, allocation=0, secret=None):
    """A storage volume; ``backing`` is (path, format) for a thin overlay on that file; ``secret`` the uuid of
    the passphrase secret of a LUKS volume (raw format only)."""
    node = _element("volume")
    _sub(node, "name", name)
    _sub(node, "capacity", int(capacity), unit="bytes")
    _sub(node, "allocation", int(allocation), unit="bytes")
    target = _sub(node, "target")
    _sub(target, "format", type=fmt)
    if mode is not None:
        permissions = _sub(target, "permissions")
        _sub(permissions, "mode", mode)
    if secret is not None:
        encryption = _sub(target, "encryption", format="luks")
        _sub(encryption, "secret", type="passphrase", uuid=secret)
    if backing:
        backing_path, backing_format = backing
        store = _sub(node, "backingStore")
        _sub(store, "path", backing_path)
        _sub(store, "format", type=backing_format)
    return node


def read_volume(tree):
    """{name, capacity, allocation, format, path, mode, backing, mtime}: sizes in bytes, ``backing`` the path of
    the backing file, ``mtime`` seconds since the epoch (both None when absent)."""
    mtime = tree.findtext("target/timestamps/mtime")
    return {"name": tree.findtext("name"), "capacity": _bytes(tree.find("capacity")),
            "allocation": _bytes(tree.find("allocation")), "format": _attr(tree, "target/format", "type"),
            "path": tree.findtext("target/path"), "mode": tree.findtext("target/permissions/mode"),
            "backing": tree.findtext("backingStore/path"),
            "mtime": float(mtime) if mtime and mtime.strip() else None}


# --- network --------------------------------------------------------------------------------------------------

def network(name, cidr, mode="nat", dhcp_hosts=(), gateway=None, dhcp_range=None, dhcp=True, mtu=None):
    """An IPv4 network: the first host is the gateway, DHCP hands out the 10th host to the last one (from the
    second-last on nets too small for that), and ``dhcp_hosts`` [{mac, ip, name?}] get fixed addresses.
    ``gateway`` (the host's address on it), ``dhcp_range`` (start, end), ``dhcp`` False (no DHCP server) and
    ``mtu`` override those defaults (KupenStack's networks give them)."""
    if mode not in NETWORK_MODES:
        raise ValueError("network mode must be one of %s, got %r" % (", ".join(NETWORK_MODES), mode))
    net = ipaddress.IPv4Network(cidr)
    hosts = list(net.hosts())
    first, last = hosts[min(9, len(hosts) - 2)], hosts[-1]
    gateway = gateway or hosts[0]
    if dhcp_range:
        first, last = dhcp_range
    node = _element("network")
    _sub(node, "name", name)
    if mode == "nat":
        _sub(node, "forward", mode="nat")
    if mtu:
        _sub(node, "mtu", size=int(mtu))
    ip = _sub(node, "ip", address=gateway, netmask=net.netmask)
    if dhcp:
        dhcp_node = _sub(ip, "dhcp")
        _sub(dhcp_node, "range", start=first, end=last)
        for host in dhcp_hosts:
            _sub(dhcp_node, "host", mac=host["mac"], ip=host["ip"], name=host.get("name"))
    return node


def _ipv4(tree):
    return next((ip for ip in tree.findall("ip") if ip.get("family") in (None, "ipv4")), None)


def read_network(tree):
    """{name, mode, cidr, gateway, dhcp_start, dhcp_end, dhcp_hosts [{mac, ip, name}], bridge} of a network.

    ``mode`` is 'isolated' without a <forward>, else its mode ('nat' when it names none, as libvirt reads it)."""
    forward = tree.find("forward")
    ip = _ipv4(tree)
    cidr = gateway = start = end = None
    hosts = []
    if ip is not None:
        gateway = ip.get("address")
        mask = ip.get("netmask") or ip.get("prefix")
        if gateway and mask:
            cidr = str(ipaddress.IPv4Interface("%s/%s" % (gateway, mask)).network)
        start = _attr(ip, "dhcp/range", "start")
        end = _attr(ip, "dhcp/range", "end")
        hosts = [{"mac": host.get("mac"), "ip": host.get("ip"), "name": host.get("name")}
                 for host in ip.findall("dhcp/host")]
    return {"name": tree.findtext("name"),
            "mode": "isolated" if forward is None else forward.get("mode", "nat"),
            "cidr": cidr, "gateway": gateway, "dhcp_start": start, "dhcp_end": end, "dhcp_hosts": hosts,
            "bridge": _attr(tree, "bridge", "name")}


# --- backup ---------------------------------------------------------------------------------------------------

def domain_backup(targets, skipped=()):
    """A push-mode backup job: ``targets`` {disk target: file} are copied whole into new qcow2 files; the disks
    named in ``skipped`` (cdroms, shared disks) are left out."""
    node = _element("domainbackup", mode="push")
    disks = _sub(node, "disks")
    for device, path in sorted(targets.items()):
        disk_node = _sub(disks, "disk", name=device, backup="yes", type="file")
        _sub(disk_node, "target", file=path)
        _sub(disk_node, "driver", type="qcow2")
    for device in skipped:
        _sub(disks, "disk", name=device, backup="no")
    return node


# --- snapshot -------------------------------------------------------------------------------------------------

def domain_snapshot(name, description, internal, skipped=(), memory=False):
    """An internal snapshot: the disks named in ``internal`` get a snapshot inside their qcow2 file, those in
    ``skipped`` (cdroms) none; with ``memory`` the running guest's memory and device state are saved too."""
    node = _element("domainsnapshot")
    _sub(node, "name", name)
    _sub(node, "description", description)
    if memory:
        _sub(node, "memory", snapshot="internal")
    disks = _sub(node, "disks")
    for device in internal:
        _sub(disks, "disk", name=device, snapshot="internal")
    for device in skipped:
        _sub(disks, "disk", name=device, snapshot="no")
    return node


def read_snapshot(node):
    """{name, description, state, created (epoch seconds), memory, disks} of one <domainsnapshot>; ``disks``
    are the devices with a snapshot of their own."""
    created = node.findtext("creationTime")
    return {"name": node.findtext("name"), "description": node.findtext("description") or "",
            "state": node.findtext("state"), "created": int(created) if created else None,
            "memory": _attr(node, "memory", "snapshot") not in (None, "no"),
            "disks": [disk.get("name") for disk in node.findall("disks/disk") if disk.get("snapshot") != "no"]}


# --- the KVM probe --------------------------------------------------------------------------------------------

def probe_domain(name, kernel, log_path, memory_mib=128):
    """A throwaway KVM guest that boots ``kernel`` directly and logs its serial console to ``log_path``: the
    kernel's banner there proves KVM really runs guests. It powers off for good on panic or reboot."""
    root = _element("domain", type="kvm")
    _sub(root, "name", name)
    _sub(root, "memory", int(memory_mib), unit="MiB")
    _sub(root, "vcpu", 1)
    os_node = _sub(root, "os")
    _sub(os_node, "type", "hvm", arch="x86_64", machine="q35")
    _sub(os_node, "kernel", kernel)
    _sub(os_node, "cmdline", PROBE_CMDLINE)
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(root, "on_reboot", "destroy")
    devices = _sub(root, "devices")
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=log_path)
    _sub(devices, "memballoon", model="none")
    return root
