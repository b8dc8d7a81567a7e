# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the seeds' Machine specs ask of a machine beyond cpu and memory (issue 13), as pure functions.

- CPU topology: ``<cpu><topology sockets cores threads/>``, whose product is the vCPU count.
- Swap: one more ephemeral disk, ``<machine>-swap.qcow2``, with the serial ``machinery-swap`` so the guest finds
  it (``/dev/disk/by-id/virtio-machinery-swap``, ``/sys/block/vdX/serial``).
- Disk QoS: ``<iotune>`` of a volume's disk (total_iops_sec, total_bytes_sec); throughput is in MB/s (10^6).
- Static addresses: a DHCP host entry (``<host mac ip name>``) on the NIC's libvirt network.
- Encrypted volumes: LUKS volumes whose passphrase is a private libvirt secret on the pool.

options.py declares each option (type, range, XML mapping, live rule) with the functions here; the machine's
planner and apply use them. Nothing here talks to libvirt.
"""

from __future__ import annotations

import ipaddress
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import parse_quantity

try:
    from lxml import etree
except ImportError:  # reported by the module base
    etree = None

# Ranges of the vitistack Machine CRD.
TOPOLOGY_RANGES = (("sockets", 1, 16), ("cores", 1, 256), ("threads", 1, 8))
IOPS_RANGE = (100, 64000)
THROUGHPUT_RANGE = (125, 4000)  # MB/s
MEGABYTE = 10 ** 6
SWAP_VOLUME = "swap"
SWAP_SERIAL = "machinery-swap"
MIN_SWAP = 40 * 1024  # mkswap refuses less than ten 4 KiB pages
VOLUME_ALIAS_PREFIX = "ua-vol-"


def ranged(low, high):
    """A validator of a whole number within [low, high] that names its field."""
    def validate(value, field):
        return check.whole_number(value, field, minimum=low, maximum=high)
    validate.range = (low, high)
    return validate


iops = ranged(*IOPS_RANGE)
throughput = ranged(*THROUGHPUT_RANGE)


# --- topology ----------------------------------------------------------------------------------------------------

def topology(value, cpu, field="topology"):
    """{sockets, cores, threads} within the seed's ranges (a missing one is 1) whose product is ``cpu``; None
    stays None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping of sockets, cores and threads", field)
    unknown = sorted(set(value) - {key for key, _low, _high in TOPOLOGY_RANGES})
    if unknown:
        raise ValidationError("unknown key %s (sockets, cores, threads)" % unknown[0], field)
    result = {}
    for key, low, high in TOPOLOGY_RANGES:
        given = value.get(key)
        result[key] = 1 if given is None else check.whole_number(given, "%s.%s" % (field, key), low, high)
    product = result["sockets"] * result["cores"] * result["threads"]
    if product != cpu:
        raise ValidationError("sockets x cores x threads is %d x %d x %d = %d, which must equal cpu (%s)"
                              % (result["sockets"], result["cores"], result["threads"], product, cpu), field)
    return result


def read_topology(tree, _record=None):
    node = tree.find("cpu/topology")
    if node is None:
        return None
    return {key: int(node.get(key) or 1) for key, _low, _high in TOPOLOGY_RANGES}


def write_topology(tree, record, value):
    record["spec"]["topology"] = value
    cpu = tree.find("cpu")
    node = cpu.find("topology") if cpu is not None else None
    if value is None:
        if node is not None:
            cpu.remove(node)
        return
    if cpu is None:
        cpu = etree.SubElement(tree, "cpu")
    if node is None:
        node = etree.SubElement(cpu, "topology")
    for key, _low, _high in TOPOLOGY_RANGES:
        node.set(key, str(value[key]))
    if "dies" in node.attrib:  # libvirt's own default; a topology of ours has one die per socket
        node.set("dies", "1")


# --- swap --------------------------------------------------------------------------------------------------------

