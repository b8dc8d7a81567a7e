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
MACHINE_SPEC = ("machineClassRef", "machinePoolRef", "machinePoolSelector", "tolerations", "image", "volumes",
                "networkInterfaces", "ignitionRef", "power", "imagePullSecretRef", "efiVars", "hostname")


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
        obj.role = "nic"
        obj.data = {"network": fields.string(network.get("name"), "spec.networkRef.name", required="networkRef" in spec)}
        if spec.get("ips"):
            fields.warn("spec.ips", "libvirt networks hand out addresses by DHCP; the ips are not applied")
    else:
        _machine(obj, fields)


def _volume(obj, fields):
    """A Volume: a volume of a pool's storage (volumes.py), empty or a copy of ``spec.image`` or
    ``spec.dataSource.osImage`` (the newer spelling of the same), sized by ``spec.resources.storage``."""
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, ("volumeClassRef", "volumePoolRef", "volumePoolSelector", "resources", "image",
                        "imagePullSecretRef", "tolerations", "dataSource"), "spec")
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


def _volume_image(spec, fields):
    """(image, the path it was given at) of a Volume, or (None, None)."""
    source = fields.mapping(spec.get("dataSource"), "spec.dataSource") or {}
    fields.known(source, ("osImage", "snapshotRef"), "spec.dataSource")
    if source.get("snapshotRef"):
        fields.error("spec.dataSource.snapshotRef", "volume snapshots are not supported; give osImage")
    given = []
    for value, path in ((spec.get("image"), "spec.image"), (source.get("osImage"), "spec.dataSource.osImage")):
        text = fields.string(value, path)
        if text is not None:
            given.append((text, path))
    if len(given) == 2 and given[0][0] != given[1][0]:
        fields.error("spec.dataSource.osImage", "differs from spec.image; give one of them")
    return given[-1] if given else (None, None)


def _attachable(name, field):
    from ansible_collections.machinery.compute.plugins.module_utils.pools import storage
    storage.check_attachable(name, field)
    return name


def _machine(obj, fields):
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, MACHINE_SPEC, "spec")
    params = {"name": obj.name, "labels": obj.labels}
    cls = fields.mapping(spec.get("machineClassRef"), "spec.machineClassRef", required=True) or {}
    params["machine_class"] = fields.name(cls.get("name"), "spec.machineClassRef.name") if cls else None
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
        params["tolerations"] = [item for _index, item in tolerations]
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
        else:
            template = (fields.mapping(item["ephemeral"], where + ".ephemeral", required=True) or {})
            spec_of = ((fields.mapping(template.get("volumeTemplate"), where + ".ephemeral.volumeTemplate",
                                       required=True) or {}).get("spec")) or {}
            storage = ((spec_of.get("resources") or {}).get("storage"))
            if spec_of.get("image"):
                entry["image"] = fields.string(spec_of["image"], where + ".ephemeral.volumeTemplate.spec.image")
            else:
                entry["size"] = kube_quantity(fields, storage,
                                              where + ".ephemeral.volumeTemplate.spec.resources.storage")
            entry["ephemeral"] = True
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
        else:
            template = fields.mapping(item["ephemeral"], where + ".ephemeral", required=True) or {}
            nic_spec = ((template.get("networkInterfaceTemplate") or {}).get("spec")) or {}
            network = fields.string((nic_spec.get("networkRef") or {}).get("name"),
                                    where + ".ephemeral.networkInterfaceTemplate.spec.networkRef.name", required=True)
            params["network_interfaces"].append({"name": name, "network": network, "ephemeral": True})
    ignition = fields.mapping(spec.get("ignitionRef"), "spec.ignitionRef")
    if ignition:
        fields.known(ignition, ("name", "key"), "spec.ignitionRef")
        refs["secret"] = ("spec.ignitionRef", fields.name(ignition.get("name"), "spec.ignitionRef.name"),
                          fields.string(ignition.get("key"), "spec.ignitionRef.key") or DEFAULT_IGNITION_KEY)
    if spec.get("hostname") is not None:
        params["hostname"] = fields.run(check.hostname, spec["hostname"], "spec.hostname")
    for key in ("imagePullSecretRef", "efiVars"):
        if spec.get(key):
            fields.warn("spec." + key, "has no meaning on libvirt pools and is ignored")
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


def status(obj, observed):
    """The status an IronCore object shows, from what the run observed."""
    machine = observed.get("machine")
    if obj.kind == "Machine":
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
        pool = observed.get("pool") or {}
        return {"state": pool.get("state", "Unknown"),
                "availableMachineClasses": [item["name"] for item in pool.get("available_machine_classes") or []]}
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
    from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
    machine = observed.get("machine") or {}
    if obj.kind == "Machine":
        return (obj.name, obj.params.get("machine_class") or "-", obj.params.get("image") or "-",
                shown.get("machinePoolRef", {}).get("name") or "-", shown.get("state", "Pending"),
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
    """A Machine document of an existing machine (its class, image, volumes, NICs, labels and power)."""
    spec = {"machineClassRef": {"name": machine.get("machine_class")}, "image": machine.get("image"),
            "machinePoolRef": {"name": machine.get("pool")},
            "power": "On" if machine.get("phase") in ("Running", "Pending") else "Off"}
    volumes = []
    for vol in record_spec.get("volumes") or []:
        if vol.get("source") == "volume":
            volumes.append({"name": vol["name"], "volumeRef": {"name": vol["volume"]}})
        elif vol.get("source") == "image":
            volumes.append({"name": vol["name"], "ephemeral": {"volumeTemplate": {"spec": {
                "image": (vol.get("image") or {}).get("source")}}}})
        else:
            volumes.append({"name": vol["name"], "emptyDisk": {"sizeLimit": _quantity(vol.get("size"))}})
    if volumes:
        spec["volumes"] = volumes
    spec["networkInterfaces"] = [{"name": nic["name"], "ephemeral": {"networkInterfaceTemplate": {"spec": {
        "networkRef": {"name": nic.get("network")}}}}} for nic in record_spec.get("network_interfaces") or []
        if nic.get("network")]
    if not machine.get("machine_class"):
        del spec["machineClassRef"]
    metadata = {"name": machine["name"]}
    if machine.get("labels"):
        metadata["labels"] = dict(machine["labels"])
    return {"apiVersion": COMPUTE, "kind": "Machine", "metadata": metadata, "spec": spec}


def _quantity(value):
    from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
    return format_quantity(value or 0)


__all__ = ["KINDS", "read", "link", "status", "TABLES", "row", "export", "columns", "ManifestObject"]
