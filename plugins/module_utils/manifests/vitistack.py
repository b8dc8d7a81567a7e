# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vitistack: vitistack.io/v1alpha1 Machine, with every validation range of its CRD.

``instanceType`` is a machine class, ``os`` a named image (``imageID`` names it, else the published image
whose os family, distribution, version and architecture match), ``providerConfig.name`` must be ``libvirt``
(``region`` and ``zone`` select pools by their ``topology.kubernetes.io/region`` and ``/zone`` labels), ``cpu``
the vCPU count and topology, the boot disk the root size, the other disks volumes, ``network.vpc`` the libvirt
network, ``tags`` the labels. Fields with no meaning on libvirt (assignPublicIP, publicIP, monitoring, the
provider's ``config`` and credentials) are warnings; ``backup`` is a warning pointing at machine_backup.

Fields that map onto machine options this version of ``machine`` may not have yet (cpu topology, per-NIC
ip_address and security_groups, per-volume iops, throughput, encrypted) are checked in full and translated to
those options; pending.py refuses them, naming the field, while ``machine`` lacks the option.
"""

from __future__ import annotations

import re

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import APPLIED, table, warned
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import columns, machine_object
from ansible_collections.machinery.compute.plugins.module_utils.manifests.pending import refuse_pending
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import parse_quantity

API = "vitistack.io/v1alpha1"
KINDS = {API: ("Machine",)}
PROVIDERS = ("aws", "azure", "gcp", "vsphere", "openstack", "libvirt", "proxmox")
OS_FAMILIES = ("linux", "windows")
ARCHITECTURES = ("amd64", "arm64", "x86_64")
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
MIN_MEMORY = 16 * 2 ** 20
GIB = 2 ** 30
SPEC = ("name", "instanceType", "os", "providerConfig", "cpu", "memory", "disks", "network", "sshKeys", "userData",
        "tags", "securityGroups", "monitoring", "backup")
CLASS_PATH = "spec.instanceType"
BACKUPS_IN_STATUS = True  # the engine reads each machine's list of backups for BackupReady
POOL_PATH = "spec.providerConfig.region"
NO_PUBLIC = warned("libvirt networks have no public addresses: not applied")
ONE_SUBNET = warned("a libvirt network is one subnet (spec.network.vpc): not applied")
FIELDS = {"Machine": table({
    "spec.name": APPLIED, "spec.instanceType": APPLIED, "spec.os.family": APPLIED, "spec.os.distribution": APPLIED,
    "spec.os.version": APPLIED, "spec.os.architecture": APPLIED, "spec.os.imageID": APPLIED,
    "spec.os.imageFamily": warned("marketplace image families have no meaning on libvirt pools; the image is "
                                  "chosen by imageID or by family, distribution and version"),
    "spec.providerConfig.name": APPLIED, "spec.providerConfig.region": APPLIED, "spec.providerConfig.zone": APPLIED,
    "spec.providerConfig.config.*": warned("has no meaning for the libvirt provider and is ignored"),
    "spec.providerConfig.credentialsRef": warned("the pools are reached by their libvirt URIs, with the run's "
                                                 "credentials: not applied"),
    "spec.cpu.cores": APPLIED, "spec.cpu.threadsPerCore": APPLIED, "spec.cpu.sockets": APPLIED,
    "spec.memory": APPLIED,
    "spec.disks[].name": APPLIED, "spec.disks[].sizeGB": APPLIED, "spec.disks[].boot": APPLIED,
    "spec.disks[].encrypted": APPLIED, "spec.disks[].iops": APPLIED, "spec.disks[].throughput": APPLIED,
    "spec.disks[].type": warned("disk types are provider-specific; libvirt volumes are qcow2"),
    "spec.network.vpc": APPLIED, "spec.network.privateIP": APPLIED, "spec.network.subnet": ONE_SUBNET,
    "spec.network.assignPublicIP": NO_PUBLIC, "spec.network.publicIP": NO_PUBLIC,
    "spec.network.interfaces[].name": APPLIED, "spec.network.interfaces[].primary": APPLIED,
    "spec.network.interfaces[].securityGroups": APPLIED, "spec.network.interfaces[].subnet": ONE_SUBNET,
    "spec.sshKeys": APPLIED, "spec.userData": APPLIED, "spec.tags.*": APPLIED, "spec.securityGroups": APPLIED,
    "spec.monitoring": warned("has no meaning on libvirt pools and is ignored"),
    "spec.backup": warned("backups run on a schedule outside the pools: see docs/manifests.md for the AWX/cron "
                          "recipe and machinery.compute.machine_backup for the retention")})}
OPTION_PATHS = {"machine_class": "spec.instanceType", "image": "spec.os", "cpu": "spec.cpu", "topology": "spec.cpu",
                "memory": "spec.memory", "root_size": "spec.disks", "volumes": "spec.disks",
                "network_interfaces": "spec.network", "ssh_authorized_keys": "spec.sshKeys",
                "cloud_init": "spec.userData", "labels": "spec.tags", "machine_pool_selector": "spec.providerConfig",
                "name": "metadata.name"}
_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")


def read(obj, fields):
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, SPEC, "spec")
    params = {"name": obj.name}
    name = fields.string(spec.get("name"), "spec.name", required=True)
    if name and name != obj.name:
        fields.error("spec.name", "must equal metadata.name (%s)" % obj.name)
    params["machine_class"] = instance_class(fields, spec.get("instanceType"))
    refs = {"class": params["machine_class"], "volumes": [], "os": _os(fields, spec.get("os"))}
    _provider(fields, spec.get("providerConfig"), params)
    cpu = fields.mapping(spec.get("cpu"), "spec.cpu")
    if cpu is not None:
        fields.known(cpu, ("cores", "threadsPerCore", "sockets"), "spec.cpu")
        cores = fields.integer(cpu.get("cores", 1), "spec.cpu.cores", 1, 256)
        threads = fields.integer(cpu.get("threadsPerCore", 1), "spec.cpu.threadsPerCore", 1, 8)
        sockets = fields.integer(cpu.get("sockets", 1), "spec.cpu.sockets", 1, 16)
        if None not in (cores, threads, sockets):
            total = cores * threads * sockets
            if total > check.MAX_CPU:
                fields.error("spec.cpu", "%d sockets x %d cores x %d threads is %d vCPUs; at most %d"
                             % (sockets, cores, threads, total, check.MAX_CPU))
            params["cpu"] = total
            if sockets > 1 or threads > 1:
                params["topology"] = {"sockets": sockets, "cores": cores, "threads": threads}
    if spec.get("memory") is not None:
        memory = fields.integer(spec.get("memory"), "spec.memory", minimum=0)
        if memory is not None and 0 < memory < MIN_MEMORY:
            fields.error("spec.memory", "%d bytes is less than a libvirt guest needs (16Mi)" % memory)
        elif memory:
            params["memory"] = memory
    _disks(fields, spec.get("disks"), params)
    _network(fields, spec.get("network"), spec.get("securityGroups"), params)
    keys = fields.strings(spec.get("sshKeys"), "spec.sshKeys")
    if keys:
        params["ssh_authorized_keys"] = keys
    if spec.get("userData") is not None:
        if fields.string(spec.get("userData"), "spec.userData"):
            params["cloud_init"] = {"user_data": spec["userData"]}
            if keys and not spec["userData"].lstrip().startswith("#cloud-config"):
                # a script and keys: cloud-init takes both as a MIME multipart (keys in a cloud-config part)
                params["cloud_init"] = {"user_data": multipart(keys, spec["userData"])}
                del params["ssh_authorized_keys"]
    tags = fields.mapping(spec.get("tags"), "spec.tags")
    labels = dict(obj.labels)
    if tags:
        labels.update(fields.run(check.labels, tags, "spec.tags") or {})
    params["labels"] = labels
    fields.boolean(spec.get("monitoring"), "spec.monitoring")
    _backup(fields, spec.get("backup"))
    refuse_pending(fields, params, {
        ("topology",): "spec.cpu (sockets or threadsPerCore above 1)",
        ("volumes", "iops"): "spec.disks[].iops", ("volumes", "throughput"): "spec.disks[].throughput",
        ("volumes", "encrypted"): "spec.disks[].encrypted",
        ("network_interfaces", "ip_address"): "spec.network.privateIP",
        ("network_interfaces", "security_groups"): "spec.securityGroups / spec.network.interfaces[].securityGroups"})
    obj.where.update(OPTION_PATHS)
    for index, volume in enumerate(params.get("volumes") or []):
        obj.where["volumes[%d]" % index] = volume.pop("at")
    for index, nic in enumerate(params.get("network_interfaces") or []):
        obj.where["network_interfaces[%d]" % index] = nic.pop("at")
    machine_object(obj, params, refs)


def instance_class(fields, value):
    """The machine class of an ``instanceType``. Cloud instance types (``t3.medium``, ``Standard_B2s``) are no
    DNS labels, which class names are; so the type maps onto one deterministically: lower case, every ``.`` and
    ``_`` a ``-`` (``t3.medium`` is the class ``t3-medium``). Anything else that is no DNS label is refused."""
    text = fields.string(value, "spec.instanceType", required=True)
    if text is None:
        return None
    mapped = re.sub(r"[._]", "-", text.lower())
    if fields.run(check.dns_label, mapped, "spec.instanceType") is None:
        return None
    return mapped


def multipart(keys, script):
    """A MIME multipart user-data of a cloud-config part with the SSH keys and the script, as cloud-init reads
    it. The boundary is derived from the content, so the same document gives the same text (the machine's boot
    configuration hash stays the same on every apply)."""
    import hashlib
    import json
    config = "#cloud-config\nssh_authorized_keys:\n" + "".join("  - %s\n" % json.dumps(key) for key in keys)
    boundary = "==machinery-%s==" % hashlib.sha256((config + script).encode()).hexdigest()[:24]
    parts = []
    sections = (("text/cloud-config", "keys.cfg", config), ("text/x-shellscript", "user-data.sh", script))
    for kind, name, text in sections:
        parts.append("--%s\nContent-Type: %s; charset=\"utf-8\"\nMIME-Version: 1.0\n"
                     "Content-Transfer-Encoding: 7bit\nContent-Disposition: attachment; filename=\"%s\"\n\n%s"
                     % (boundary, kind, name, text + "\n"))  # the last line break is the boundary's
    return ("Content-Type: multipart/mixed; boundary=\"%s\"\nMIME-Version: 1.0\n\n" % boundary
            + "".join(parts) + "--%s--\n" % boundary)


def _os(fields, value):
    value = fields.mapping(value, "spec.os", required=True)
    if value is None:
        return None
    fields.known(value, ("family", "distribution", "version", "architecture", "imageID", "imageFamily"), "spec.os")
    wanted = {"family": fields.string(value.get("family"), "spec.os.family", required=True, choices=OS_FAMILIES),
              "distribution": fields.string(value.get("distribution"), "spec.os.distribution", required=True),
              "version": _text(fields, value.get("version"), "spec.os.version", required=True)}
    if value.get("architecture") is not None:
        wanted["architecture"] = fields.string(value["architecture"], "spec.os.architecture", choices=ARCHITECTURES)
    if value.get("imageID") is not None:
        wanted["imageID"] = fields.name(value["imageID"], "spec.os.imageID")
    return wanted


def _text(fields, value, path, required=False):
    """A string field YAML may have read as a number (version: 12)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return fields.string(value, path, required=required)


def _provider(fields, value, params):
    value = fields.mapping(value, "spec.providerConfig", required=True)
    if value is None:
        return
    fields.known(value, ("name", "region", "zone", "config", "credentialsRef"), "spec.providerConfig")
    name = fields.string(value.get("name"), "spec.providerConfig.name", required=True, choices=PROVIDERS)
    if name and name != "libvirt":
        fields.error("spec.providerConfig.name", "provider %r is not served by machinery.compute: only libvirt is"
                     % name)
    region = fields.string(value.get("region"), "spec.providerConfig.region", required=True)
    zone = fields.string(value.get("zone"), "spec.providerConfig.zone")
    selector = {}
    if region:
        selector[REGION_LABEL] = fields.run(check.label_value, region, "spec.providerConfig.region")
    if zone:
        selector[ZONE_LABEL] = fields.run(check.label_value, zone, "spec.providerConfig.zone")
    if selector:
        params["machine_pool_selector"] = selector


def _disks(fields, value, params):
    volumes, boot_seen = [], False
    names = set()
    for index, item in fields.items(value, "spec.disks"):
        where = "spec.disks[%d]" % index
        fields.known(item, ("name", "sizeGB", "type", "boot", "encrypted", "iops", "throughput"), where)
        name = fields.name(item.get("name"), where + ".name")
        if name in names:
            fields.error(where + ".name", "duplicate name %r" % name)
        names.add(name)
        size = fields.integer(item.get("sizeGB"), where + ".sizeGB", 1, 65536, required=True)
        iops = fields.integer(item.get("iops"), where + ".iops", 100, 64000)
        throughput = fields.integer(item.get("throughput"), where + ".throughput", 125, 4000)
        boot = fields.boolean(item.get("boot"), where + ".boot")
        encrypted = fields.boolean(item.get("encrypted"), where + ".encrypted")
        if item.get("type") is not None:
            fields.string(item.get("type"), where + ".type")
        if boot:
            if boot_seen:
                fields.error(where + ".boot", "only one disk can be the boot disk")
            boot_seen = True
            if size:
                params["root_size"] = size * GIB
            for key, option in (("iops", iops), ("throughput", throughput), ("encrypted", encrypted)):
                if option:
                    fields.error(where + "." + key, "the boot disk is the image's overlay; give %s on another disk"
                                 % key)
            continue
        entry = {"name": name, "size": size * GIB if size else None, "at": where}
        for key, option in (("iops", iops), ("throughput", throughput), ("encrypted", encrypted)):
            if option is not None and option is not False:
                entry[key] = option
        if encrypted:
            # the CRD has no passphrase: a random key per volume, kept only in the pool's private libvirt secret
            # (machine.py); the record never holds it, so a later apply's new key changes nothing
            import secrets
            entry["passphrase"] = secrets.token_urlsafe(32)
        volumes.append(entry)
    if volumes:
        params["volumes"] = volumes


def _network(fields, value, groups, params):
    groups = fields.strings(groups, "spec.securityGroups")
    value = fields.mapping(value, "spec.network")
    if value is None:
        if groups:
            fields.error("spec.securityGroups", "security groups apply to network interfaces; give spec.network")
        return
    fields.known(value, ("vpc", "subnet", "assignPublicIP", "privateIP", "publicIP", "interfaces"), "spec.network")
    vpc = fields.name(value.get("vpc"), "spec.network.vpc", required=True)
    private = None
    if value.get("privateIP") is not None:
        private = fields.run(_ipv4, value["privateIP"], "spec.network.privateIP")
    nics = []
    for index, item in fields.items(value.get("interfaces"), "spec.network.interfaces"):
        where = "spec.network.interfaces[%d]" % index
        fields.known(item, ("name", "primary", "subnet", "securityGroups"), where)
        nic = {"name": fields.name(item.get("name"), where + ".name"), "network": vpc,
               "primary": fields.boolean(item.get("primary"), where + ".primary"), "at": where}
        own = fields.strings(item.get("securityGroups"), where + ".securityGroups")
        if own or groups:
            nic["security_groups"] = list(dict.fromkeys(list(groups) + list(own)))
        nics.append(nic)
    if not nics:
        nics = [{"name": "eth0", "network": vpc, "primary": True, "at": "spec.network.vpc"}]
        if groups:
            nics[0]["security_groups"] = list(groups)
    primaries = [nic for nic in nics if nic.get("primary")]
    if len(primaries) > 1:
        fields.error("spec.network.interfaces", "only one interface can be primary")
    if private:
        (primaries or nics)[0]["ip_address"] = private
    for nic in nics:
        nic.pop("primary", None)
    params["network_interfaces"] = nics


def _ipv4(value, field):
    import ipaddress
    try:
        return str(ipaddress.ip_address(str(value)))
    except ValueError:
        from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
        raise ValidationError("%r is not an IP address" % (value,), field) from None


def _backup(fields, value):
    value = fields.mapping(value, "spec.backup")
    if value is None:
        return
    fields.known(value, ("enabled", "schedule", "retentionDays"), "spec.backup")
    fields.boolean(value.get("enabled"), "spec.backup.enabled")
    schedule = fields.string(value.get("schedule"), "spec.backup.schedule")
    if schedule and (len(schedule.split()) != 5 or not all(_CRON_FIELD.match(part) for part in schedule.split())):
        fields.error("spec.backup.schedule", "%r is not a cron schedule of 5 fields such as '0 2 * * *'" % schedule)
    fields.integer(value.get("retentionDays"), "spec.backup.retentionDays", minimum=1)


def link(obj, objects, fields, pools=None):
    """The image of ``os``: imageID names it; else the one published image whose os matches."""
    wanted = obj.refs.get("os")
    if not wanted:
        return
    if wanted.get("imageID"):
        obj.params["image"] = wanted["imageID"]
        obj.where["image"] = "spec.os.imageID"
        return
    if pools is None:
        return
    keys = [key for key in ("family", "distribution", "version", "architecture") if wanted.get(key)]
    found = sorted({name for images in pools.images.values() for name, doc in images.items()
                    if all(str((doc.get("os") or {}).get(key)) == wanted[key] for key in keys)})
    if not found:
        fields.error("spec.os", "no image published on the pools is %s; publish one with machine_image (os: ...)"
                     % " ".join(wanted[key] for key in keys))
    elif len(found) > 1:
        fields.error("spec.os", "%d published images match (%s); name one with imageID"
                     % (len(found), ", ".join(found)))
    else:
        obj.params["image"] = found[0]


# vitistack's phases: a machine being shut down is Stopping, a shut-off one Stopped (ours: Terminating, Shutdown)
PHASES = {"Pending": "Creating", "Running": "Running", "Shutdown": "Stopped", "Terminating": "Stopping",
          "Terminated": "Terminated", "Failed": "Failed"}


def _condition(kind, ok, reason, message=""):
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def _drain_ready(machine):
    """DrainReady: whether the drain role could move the machine off its pool now. The move core refuses a machine
    with encrypted volumes (their passphrase secret stays on the pool) or fixed addresses (reserved on the pool's
    network); snapshots, which it refuses too, are not in a machine's status and are named by the move itself."""
    encrypted = [vol["name"] for vol in machine.get("volumes") or [] if vol.get("encrypted")]
    fixed = [nic["name"] for nic in machine.get("network_interfaces") or [] if nic.get("ip_address")]
    if encrypted:
        return _condition("DrainReady", False, "EncryptedVolumes", "encrypted volumes %s stay on the pool: a drain "
                          "cannot move the machine" % ", ".join(encrypted))
    if fixed:
        return _condition("DrainReady", False, "FixedAddresses", "fixed addresses of %s are reserved on the pool's "
                          "network: a drain cannot move the machine" % ", ".join(fixed))
    return _condition("DrainReady", True, "Movable")


def _backup_ready(backups):
    """BackupReady: whether a backup of the machine exists (machine_backup keeps their list in the pool's
    registry); vitistack's spec.backup schedule runs outside the pools, so the newest one is named."""
    entries = sorted((backups or {}).get("backups") or [], key=lambda entry: entry.get("created") or "")
    if not entries:
        return _condition("BackupReady", False, "NoBackup", "no backup taken yet (machinery.compute.machine_backup)")
    newest = entries[-1]
    return _condition("BackupReady", True, "BackedUp", "newest backup %s taken %s" % (newest["name"],
                                                                                      newest.get("created")))


def conditions(machine, backups=None):
    """vitistack's conditions from the machine's: Ready; InfrastructureReady (defined, every disk in place);
    NetworkReady (every NIC attached and, with a NIC on a network, an address); BootstrapReady (the guest agent
    answered or connected: the machine status's own condition); DrainReady (a drain could move it); BackupReady
    (a backup of it exists: ``backups``, its document of the pool's registry)."""
    found = {item["type"]: item for item in machine.get("conditions") or []}
    status = {kind: (found.get(kind) or {}).get("status") == "True" for kind in found}
    on_network = any(nic.get("network") for nic in machine.get("network_interfaces") or [])
    addressed = bool(machine.get("ip_addresses")) or not on_network
    bootstrap = found.get("BootstrapReady") or {}
    return [
        _condition("Ready", status.get("Ready", False), machine.get("phase") or "Pending"),
        _condition("InfrastructureReady", status.get("VolumesReady", False),
                   (found.get("VolumesReady") or {}).get("reason") or "Pending",
                   (found.get("VolumesReady") or {}).get("message") or ""),
        _condition("NetworkReady", status.get("NetworkInterfacesReady", False) and addressed,
                   "Addressed" if addressed else "NoAddress",
                   "" if addressed else "no DHCP lease or agent-reported address yet"),
        _condition("BootstrapReady", bootstrap.get("status") == "True", bootstrap.get("reason") or "Unknown",
                   bootstrap.get("message") or ""),
        _drain_ready(machine),
        _backup_ready(backups),
    ]


def status(obj, observed):
    machine = observed.get("machine")
    if observed.get("deletion"):
        # vitistack keeps the phase of a deleted machine: Terminating while this run deletes it, then Terminated
        phase = "Terminating" if observed["deletion"] == "deleting" else "Terminated"
        return {"phase": phase, "state": phase, "lastUpdated": _now()}
    if machine is None:
        return {"phase": "Pending"}
    addresses = machine.get("ip_addresses") or []
    guest = machine.get("guest") or {}
    system = guest.get("os") or {}
    memory = machine.get("memory")
    return {"phase": PHASES.get(machine["phase"], "Pending"), "state": machine["phase"],
            "message": str(machine.get("last_error") or ""),
            "machineID": machine.get("uuid"), "providerID": "libvirt://%s/%s" % (machine.get("pool"),
                                                                                 machine.get("uuid")),
            "ipAddresses": addresses, "privateIPAddresses": addresses, "publicIPAddresses": [],
            "ipv6Addresses": [address for address in addresses if ":" in address],
            "networkInterfaces": machine.get("network_interfaces") or [],
            "cpus": machine.get("cpu"), "memory": parse_quantity(memory, "memory") if memory else None,
            "architecture": system.get("machine") or "x86_64",
            "disks": [{"name": vol["name"], "size": vol.get("size"), "state": vol["state"]}
                      for vol in machine.get("volumes") or []],
            "hostname": guest.get("hostname") or machine["name"],
            "operatingSystem": system.get("name"), "operatingSystemVersion": system.get("version"),
            "kernelVersion": (guest.get("kernel") or {}).get("release"), "bootTime": guest.get("boot_time"),
            "creationTime": machine.get("created"), "lastUpdated": _now(), "conditions": conditions(machine, observed.get("backups"))}


def _now():
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


TABLES = {"Machine": ("NAME", "PHASE", "INSTANCETYPE", "PROVIDER", "POOL", "AGE")}


def row(obj, shown, observed):
    machine = observed.get("machine") or {}
    return (obj.name, shown.get("phase"), obj.params.get("machine_class") or "-", "libvirt",
            machine.get("pool") or "-", machine.get("age") or "-")


EXPORT_NEEDS_POOL = True


def export(machine, record_spec, image, pool_labels):
    """A Machine document of an existing machine: its class, image (imageID and the published os), the pool's
    region and zone, cpu, memory, disks, network and tags. Applying it to the same pools changes nothing; the
    boot configuration (sshKeys, userData) is never kept on the pools, so it is not exported."""
    system = dict(image.get("os") or {})
    spec = {"name": machine["name"],
            "os": dict({key: str(system[key]) for key in ("family", "distribution", "version", "architecture")
                        if system.get(key)}, imageID=machine.get("image")),
            "providerConfig": {"name": "libvirt", "region": pool_labels.get(REGION_LABEL) or machine.get("pool")}}
    if machine.get("machine_class"):
        spec["instanceType"] = machine["machine_class"]
    if pool_labels.get(ZONE_LABEL):
        spec["providerConfig"]["zone"] = pool_labels[ZONE_LABEL]
    topology = record_spec.get("topology") or {}
    if topology and (topology.get("sockets", 1) > 1 or topology.get("threads", 1) > 1):
        spec["cpu"] = {"cores": topology.get("cores", 1), "threadsPerCore": topology.get("threads", 1),
                       "sockets": topology.get("sockets", 1)}
    elif record_spec.get("cpu"):
        spec["cpu"] = {"cores": record_spec["cpu"]}
    if record_spec.get("memory"):
        spec["memory"] = int(record_spec["memory"])
    disks = []
    if record_spec.get("root_size"):
        disks.append({"name": "root", "boot": True, "sizeGB": int(record_spec["root_size"]) // GIB})
    for vol in record_spec.get("volumes") or []:
        if vol.get("source") != "empty":
            continue
        disk = {"name": vol["name"], "sizeGB": int(vol.get("size") or 0) // GIB}
        for key in ("iops", "throughput", "encrypted"):
            if vol.get(key):
                disk[key] = vol[key]
        disks.append(disk)
    if disks:
        spec["disks"] = disks
    nics = [nic for nic in record_spec.get("network_interfaces") or [] if nic.get("network")]
    if nics:
        network = {"vpc": nics[0]["network"],
                   "interfaces": [dict({"name": nic["name"]}, primary=True) if index == 0 else {"name": nic["name"]}
                                  for index, nic in enumerate(nics)]}
        for item, nic in zip(network["interfaces"], nics):
            if nic.get("security_groups"):
                item["securityGroups"] = list(nic["security_groups"])
        if nics[0].get("ip_address"):
            network["privateIP"] = nics[0]["ip_address"]
        spec["network"] = network
    metadata = {"name": machine["name"]}
    if machine.get("labels"):
        spec["tags"] = dict(machine["labels"])
    return {"apiVersion": API, "kind": "Machine", "metadata": metadata, "spec": spec}


__all__ = ["KINDS", "read", "link", "status", "TABLES", "row", "columns"]
