# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""IronCore: compute.ironcore.dev/v1alpha1 Machine, MachineClass, MachinePool; storage.ironcore.dev/v1alpha1
Volume; networking.ironcore.dev/v1alpha1 NetworkInterface; v1 Secret (an ignitionRef's target).

A Machine becomes the parameters of ``machine`` (converged by the batch core, scheduled when it names no pool),
a MachineClass those of ``machine_class``, a Volume a volume of a pool's storage, a NetworkInterface the NIC it
describes on the machine that refers to it, a MachinePool a reference to a pool of the run by name.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import (
    APPLIED, refused, table, warned)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import (
    kube_quantity, secret_value)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import (
    ManifestObject, columns, machine_object)

COMPUTE = "compute.ironcore.dev/v1alpha1"
STORAGE = "storage.ironcore.dev/v1alpha1"
NETWORKING = "networking.ironcore.dev/v1alpha1"
KINDS = {COMPUTE: ("Machine", "MachineClass", "MachinePool"), STORAGE: ("Volume",), NETWORKING: ("NetworkInterface",),
         "v1": ("Secret",)}
POWER = {"On": "running", "Off": "stopped"}
DEFAULT_IGNITION_KEY = "ignition"
# labels that keep how a Machine was written, so its export is written the same way: the NetworkInterface a NIC
# refers to, and a sized volume given as an ephemeral volumeTemplate rather than an emptyDisk
NIC_MARK = "nic.ironcore.machinery.compute/"
VOLUME_MARK = "volume.ironcore.machinery.compute/"
MACHINE_SPEC = ("machineClassRef", "machinePoolRef", "machinePoolSelector", "tolerations", "image", "volumes",
                "networkInterfaces", "ignitionRef", "power", "imagePullSecretRef", "efiVars", "hostname")

# --- what becomes of every field (conformance.py) ---------------------------------------------------------------

NO_PULL_SECRET = warned("images are read by the pools from a published name, a path or a URL: no pull secret")
DHCP_ONLY = warned("a libvirt network hands out addresses by DHCP from its own range: no virtual IPs, prefixes "
                   "or IP families")
EPHEMERAL_META = warned("an ephemeral resource is a device of its machine: its own metadata is not kept")
NO_VOLUME_CLASS = warned("a pool's storage has one class of volume (qcow2 in its storage pool): the class is "
                         "not applied")
NO_SNAPSHOTS = refused("volume snapshots are not supported; give osImage or image")
VOLUME_SPEC = {
    "resources.storage": APPLIED, "image": APPLIED, "dataSource.osImage": APPLIED,
    "dataSource.osImage.image": APPLIED, "dataSource.snapshotRef": NO_SNAPSHOTS,
    "volumeClassRef.name": NO_VOLUME_CLASS, "imagePullSecretRef.name": NO_PULL_SECRET,
    "volumePoolSelector.*": warned("a volume goes to its volumePoolRef, else its machine's pool, else the first "
                                   "pool: no pool selector"),
    "tolerations": warned("a volume goes to its volumePoolRef, else its machine's pool: pool taints do not "
                          "apply to volumes"),
}
NIC_SPEC = {
    "networkRef.name": APPLIED, "ips": APPLIED, "ips[].value": APPLIED,
    "ips[].ephemeral": DHCP_ONLY, "virtualIP": DHCP_ONLY, "prefixes": DHCP_ONLY, "ipFamilies": DHCP_ONLY,
}
VOLUME_SPEC_KEYS = ("volumeClassRef", "volumePoolSelector", "resources", "image", "imagePullSecretRef",
                    "tolerations", "dataSource")
# machine option -> the Machine's field, for the core's problems (items: recorded per object in obj.where)
OPTION_PATHS = {"machine_class": "spec.machineClassRef.name", "image": "spec.image", "state": "spec.power",
                "machine_pool": "spec.machinePoolRef.name", "machine_pool_selector": "spec.machinePoolSelector",
                "tolerations": "spec.tolerations", "hostname": "spec.hostname", "ignition": "spec.ignitionRef",
                "labels": "metadata.labels", "name": "metadata.name", "volumes": "spec.volumes",
                "network_interfaces": "spec.networkInterfaces"}
EPHEMERAL_VOLUME = "spec.volumes[].ephemeral.volumeTemplate"
EPHEMERAL_NIC = "spec.networkInterfaces[].ephemeral.networkInterfaceTemplate"
FIELDS = {
    "Machine": table(dict(
        {"spec.machineClassRef.name": APPLIED, "spec.machinePoolRef.name": APPLIED,
         "spec.machinePoolSelector.*": APPLIED, "spec.tolerations[].key": APPLIED,
         "spec.tolerations[].operator": APPLIED, "spec.tolerations[].value": APPLIED,
         "spec.tolerations[].effect": APPLIED, "spec.image": APPLIED, "spec.imagePullSecretRef.name": NO_PULL_SECRET,
         "spec.volumes[].name": APPLIED, "spec.volumes[].device": APPLIED, "spec.volumes[].volumeRef.name": APPLIED,
         "spec.volumes[].emptyDisk.sizeLimit": APPLIED, EPHEMERAL_VOLUME + ".metadata": EPHEMERAL_META,
         "spec.networkInterfaces[].name": APPLIED, "spec.networkInterfaces[].networkInterfaceRef.name": APPLIED,
         EPHEMERAL_NIC + ".metadata": EPHEMERAL_META,
         "spec.ignitionRef.name": APPLIED, "spec.ignitionRef.key": APPLIED, "spec.power": APPLIED,
         "spec.efiVars": warned("EFI variables are the pool's firmware store (firmware: uefi): not applied"),
         "spec.hostname": APPLIED},
        **{EPHEMERAL_VOLUME + ".spec." + key: verdict for key, verdict in VOLUME_SPEC.items()},
        **{EPHEMERAL_NIC + ".spec." + key: verdict for key, verdict in NIC_SPEC.items()})),
    "MachineClass": table({"capabilities.cpu": APPLIED, "capabilities.memory": APPLIED}),
    "MachinePool": table({
        "spec.providerID": warned("a MachinePool names a pool of the run by metadata.name; the pool's libvirt URI "
                                  "is its provider ID"),
        "spec.taints": warned("a pool's taints are set with machinery.compute.machine_pool (taints), not by a "
                              "MachinePool reference")}),
    "Volume": table(dict({"spec.volumePoolRef.name": APPLIED},
                         **{"spec." + key: verdict for key, verdict in VOLUME_SPEC.items()})),
    "NetworkInterface": table(dict({"spec.machineRef.name": APPLIED},
                                   **{"spec." + key: verdict for key, verdict in NIC_SPEC.items()})),
    "Secret": table({"data.*": APPLIED, "stringData.*": APPLIED, "type": APPLIED,
                     "immutable": warned("libvirt keeps no Secret object: the text is read once, by ignitionRef")}),
}


def read(obj, fields):
    """Check one document of the dialect and keep what the cores need in ``obj.data``."""
    doc = obj.doc
    if obj.kind == "MachineClass":
        fields.known(doc, ("apiVersion", "kind", "metadata", "capabilities"), "", ("status",))
        caps = fields.mapping(doc.get("capabilities"), "capabilities", required=True) or {}
        fields.known(caps, ("cpu", "memory"), "capabilities")
        cpu = fields.run(check.cpu_count, caps["cpu"], "capabilities.cpu") if "cpu" in caps else \
            fields.error("capabilities.cpu", "required value")
        memory = kube_quantity(fields, caps.get("memory"), "capabilities.memory", True) if "memory" in caps else \
            fields.error("capabilities.memory", "required value")
        obj.role = "class"
        obj.data = {"name": obj.name, "cpu": cpu, "memory": memory}
    elif obj.kind == "MachinePool":
        fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
        spec = fields.mapping(doc.get("spec"), "spec") or {}
        fields.known(spec, ("providerID", "taints"), "spec")
        obj.role = "pool"
    elif obj.kind == "Secret":
        fields.known(doc, ("apiVersion", "kind", "metadata", "data", "stringData", "type", "immutable"), "")
        fields.string(doc.get("type"), "type")  # shown in the table
        fields.mapping(doc.get("data"), "data")
        fields.mapping(doc.get("stringData"), "stringData")
        obj.role = "secret"
    elif obj.kind == "Volume":
        _volume(obj, fields)
    elif obj.kind == "NetworkInterface":
        fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
        spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
        fields.known(spec, ("networkRef", "ips", "machineRef", "virtualIP", "prefixes", "ipFamilies"), "spec")
        network = fields.mapping(spec.get("networkRef"), "spec.networkRef", required=True) or {}
        owner = fields.mapping(spec.get("machineRef"), "spec.machineRef") or {}
        obj.role = "nic"
        obj.data = {"network": fields.string(network.get("name"), "spec.networkRef.name", required="networkRef" in spec),
                    "ip_address": fixed_address(fields, spec.get("ips"), "spec.ips"),
                    "machine": fields.name(owner.get("name"), "spec.machineRef.name") if owner else None}
    else:
        _machine(obj, fields)


def _volume(obj, fields):
    """A Volume: a volume of a pool's storage (volumes.py), empty or a copy of ``spec.image`` or
    ``spec.dataSource.osImage`` (the newer spelling of the same), sized by ``spec.resources.storage``."""
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, VOLUME_SPEC_KEYS + ("volumePoolRef",), "spec")
    image, image_path = _volume_image(spec, fields)
    resources = fields.mapping(spec.get("resources"), "spec.resources", required=image is None) or {}
    fields.known(resources, ("storage",), "spec.resources")
    size = None
    if "storage" in resources:
        size = kube_quantity(fields, resources.get("storage"), "spec.resources.storage")
    elif image is None:
        fields.error("spec.resources.storage", "required value")
    pool = fields.mapping(spec.get("volumePoolRef"), "spec.volumePoolRef") or {}
    obj.role = "volume"
    obj.data = {"name": obj.name, "size": size, "image": image, "image_path": image_path,
                "pool": fields.string(pool.get("name"), "spec.volumePoolRef.name") if pool else None}
    fields.run(_attachable, obj.name, "metadata.name")


