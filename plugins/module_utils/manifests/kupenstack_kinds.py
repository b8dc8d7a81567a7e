# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KupenStack's kinds besides VirtualMachine (Kupenstack/kupenstack apis/v1alpha1 and design-doc): what each
becomes on the pools.

- ``Flavor``: a machine class (``vcpu``, ``ram`` in MB); ``disk`` (GB) sizes the root disk of the machines using
  it, ``swap`` (MB) their swap, ``ephemeral`` (GB) an ephemeral empty disk, as OpenStack's flavors do.
- ``Image``: an image published on every pool (machinery.compute.machine_image), fetched from ``src``.
- ``KeyPair``: the ``publicKey`` of the machines naming it.
- ``Network`` (implemented) and ``VirtualNetwork`` (design): a libvirt network of that name on every pool, with
  its CIDR, gateway, DHCP range (an allocation pool) or none, and MTU.
- ``Volume`` (design): a volume of a pool's storage (machinery.compute.volume), empty or from an image.
"""

from __future__ import annotations

import hashlib
import ipaddress

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import APPLIED, table, warned
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import kube_quantity

MIB = 2 ** 20
GIB = 2 ** 30
# KupenStack's own default subnet of a Network that gives none (controllers/network/init.go)
NETWORK_CIDR = "10.10.0.0/16"
IMAGE_FORMATS = ("raw", "qcow2", "iso")
NOT_KEPT = warned("a count KupenStack keeps for OpenStack; libvirt has no such field: not applied")
FIELDS = {
    "Flavor": table({
        "spec.vcpu": APPLIED, "spec.ram": APPLIED, "spec.disk": APPLIED, "spec.swap": APPLIED,
        "spec.ephemeral": APPLIED,
        "spec.rxtx": warned("OpenStack's RX/TX factor scales a network's bandwidth cap; libvirt networks of the "
                            "pools carry no cap to scale: not applied")}),
    "Image": table({
        "spec.src": APPLIED, "spec.minDisk": APPLIED, "spec.minRam": APPLIED, "spec.containerFormat": APPLIED,
        "spec.format": warned("the disk format is read from the image itself (qcow2 or raw) when it is cached on "
                              "the pool, so a wrong one (the upstream sample's cirros .img says raw and is "
                              "qcow2) changes nothing: not applied")}),
    "KeyPair": table({"spec.publicKey": APPLIED}),
    "Network": table({"spec.cidr": APPLIED}),
    "VirtualNetwork": table({
        "spec.cidr": APPLIED, "spec.allocationPools[].startIP": APPLIED, "spec.allocationPools[].endIP": APPLIED,
        "spec.gatewayIP": APPLIED, "spec.disableDhcp": APPLIED, "spec.mtu": APPLIED}),
    "Volume": table({"spec.size": APPLIED, "spec.source.image": APPLIED}),
}
TABLES = {"Flavor": ("NAME", "VCPU", "RAM", "DISK", "IN-USE", "AGE"),
          "Image": ("NAME", "IN-USE", "READY", "AGE"),
          "KeyPair": ("NAME", "IN-USE", "AGE", "PRIVATE-KEY"),
          "Network": ("NAME", "CIDR", "IN-USE", "AGE"),
          "VirtualNetwork": ("NAME", "CIDR", "GATEWAY", "GATEWAY-IP", "AGE"),
          "Volume": ("NAME", "SIZE", "READY", "IN-USE", "AGE")}


def _spec(obj, fields, known):
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec") or {}
    fields.known(spec, known, "spec")
    return spec


def read_flavor(obj, fields):
    spec = _spec(obj, fields, ("vcpu", "ram", "disk", "swap", "rxtx", "ephemeral"))
    # optional in the CRD, but OpenStack refuses a flavor without them, and so does a machine class
    cpu = fields.integer(spec.get("vcpu"), "spec.vcpu", 1, check.MAX_CPU, required=True)
    ram = fields.integer(spec.get("ram"), "spec.ram", 16, required=True)
    disk = fields.integer(spec.get("disk"), "spec.disk", 0, 65536)
    swap = fields.integer(spec.get("swap"), "spec.swap", 0)
    ephemeral = fields.integer(spec.get("ephemeral"), "spec.ephemeral", 0, 65536)
    if spec.get("rxtx") is not None and not isinstance(spec["rxtx"], (int, float, str)):
        fields.error("spec.rxtx", "must be a quantity such as 1.0")
    obj.role = "class"
    obj.data = {"name": obj.name, "cpu": cpu, "memory": ram * MIB if ram else None}
    obj.refs = {"disk": disk or 0, "swap": swap or 0, "ephemeral": ephemeral or 0}


def read_image(obj, fields):
    spec = _spec(obj, fields, ("src", "format", "containerFormat", "minDisk", "minRam"))
    src = fields.string(spec.get("src"), "spec.src", required=True)
    if src and not src.startswith(("http://", "https://")):
        fields.error("spec.src", "%r is not an http(s) URL" % src)
    kind = fields.string(spec.get("format"), "spec.format")
    if kind and kind not in IMAGE_FORMATS:
        fields.error("spec.format", "%r images do not boot on libvirt pools here; give a raw, qcow2 or iso image"
                     % kind)
    container = fields.string(spec.get("containerFormat"), "spec.containerFormat")
    if container and container != "bare":
        fields.error("spec.containerFormat", "%r is an archive of images; libvirt pools take a bare image" % container)
    obj.role = "image"
    obj.data = {"name": fields.name(obj.name, "metadata.name"), "url": src,
                "min_disk": fields.integer(spec.get("minDisk"), "spec.minDisk", 0) or 0,
                "min_ram": fields.integer(spec.get("minRam"), "spec.minRam", 0) or 0}


def read_keypair(obj, fields, ssh_public_key):
    spec = _spec(obj, fields, ("publicKey",))
    key = fields.string(spec.get("publicKey"), "spec.publicKey")
    if key is None and spec.get("publicKey") is None:
        fields.error("spec.publicKey", "required here: KupenStack generates a key pair when it is left out and keeps "
                     "the private key in a Kubernetes Secret; libvirt pools keep no secrets to hand it back, so give "
                     "the public key of a pair you hold")
    elif key:
        key = fields.run(ssh_public_key, key, "spec.publicKey")
    obj.role = "keypair"
    obj.data = {"public_key": key}


def _subnet(fields, value, path, default):
    if value is None:
        return default
    text = fields.string(value, path)
    if text is None:
        return None
    try:
        net = ipaddress.ip_network(text, strict=False)  # the upstream sample writes 10.10.10.1/24
    except ValueError:
        fields.error(path, "%r is not a CIDR block such as 10.10.10.0/24" % text)
        return None
    if net.version != 4 or net.num_addresses < 16:
        fields.error(path, "%s: libvirt networks here are IPv4 subnets of at least 16 addresses" % net)
        return None
    return str(net)


def _address(fields, value, path, cidr):
    """An address of ``cidr``; a ``*`` octet is the subnet's (KupenStack's allocation pools: 10.*.*.56)."""
    text = fields.string(value, path)
    if text is None or cidr is None:
        return None
    net = ipaddress.ip_network(cidr)
    if "*" in text:
        octets = text.split(".")
        base = str(net.network_address).split(".")
        text = ".".join(base[index] if part == "*" else part for index, part in enumerate(octets)) \
            if len(octets) == 4 else text
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        fields.error(path, "%r is not an IPv4 address" % value)
        return None
    if address not in net or address in (net.network_address, net.broadcast_address):
        fields.error(path, "%s is not a host address of %s" % (address, cidr))
        return None
    return str(address)


def default_subnet(name):
    """A VirtualNetwork without a CIDR gets a 10.x.y.0/24 (KupenStack picks one at random); here it is derived
    from the name, so every pool and every apply gives the network the same one."""
    digest = hashlib.sha256(name.encode()).digest()
    return "10.%d.%d.0/24" % (digest[0], digest[1])


def read_network(obj, fields):
    if obj.kind == "Network":
        spec = _spec(obj, fields, ("cidr",))
        cidr = _subnet(fields, spec.get("cidr"), "spec.cidr", NETWORK_CIDR)
        obj.data = {"name": obj.name, "cidr": cidr, "dhcp": True}
    else:
        spec = _spec(obj, fields, ("cidr", "allocationPools", "gatewayIP", "disableDhcp", "mtu"))
        cidr = _subnet(fields, spec.get("cidr"), "spec.cidr", default_subnet(obj.name))
        dhcp = not fields.boolean(spec.get("disableDhcp"), "spec.disableDhcp")
        obj.data = {"name": obj.name, "cidr": cidr, "dhcp": dhcp}
        if spec.get("gatewayIP") is not None:
            obj.data["gateway"] = _address(fields, spec["gatewayIP"], "spec.gatewayIP", cidr)
        pools = fields.items(spec.get("allocationPools"), "spec.allocationPools")
        if len(pools) > 1:
            fields.error("spec.allocationPools[1]", "a libvirt network hands out one DHCP range: give one allocation "
                         "pool")
        for index, item in pools[:1]:
            where = "spec.allocationPools[%d]" % index
            fields.known(item, ("startIP", "endIP"), where)
            start = _address(fields, item.get("startIP"), where + ".startIP", cidr) \
                if item.get("startIP") is not None else None
            end = _address(fields, item.get("endIP"), where + ".endIP", cidr) \
                if item.get("endIP") is not None else None
            if cidr:
                hosts = ipaddress.ip_network(cidr)
                start = start or str(hosts.network_address + 10)
                end = end or str(hosts.broadcast_address - 1)
                if ipaddress.ip_address(start) > ipaddress.ip_address(end):
                    fields.error(where, "startIP %s is after endIP %s" % (start, end))
                obj.data.update(dhcp_start=start, dhcp_end=end)
        if spec.get("mtu") is not None:
            obj.data["mtu"] = fields.integer(spec.get("mtu"), "spec.mtu", 576, 65535)
    obj.role = "network"
    fields.name(obj.name, "metadata.name")


def read_volume(obj, fields):
    spec = _spec(obj, fields, ("size", "source"))
    size = kube_quantity(fields, spec.get("size"), "spec.size") if spec.get("size") is not None \
        else fields.error("spec.size", "required value")
    source = fields.mapping(spec.get("source"), "spec.source") or {}
    fields.known(source, ("image",), "spec.source")
    image = fields.string(source.get("image"), "spec.source.image")
    obj.role = "volume"
    obj.data = {"size": size, "size_path": "spec.size"}
    if image:
        obj.data.update(image=image, image_path="spec.source.image")


def status(obj, observed):
    """Each kind's status as KupenStack's CRDs have it (usage.inUse, ready, id)."""
    users = observed.get("users") or []
    usage = {"inUse": users}
    if obj.kind == "Image":
        return {"usage": usage, "ready": bool(observed.get("pools")), "id": obj.name}
    if obj.kind == "VirtualNetwork":
        return {"ready": bool(observed.get("pools")), "gatewayName": "none", "id": obj.name}
    if obj.kind == "Volume":
        volume = observed.get("volume") or {}
        return {"id": volume.get("name"), "ready": volume.get("state") not in (None, "Absent"),
                "inUse": bool(volume.get("users")), "virtualMachines": list(volume.get("users") or [])}
    return {"usage": usage, "id": obj.name}


def row(obj, shown, observed):
    in_use = ",".join((shown.get("usage") or {}).get("inUse") or []) or "<none>"
    if obj.kind == "Flavor":
        return (obj.name, obj.data.get("cpu"), "%dMi" % (obj.data["memory"] // MIB) if obj.data.get("memory")
                else "-", "%dGi" % obj.refs.get("disk", 0), in_use, "-")
    if obj.kind == "Image":
        return (obj.name, in_use, str(shown.get("ready")).lower(), "-")
    if obj.kind == "KeyPair":
        return (obj.name, in_use, "-", "<none>")
    if obj.kind == "Network":
        return (obj.name, obj.data.get("cidr"), in_use, "-")
    if obj.kind == "VirtualNetwork":
        return (obj.name, obj.data.get("cidr"), shown.get("gatewayName"), obj.data.get("gateway") or "-", "-")
    from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
    return (obj.name, format_quantity(obj.data["size"]) if obj.data.get("size") else "-",
            str(shown.get("ready")).lower(), str(shown.get("inUse")).lower(), "-")