def swap_bytes(value, field="swap"):
    """A swap size as bytes (whole MiB), None for 0 or nothing."""
    if value is None or value == "" or value == 0 or value == "0":
        return None
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ValidationError("must be positive, got %r" % (value,), field)
    size = parse_quantity(value, field=field, minimum=0)
    if size == 0:
        return None
    if size < 2 ** 20:
        raise ValidationError("must be at least 1Mi (or 0 for no swap), got %r" % (value,), field)
    return -(-size // 2 ** 20) * 2 ** 20


def swap_volume(machine, size):
    """The volume entry of a machine's swap disk (its device is assigned with the other volumes')."""
    return {"name": SWAP_VOLUME, "source": "empty", "volume": "%s-swap.qcow2" % machine, "size": size,
            "bus": "virtio", "device": None, "ephemeral": True, "serial": SWAP_SERIAL, "swap": True}


# --- disk QoS ----------------------------------------------------------------------------------------------------

def qos_of(volume):
    """{iops, throughput} of a volume entry, or None when it has neither."""
    wanted = {"iops": volume.get("iops"), "throughput": volume.get("throughput")}
    return wanted if any(value is not None for value in wanted.values()) else None


def iotune_values(qos):
    """The libvirt iotune parameters of {iops, throughput} (0 is libvirt's 'no limit')."""
    return {"total_iops_sec": int((qos or {}).get("iops") or 0),
            "total_bytes_sec": int((qos or {}).get("throughput") or 0) * MEGABYTE}


def _volume_names(record):
    return {VOLUME_ALIAS_PREFIX + vol["name"]: vol["name"] for vol in (record or {}).get("spec", {}).get("volumes") or []}


def read_disk_qos(tree, record):
    """{volume name: {iops, throughput}} of the machine's volumes whose disk has an iotune of ours."""
    names = _volume_names(record)
    found = {}
    for disk in tree.findall("devices/disk"):
        alias = disk.find("alias")
        name = names.get(alias.get("name") if alias is not None else None)
        node = disk.find("iotune")
        if name is None or node is None:
            continue
        iops_text = node.findtext("total_iops_sec")
        bytes_text = node.findtext("total_bytes_sec")
        qos = {"iops": int(iops_text) or None if iops_text else None,
               "throughput": int(bytes_text) // MEGABYTE or None if bytes_text else None}
        if any(value is not None for value in qos.values()):
            found[name] = qos
    return found


def set_iotune(disk, qos):
    """Write {iops, throughput} into a <disk>'s <iotune> (other limits libvirt keeps there stay)."""
    node = disk.find("iotune")
    if node is None:
        if not qos:
            return
        node = etree.SubElement(disk, "iotune")
    for key, value in iotune_values(qos).items():
        child = node.find(key)
        if value:
            if child is None:
                child = etree.SubElement(node, key)
            child.text = str(value)
        elif child is not None:
            node.remove(child)
    if len(node) == 0:
        disk.remove(node)


def write_disk_qos(tree, record, value):
    names = _volume_names(record)
    for disk in tree.findall("devices/disk"):
        alias = disk.find("alias")
        name = names.get(alias.get("name") if alias is not None else None)
        if name is not None:
            set_iotune(disk, value.get(name))
    for vol in record["spec"].get("volumes") or []:
        qos = value.get(vol["name"]) or {}
        vol["iops"], vol["throughput"] = qos.get("iops"), qos.get("throughput")


def desired_disk_qos(volumes, requested=None, current=None):
    """The QoS a machine should have: its volumes' (at creation), or the current one with the volumes the user
    listed again laid over it (an existing machine: a volume left out keeps its limits)."""
    if current is None:
        return {vol["name"]: qos_of(vol) for vol in volumes if qos_of(vol)}
    wanted = dict(current)
    names = {vol["name"] for vol in volumes}
    for item in requested or []:
        if isinstance(item, dict) and item.get("name") in names and qos_of(item):
            merged = dict(wanted.get(item["name"]) or {"iops": None, "throughput": None})
            merged.update({key: value for key, value in qos_of(item).items() if value is not None})
            wanted[item["name"]] = merged
    return wanted


def changed_disks(before, after):
    """Names of the volumes whose QoS differs."""
    return sorted(name for name in set(before or {}) | set(after or {})
                  if (before or {}).get(name) != (after or {}).get(name))


# --- static addresses --------------------------------------------------------------------------------------------

def read_reservations(_tree, record):
    """{nic name: address} as the record says; observe_machine has replaced it by what the networks hold."""
    return {nic["name"]: nic["ip_address"] for nic in (record or {}).get("spec", {}).get("network_interfaces") or []
            if nic.get("ip_address")}


def write_reservations(_tree, record, value):
    for nic in record["spec"].get("network_interfaces") or []:
        nic["ip_address"] = value.get(nic["name"])


def desired_reservations(nics, requested=None, current=None):
    if current is None:
        return {nic["name"]: nic["ip_address"] for nic in nics if nic.get("ip_address")}
    wanted = dict(current)
    names = {nic["name"] for nic in nics}
    for item in requested or []:
        if isinstance(item, dict) and item.get("name") in names and item.get("ip_address"):
            wanted[item["name"]] = str(item["ip_address"])
    return wanted


def address(value, field):
    try:
        return ipaddress.IPv4Address(str(value).strip())
    except ValueError:
        raise ValidationError("%r is not an IPv4 address" % (value,), field) from None


ALLOCATION_OFFSET = 51  # OpenShift's libvirt provider hands out a network's addresses from its 51st host on
_CLAIMED = {}  # (pool, network) -> {address: MAC} chosen by this process, not yet on the network
_CLAIMS_GUARD = threading.Lock()


def is_address_range(value):
    """True when an ``ip_address`` is a network in CIDR form (an address to allocate from it)."""
    return isinstance(value, str) and "/" in value


def address_range(value, field):
    try:
        network = ipaddress.IPv4Network(str(value).strip(), strict=False)
    except ValueError:
        raise ValidationError("%r is neither an IPv4 address nor an IPv4 network in CIDR form" % (value,),
                              field) from None
    if network.num_addresses <= ALLOCATION_OFFSET + 1:
        raise ValidationError("%s has no host %d to allocate addresses from (the first %d hosts of a network are "
                              "left out, as OpenShift's libvirt provider leaves them)"
                              % (network, ALLOCATION_OFFSET, ALLOCATION_OFFSET), field)
    return network


def allocate_address(cidr, mac, network, net_info, leases, field, pool=""):
    """The address of a NIC from the network ``cidr``: the one its MAC already holds there (a DHCP host entry),
    else the first from host offset 51 upward that no other MAC holds (host entry, lease, or a claim of another
    machine of this run) and that the network's DHCP range contains, as OpenShift's libvirt provider allocates
    ``networkInterfaceAddress``. Claimed for ``mac`` in this process, so the machines a run creates in parallel
    get distinct addresses; the network's own refusal of a duplicate host entry guards across processes."""
    subnet = address_range(cidr, field)
    mac = mac.lower()
    for host in net_info.get("dhcp_hosts") or []:
        if (host.get("mac") or "").lower() == mac and host.get("ip") and \
                ipaddress.IPv4Address(host["ip"]) in subnet:
            return host["ip"]
    if not net_info.get("cidr") or not net_info.get("dhcp_start"):
        raise ValidationError("network %s has no DHCP range to reserve an address in" % network, field)
    start, end = ipaddress.IPv4Address(net_info["dhcp_start"]), ipaddress.IPv4Address(net_info["dhcp_end"])
    held = {host.get("ip") for host in net_info.get("dhcp_hosts") or [] if (host.get("mac") or "").lower() != mac}
    held |= {lease_ip for lease_mac, lease_ip, _expiry in leases or [] if (lease_mac or "").lower() != mac}
    with _CLAIMS_GUARD:
        claims = _CLAIMED.setdefault((pool, network), {})
        for taken, owner in claims.items():
            if owner != mac:
                held.add(taken)
            elif ipaddress.IPv4Address(taken) in subnet:
                return taken
        for offset in range(ALLOCATION_OFFSET, subnet.num_addresses - 1):
            candidate = subnet.network_address + offset
            if start <= candidate <= end and str(candidate) not in held:
                claims[str(candidate)] = mac
                return str(candidate)
    raise ConflictError("no free address in %s on network %s from host %d within its DHCP range %s-%s"
                        % (subnet, network, ALLOCATION_OFFSET, start, end), field)


def check_reservation(ip, mac, network, net_info, leases, field, owner_of=None):
    """Refuse an address outside the network's DHCP range, or one another MAC holds (a host entry or a lease).

    ``net_info`` is elements.read_network of the network, ``leases`` [(mac, ip, expiry time or None)] its current
    leases, ``owner_of(mac)`` names the machine of a MAC (for the message)."""
    ip = address(ip, field)
    if not net_info.get("cidr") or not net_info.get("dhcp_start"):
        raise ValidationError("network %s has no DHCP range to reserve an address in" % network, field)
    subnet = ipaddress.IPv4Network(net_info["cidr"])
    start, end = ipaddress.IPv4Address(net_info["dhcp_start"]), ipaddress.IPv4Address(net_info["dhcp_end"])
    if ip not in subnet or not start <= ip <= end:
        raise ValidationError("%s is outside the DHCP range %s-%s of network %s (%s)"
                              % (ip, start, end, network, subnet), field)
    for host in net_info.get("dhcp_hosts") or []:
        if host.get("ip") == str(ip) and (host.get("mac") or "").lower() != mac:
            holder = (owner_of and owner_of(host.get("mac"))) or host.get("name") or host.get("mac")
            raise ConflictError("%s is reserved on network %s for %s (MAC %s)" % (ip, network, holder, host.get("mac")),
                                field)
    for lease_mac, lease_ip, expiry in leases or []:
        if lease_ip == str(ip) and (lease_mac or "").lower() != mac:
            # dnsmasq hands no configured address to a MAC while another MAC's lease holds it, and a lease
            # outlives its guest: say until when, for the user who deleted that guest a moment ago
            until = " until %s" % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry)) if expiry else ""
            raise ConflictError("%s is leased on network %s to MAC %s%s; a lease outlives its guest, and the "
                                "network's DHCP server gives no other MAC the address before the lease ends"
                                % (ip, network, lease_mac, until), field)
    return str(ip)


def host_entry(mac, ip, name=None):
    """The <host> of a DHCP reservation, for virNetworkUpdate."""
    node = etree.Element("host", mac=mac, ip=ip)
    if name:
        node.set("name", name)
    return etree.tostring(node, encoding="unicode")


# --- encrypted volumes -------------------------------------------------------------------------------------------

def passphrase(value, field):
    if value is None or not str(value):
        raise ValidationError("must not be empty for an encrypted volume", field)
    return str(value)


def secret_xml(path, machine):
    """A private, persistent libvirt secret used by the LUKS volume at ``path``."""
    node = etree.Element("secret", ephemeral="no", private="yes")
    etree.SubElement(node, "description").text = "LUKS passphrase of a volume of machine %s" % machine
    usage = etree.SubElement(node, "usage", type="volume")
    etree.SubElement(usage, "volume").text = path
    return etree.tostring(node, encoding="unicode")


def encryption_element(secret_uuid):
    node = etree.Element("encryption", format="luks")
    etree.SubElement(node, "secret", type="passphrase", uuid=secret_uuid)
    return node