def _volume_image(spec, fields, prefix="spec"):
    """(image, the path it was given at) of a Volume's spec, or (None, None). ``dataSource.osImage`` is
    IronCore's OSImageSource (``{image: ...}``); a plain string is taken too."""
    source = fields.mapping(spec.get("dataSource"), prefix + ".dataSource") or {}
    fields.known(source, ("osImage", "snapshotRef"), prefix + ".dataSource")
    os_image, os_path = source.get("osImage"), prefix + ".dataSource.osImage"
    if isinstance(os_image, dict):
        fields.known(os_image, ("image",), os_path)
        os_image, os_path = os_image.get("image"), os_path + ".image"
    given = []
    for value, path in ((spec.get("image"), prefix + ".image"), (os_image, os_path)):
        text = fields.string(value, path)
        if text is not None:
            given.append((text, path))
    if len(given) == 2 and given[0][0] != given[1][0]:
        fields.error(os_path, "differs from %s.image; give one of them" % prefix)
    return given[-1] if given else (None, None)


def fixed_address(fields, ips, path):
    """The NIC's fixed address (``ip_address``) from IronCore ``ips`` (each a string or ``{value: ...}``): one
    IPv4 address is a DHCP reservation on the libvirt network; anything more is a warning naming the field."""
    import ipaddress
    given = []
    for index, item in enumerate(ips if isinstance(ips, list) else []):
        value = item.get("value") if isinstance(item, dict) else item
        if value is not None:
            given.append(("%s[%d]" % (path, index) + (".value" if isinstance(item, dict) else ""), value))
    if ips is not None and not isinstance(ips, list):
        fields.error(path, "must be a list")
    if not given:
        return None
    where, value = given[0]
    try:
        address = ipaddress.ip_address(str(value))
    except ValueError:
        fields.error(where, "%r is not an IP address" % (value,))
        return None
    if len(given) > 1 or address.version != 4:
        fields.warn(path, "a libvirt NIC takes one fixed IPv4 address (a DHCP reservation): not applied; give "
                          "one IPv4 address")
        return None
    return str(address)


def _attachable(name, field):
    from ansible_collections.machinery.compute.plugins.module_utils.pools import storage
    storage.check_attachable(name, field)
    return name


def _machine(obj, fields):
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, MACHINE_SPEC, "spec")
    params = {"name": obj.name, "labels": dict(obj.labels)}
    cls = fields.mapping(spec.get("machineClassRef"), "spec.machineClassRef", required=True) or {}
    params["machine_class"] = fields.class_name(cls.get("name"), "spec.machineClassRef.name") if cls else None
    if spec.get("image") is not None:
        params["image"] = fields.string(spec.get("image"), "spec.image")
    power = fields.string(spec.get("power"), "spec.power", choices=tuple(POWER))
    params["state"] = POWER.get(power or "On")
    pool = fields.mapping(spec.get("machinePoolRef"), "spec.machinePoolRef")
    if pool:
        params["machine_pool"] = fields.string(pool.get("name"), "spec.machinePoolRef.name", required=True)
    selector = fields.mapping(spec.get("machinePoolSelector"), "spec.machinePoolSelector")
    if selector:
        params["machine_pool_selector"] = fields.run(check.labels, selector, "spec.machinePoolSelector")
    tolerations = fields.items(spec.get("tolerations"), "spec.tolerations")
    if tolerations:
        from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import (
            normalize_tolerations)
        params["tolerations"] = fields.run(normalize_tolerations, [item for _index, item in tolerations],
                                           "spec.tolerations")
    refs = {"class": params["machine_class"], "volumes": [], "nics": [], "secret": None}
    params["volumes"] = []
    seen = set()
    for index, item in fields.items(spec.get("volumes"), "spec.volumes"):
        where = "spec.volumes[%d]" % index
        fields.known(item, ("name", "device", "volumeRef", "emptyDisk", "ephemeral"), where)
        name = fields.name(item.get("name"), where + ".name")
        if name in seen:
            fields.error(where + ".name", "duplicate name %r" % name)
        seen.add(name)
        sources = [key for key in ("volumeRef", "emptyDisk", "ephemeral") if key in item]
        if len(sources) != 1:
            fields.error(where, "give exactly one of volumeRef, emptyDisk or ephemeral")
            continue
        entry = {"name": name}
        if item.get("device"):
            entry["device"] = "vd" + str(item["device"]) if len(str(item["device"])) == 1 else str(item["device"])
        if "volumeRef" in item:
            ref = fields.mapping(item["volumeRef"], where + ".volumeRef", required=True) or {}
            entry["volume"] = fields.name(ref.get("name"), where + ".volumeRef.name")
            refs["volumes"].append((where + ".volumeRef.name", entry["volume"]))
        elif "emptyDisk" in item:
            disk = fields.mapping(item["emptyDisk"], where + ".emptyDisk", required=True) or {}
            fields.known(disk, ("sizeLimit",), where + ".emptyDisk")
            entry["size"] = kube_quantity(fields, disk.get("sizeLimit"), where + ".emptyDisk.sizeLimit")
            obj.where["volumes[%d].size" % len(params["volumes"])] = where + ".emptyDisk.sizeLimit"
        else:
            at = where + ".ephemeral.volumeTemplate"
            template = (fields.mapping(item["ephemeral"], where + ".ephemeral", required=True) or {})
            fields.known(template, ("volumeTemplate",), where + ".ephemeral")
            volume_template = fields.mapping(template.get("volumeTemplate"), at, required=True) or {}
            fields.known(volume_template, ("metadata", "spec"), at)
            spec_of = fields.mapping(volume_template.get("spec"), at + ".spec", required=True) or {}
            fields.known(spec_of, VOLUME_SPEC_KEYS, at + ".spec")
            image, image_path = _volume_image(spec_of, fields, at + ".spec")
            resources = fields.mapping(spec_of.get("resources"), at + ".spec.resources") or {}
            fields.known(resources, ("storage",), at + ".spec.resources")
            if image:
                entry["image"] = image
                obj.where["volumes[%d].image" % len(params["volumes"])] = image_path
                if resources.get("storage") is not None:
                    fields.warn(at + ".spec.resources.storage", "a volume made from an image is the image's size "
                                "(its root disk grows with root_size); not applied")
            else:
                entry["size"] = kube_quantity(fields, resources.get("storage"), at + ".spec.resources.storage")
                if name:
                    params["labels"][VOLUME_MARK + name] = "template"
                obj.where["volumes[%d].size" % len(params["volumes"])] = at + ".spec.resources.storage"
            entry["ephemeral"] = True
        obj.where["volumes[%d]" % len(params["volumes"])] = where
        params["volumes"].append(entry)
    if "networkInterfaces" in spec:
        params["network_interfaces"] = []
    for index, item in fields.items(spec.get("networkInterfaces"), "spec.networkInterfaces"):
        where = "spec.networkInterfaces[%d]" % index
        fields.known(item, ("name", "networkInterfaceRef", "ephemeral"), where)
        name = fields.name(item.get("name"), where + ".name")
        if ("networkInterfaceRef" in item) == ("ephemeral" in item):
            fields.error(where, "give exactly one of networkInterfaceRef or ephemeral")
            continue
        if "networkInterfaceRef" in item:
            ref = fields.mapping(item["networkInterfaceRef"], where + ".networkInterfaceRef", required=True) or {}
            target = fields.name(ref.get("name"), where + ".networkInterfaceRef.name")
            refs["nics"].append((where + ".networkInterfaceRef.name", target, name))
            params["network_interfaces"].append({"name": name, "ref": target})
            if name and target:
                params["labels"][NIC_MARK + name] = target
        else:
            at = where + ".ephemeral.networkInterfaceTemplate"
            template = fields.mapping(item["ephemeral"], where + ".ephemeral", required=True) or {}
            fields.known(template, ("networkInterfaceTemplate",), where + ".ephemeral")
            nic_template = fields.mapping(template.get("networkInterfaceTemplate"), at, required=True) or {}
            fields.known(nic_template, ("metadata", "spec"), at)
            nic_spec = fields.mapping(nic_template.get("spec"), at + ".spec", required=True) or {}
            fields.known(nic_spec, ("networkRef", "ips", "virtualIP", "prefixes", "ipFamilies"), at + ".spec")
            network = fields.string((nic_spec.get("networkRef") or {}).get("name"), at + ".spec.networkRef.name",
                                    required=True)
            nic = {"name": name, "network": network, "ephemeral": True}
            address = fixed_address(fields, nic_spec.get("ips"), at + ".spec.ips")
            if address:
                nic["ip_address"] = address
                obj.where["network_interfaces[%d].ip_address" % len(params["network_interfaces"])] = at + ".spec.ips"
            obj.where["network_interfaces[%d].network" % len(params["network_interfaces"])] = \
                at + ".spec.networkRef.name"
            params["network_interfaces"].append(nic)
        obj.where["network_interfaces[%d]" % (len(params["network_interfaces"]) - 1)] = where
    ignition = fields.mapping(spec.get("ignitionRef"), "spec.ignitionRef")
    if ignition:
        fields.known(ignition, ("name", "key"), "spec.ignitionRef")
        refs["secret"] = ("spec.ignitionRef", fields.name(ignition.get("name"), "spec.ignitionRef.name"),
                          fields.string(ignition.get("key"), "spec.ignitionRef.key") or DEFAULT_IGNITION_KEY)
    if spec.get("hostname") is not None:
        params["hostname"] = fields.run(check.hostname, spec["hostname"], "spec.hostname")
    obj.where.update(OPTION_PATHS)
    machine_object(obj, params, refs)


def link(obj, objects, fields, _pools=None):
    """Resolve a Machine's references to the other documents: its NetworkInterfaces and ignition Secret (which
    must be among the documents) and its Volumes (in the documents, or already in the pool's storage)."""
    refs = obj.refs
    for nic in obj.params.get("network_interfaces") or []:
        target = nic.pop("ref", None)
        if target is None:
            continue
        found = objects.get(("NetworkInterface", target))
        if found is None:
            path = next(where for where, name, _nic in refs["nics"] if name == target)
            fields.error(path, "NetworkInterface %r is not among the documents" % target)
            continue
        nic.update(network=found.data.get("network"), ephemeral=False)
        if found.data.get("ip_address"):
            nic["ip_address"] = found.data["ip_address"]
        owner = found.data.get("machine")
        if owner and owner != obj.name:
            fields.error(next(where for where, name, _nic in refs["nics"] if name == target),
                         "NetworkInterface %r belongs to Machine %r (its spec.machineRef)" % (target, owner))
    if refs.get("secret"):
        path, name, key = refs["secret"]
        secret = objects.get(("Secret", name))
        if secret is None:
            fields.error(path + ".name", "Secret %r is not among the documents" % name)
        else:
            text = secret_value(fields, secret.doc, key, path + ".key")
            if text is not None:
                try:
                    obj.params["ignition"] = json.loads(text)
                except ValueError as exc:
                    fields.error(path, "the secret's %s is not JSON: %s" % (key, exc))


STATE = {"Pending": "Pending", "Running": "Running", "Shutdown": "Shutdown", "Terminating": "Terminating",
         "Terminated": "Terminated", "Failed": "Error"}


def pool_status(pool):
    """A MachinePool's status as IronCore's pools report it: the classes it offers as references, and capacity and
    allocatable as resource lists, cpu and memory with a count per class (``class/machine.<name>``), quantities as
    strings. Capacity is what the pool holds when it runs nothing (after reservations and overcommit), allocatable
    what is left of it now. An unreachable pool reports its state only."""
    shown = {"state": pool.get("state", "Unknown")}
    classes = pool.get("available_machine_classes") or []
    if classes:
        shown["availableMachineClasses"] = [{"name": item["name"]} for item in classes]
    total, used = pool.get("allocatable"), pool.get("allocated")
    if pool.get("state") in (None, "Offline") or not total or not used:
        return shown
    free = {"cpu": total["cpu"] - used["cpu"],
            "memory": max(0, parse_quantity(total["memory"]) - parse_quantity(used["memory"]))}
    shown["capacity"] = dict({"cpu": str(total["cpu"]), "memory": total["memory"]},
                             **{"class/machine.%s" % item["name"]: str(item["capacity"]) for item in classes})
    shown["allocatable"] = dict({"cpu": str(max(0, free["cpu"])), "memory": format_quantity(free["memory"])},
                                **{"class/machine.%s" % item["name"]: str(item["allocatable"]) for item in classes})
    return shown


def status(obj, observed):
    """The status an IronCore object shows, from what the run observed."""
    machine = observed.get("machine")
    if obj.kind == "Machine":
        if observed.get("deletion"):
            # IronCore: a deleted Machine is Terminating, then gone (an empty status)
            return {"state": "Terminating"} if observed["deletion"] == "deleting" else {}
        if machine is None:
            return {"state": "Pending"}
        wanted_volumes = {entry["name"] for entry in obj.params.get("volumes") or []}
        return {"machinePoolRef": {"name": machine.get("pool")}, "state": STATE.get(machine["phase"], "Pending"),
                "conditions": machine.get("conditions") or [],
                "volumes": [{"name": vol["name"], "state": vol["state"]} for vol in machine.get("volumes") or []
                            if vol["name"] in wanted_volumes],
                "networkInterfaces": [{"name": nic["name"], "state": nic["state"], "ips": nic.get("ip_addresses")}
                                      for nic in machine.get("network_interfaces") or []]}
    if obj.kind == "Volume":
        return {"state": "Available" if observed.get("pools") else "Pending", "pools": observed.get("pools", [])}
    if obj.kind == "MachineClass":
        return {"pools": observed.get("pools", [])}
    if obj.kind == "MachinePool":
        return pool_status(observed.get("pool") or {})
    if obj.kind == "NetworkInterface":
        return {"state": "Available" if observed.get("machine") else "Pending"}
    return {}


TABLES = {
    "Machine": ("NAME", "MACHINECLASSREF", "IMAGE", "MACHINEPOOLREF", "STATE", "AGE"),
    "MachineClass": ("NAME", "CPU", "MEMORY"),
    "MachinePool": ("NAME", "STATE"),
    "Volume": ("NAME", "VOLUMEPOOLREF", "SIZE", "STATE"),
    "NetworkInterface": ("NAME", "NETWORK", "STATE"),
    "Secret": ("NAME", "TYPE"),
}


def row(obj, shown, observed):
    machine = observed.get("machine") or {}
    if obj.kind == "Machine":
        return (obj.name, obj.params.get("machine_class") or "-", obj.params.get("image") or "-",
                shown.get("machinePoolRef", {}).get("name") or "-", shown.get("state") or "-",
                machine.get("age") or "-")
    if obj.kind == "MachineClass":
        return (obj.name, str(obj.data.get("cpu")), format_quantity(obj.data.get("memory") or 0))
    if obj.kind == "MachinePool":
        return (obj.name, shown.get("state", "Unknown"))
    if obj.kind == "Volume":
        volume = observed.get("volume") or {}
        size = volume.get("size") or (format_quantity(obj.data["size"]) if obj.data.get("size") else "-")
        return (obj.name, ",".join(shown.get("pools") or []) or "-", size, shown.get("state"))
    if obj.kind == "NetworkInterface":
        return (obj.name, obj.data.get("network") or "-", shown.get("state"))
    return (obj.name, str(obj.doc.get("type") or "Opaque"))


def export(machine, record_spec):
    """The documents of an existing machine: a Machine (its class, image, volumes, NICs, labels and power) and
    the NetworkInterfaces it refers to, written as the applied documents were (the markers keep how)."""
    labels = dict(machine.get("labels") or {})
    refs = {key[len(NIC_MARK):]: labels.pop(key) for key in list(labels) if key.startswith(NIC_MARK)}
    templates = {key[len(VOLUME_MARK):] for key in list(labels) if key.startswith(VOLUME_MARK)
                 and labels.pop(key) == "template"}
    spec = {"machineClassRef": {"name": machine.get("machine_class")}, "image": machine.get("image"),
            "machinePoolRef": {"name": machine.get("pool")},
            "power": "On" if machine.get("phase") in ("Running", "Pending") else "Off"}
    if not spec["image"]:
        del spec["image"]  # a machine that boots from its first volume
    volumes = []
    for vol in record_spec.get("volumes") or []:
        if vol.get("source") == "volume":
            volumes.append({"name": vol["name"], "volumeRef": {"name": vol["volume"]}})
        elif vol.get("source") == "image":
            volumes.append({"name": vol["name"], "ephemeral": {"volumeTemplate": {"spec": {
                "image": (vol.get("image") or {}).get("source")}}}})
        elif vol["name"] in templates:
            volumes.append({"name": vol["name"], "ephemeral": {"volumeTemplate": {"spec": {
                "resources": {"storage": _quantity(vol.get("size"))}}}}})
        else:
            volumes.append({"name": vol["name"], "emptyDisk": {"sizeLimit": _quantity(vol.get("size"))}})
    if volumes:
        spec["volumes"] = volumes
    nics, interfaces = [], []
    for nic in record_spec.get("network_interfaces") or []:
        if not nic.get("network"):
            continue
        nic_spec = {"networkRef": {"name": nic["network"]}}
        if nic.get("ip_address"):
            nic_spec["ips"] = [{"value": nic["ip_address"]}]
        if nic["name"] in refs:
            nics.append({"name": nic["name"], "networkInterfaceRef": {"name": refs[nic["name"]]}})
            interfaces.append({"apiVersion": NETWORKING, "kind": "NetworkInterface",
                               "metadata": {"name": refs[nic["name"]]}, "spec": nic_spec})
        else:
            nics.append({"name": nic["name"], "ephemeral": {"networkInterfaceTemplate": {"spec": nic_spec}}})
    spec["networkInterfaces"] = nics
    if not machine.get("machine_class"):
        del spec["machineClassRef"]
    metadata = {"name": machine["name"]}
    if labels:
        metadata["labels"] = labels
    return [{"apiVersion": COMPUTE, "kind": "Machine", "metadata": metadata, "spec": spec}] + interfaces


def _quantity(value):
    from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
    return format_quantity(value or 0)


__all__ = ["KINDS", "read", "link", "status", "TABLES", "row", "export", "columns", "ManifestObject"]
