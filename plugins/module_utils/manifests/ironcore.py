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
import os
import re

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.capabilities import MEGABYTE
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity
from ansible_collections.machinery.compute.plugins.module_utils.machines import oci
from ansible_collections.machinery.compute.plugins.module_utils.machines.named_images import is_reference
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import (
    APPLIED, refused, table, warned)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import (
    Fields, kube_quantity, powered_on, secret_value)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import (
    ManifestObject, columns, machine_object)

COMPUTE = "compute.ironcore.dev/v1alpha1"
STORAGE = "storage.ironcore.dev/v1alpha1"
NETWORKING = "networking.ironcore.dev/v1alpha1"
KINDS = {COMPUTE: ("Machine", "MachineClass", "MachinePool"), STORAGE: ("Volume",), NETWORKING: ("NetworkInterface",),
         "v1": ("Secret",)}
POWER = {"On": "running", "Off": "stopped"}
ARCHITECTURES = ("amd64", "x86_64")
# an ignitionRef without a key: IronCore's code reads "ignition.yaml" (computev1alpha1.DefaultIgnitionKey, and its
# sample Secret has that key); the seed document says "ignition". Both are read, IronCore's first.
DEFAULT_IGNITION_KEYS = ("ignition.yaml", "ignition")
ENCRYPTION_KEY = "encryptionKey"  # the key of an encryption.secretRef Secret, as IronCore documents it
# labels that keep how a Machine was written, so its export is written the same way: the NetworkInterface a NIC
# refers to, and a sized volume given as an ephemeral volumeTemplate rather than an emptyDisk
NIC_MARK = "nic.ironcore.machinery.compute/"
# the collection's firmware of an IronCore Machine, where IronCore has no field (docs/manifests.md, "Firmware")
FIRMWARE_ANNOTATION = "machinery.compute/firmware"
VOLUME_MARK = "volume.ironcore.machinery.compute/"
MACHINE_SPEC = ("machineClassRef", "machinePoolRef", "machinePoolSelector", "tolerations", "image", "volumes",
                "networkInterfaces", "ignitionRef", "power", "imagePullSecretRef", "imagePullSecret", "efiVars",
                "hostname", "guestConfig")

# --- what becomes of every field (conformance.py) ---------------------------------------------------------------

NO_PULL_SECRET = warned("images are read by the pools from a published name, a path or a URL: no pull secret")
DHCP_ONLY = warned("a libvirt network hands out addresses by DHCP from its own range: no virtual IPs, prefixes "
                   "or IP families")
EPHEMERAL_META = warned("an ephemeral resource is a device of its machine: its own metadata is not kept")
NO_VOLUME_CLASS = warned("a pool's storage has one class of volume (qcow2 in its storage pool): the class is "
                         "not applied")
NO_SNAPSHOTS = refused("volume snapshots are not supported: libvirt pools here keep no VolumeSnapshot to "
                       "restore a volume from; give dataSource.osImage (or image)")
NO_OCI_PULL = warned("a pull secret is for an image in an OCI registry; the images here are published names, paths "
                     "or URLs, read with no registry credentials: not applied")
STANDALONE_ENCRYPTION = refused("a standalone volume of a pool's storage is not encrypted here (machinery.compute."
                                "volume has no encryption); give the encrypted volume as a Machine's ephemeral "
                                "volumeTemplate, a LUKS volume keyed by the Secret's encryptionKey")
CLAIM = warned("IronCore sets it when a Machine claims the Volume; here the Machine using it is checked against "
               "it, and it is not kept")
VOLUME_SPEC = {
    "resources.storage": APPLIED, "resources.iops": APPLIED, "resources.tps": APPLIED,
    "image": APPLIED, "dataSource.osImage": APPLIED,
    "dataSource.osImage.image": APPLIED, "dataSource.osImage.architecture": APPLIED,
    "dataSource.snapshotRef": NO_SNAPSHOTS, "dataSource.volumeSnapshotRef": NO_SNAPSHOTS,
    "encryption.secretRef.name": APPLIED, "unclaimable": APPLIED,
    "volumeClassRef.name": NO_VOLUME_CLASS, "imagePullSecretRef.name": NO_OCI_PULL,
    "volumePoolSelector.*": warned("a volume goes to its volumePoolRef, else its machine's pool, else the first "
                                   "pool: no pool selector"),
    "tolerations": warned("a volume goes to its volumePoolRef, else its machine's pool: pool taints do not "
                          "apply to volumes"),
}
NIC_SPEC = {
    "networkRef.name": APPLIED, "ips": APPLIED, "ips[].value": APPLIED,
    "providerID": warned("set by the provider that made the NIC; a libvirt NIC is found by its machine and name: "
                         "not applied"),
    "attributes.*": warned("attributes pass settings to IronCore's network plugins; a libvirt network takes none: "
                           "not applied"),
    "ips[].ephemeral": DHCP_ONLY, "virtualIP": DHCP_ONLY, "prefixes": DHCP_ONLY, "ipFamilies": DHCP_ONLY,
}
RESOURCES = ("storage", "iops", "tps")  # IronCore's volume resource names
VOLUME_SPEC_KEYS = ("volumeClassRef", "volumePoolSelector", "resources", "image", "imagePullSecretRef",
                    "tolerations", "dataSource", "encryption", "unclaimable", "claimRef")
# machine option -> the Machine's field, for the core's problems (items: recorded per object in obj.where)
OPTION_PATHS = {"machine_class": "spec.machineClassRef.name", "image": "spec.image", "state": "spec.power",
                "machine_pool": "spec.machinePoolRef.name", "machine_pool_selector": "spec.machinePoolSelector",
                "tolerations": "spec.tolerations", "hostname": "spec.hostname", "ignition": "spec.ignitionRef",
                "labels": "metadata.labels", "name": "metadata.name", "volumes": "spec.volumes",
                "network_interfaces": "spec.networkInterfaces"}
EPHEMERAL_VOLUME = "spec.volumes[].ephemeral.volumeTemplate"
OTHER_CAPABILITY = ("a libvirt machine here is sized by cpu and memory alone: a class with another resource "
                    "(a GPU such as nvidia.com/gpu, which IronCore's libvirt-provider passes through as a PCI "
                    "device) cannot be honoured, and a machine of it would lack what its class promises")
EPHEMERAL_NIC = "spec.networkInterfaces[].ephemeral.networkInterfaceTemplate"
# libvirt-provider's localdisk plugin: an empty local disk of no (or zero) sizeLimit is 500Mi; one filled from an
# image is the image's rootfs copied as it is, whatever sizeLimit says
LOCAL_DISK_DEFAULT = 500 * 2 ** 20
LOCAL_DISK_LIMIT = ("not applied to a disk filled from an image: the disk is the image as it is, as IronCore's "
                    "libvirt-provider copies it; for a larger disk from an image use an ephemeral volumeTemplate "
                    "with the image and resources.storage")
FIELDS = {
    "Machine": table(dict(
        {"spec.machineClassRef.name": APPLIED, "spec.machinePoolRef.name": APPLIED,
         "spec.machinePoolSelector.*": APPLIED, "spec.tolerations[].key": APPLIED,
         "spec.tolerations[].operator": APPLIED, "spec.tolerations[].value": APPLIED,
         "spec.tolerations[].effect": APPLIED, "spec.image": APPLIED, "spec.imagePullSecretRef.name": NO_PULL_SECRET,
         "spec.imagePullSecret.name": APPLIED, "spec.guestConfig.hostname": APPLIED,
         "spec.volumes[].localDisk.sizeLimit": APPLIED, "spec.volumes[].localDisk.image": APPLIED,
         "spec.volumes[].name": APPLIED, "spec.volumes[].device": APPLIED, "spec.volumes[].volumeRef.name": APPLIED,
         "spec.volumes[].emptyDisk.sizeLimit": APPLIED, EPHEMERAL_VOLUME + ".metadata": EPHEMERAL_META,
         "spec.networkInterfaces[].name": APPLIED, "spec.networkInterfaces[].networkInterfaceRef.name": APPLIED,
         EPHEMERAL_NIC + ".metadata": EPHEMERAL_META,
         "spec.ignitionRef.name": APPLIED, "spec.ignitionRef.key": APPLIED, "spec.power": APPLIED,
         "spec.efiVars[].name": APPLIED, "spec.efiVars[].uuid": APPLIED, "spec.efiVars[].value": APPLIED,
         "spec.hostname": APPLIED, "metadata.annotations." + FIRMWARE_ANNOTATION: APPLIED},
        **{EPHEMERAL_VOLUME + ".spec." + key: verdict for key, verdict in VOLUME_SPEC.items()},
        **{EPHEMERAL_VOLUME + ".spec.claimRef." + key: CLAIM for key in ("name", "uid")},
        **{EPHEMERAL_VOLUME + ".spec.volumePoolRef.name": APPLIED,
           EPHEMERAL_NIC + ".spec.machineRef.name": APPLIED, EPHEMERAL_NIC + ".spec.machineRef.uid": APPLIED},
        **{EPHEMERAL_NIC + ".spec." + key: verdict for key, verdict in NIC_SPEC.items()})),
    "MachineClass": table({"capabilities.cpu": APPLIED, "capabilities.memory": APPLIED,
                           "capabilities.*": refused(OTHER_CAPABILITY)}),
    "MachinePool": table({
        "spec.providerID": warned("a MachinePool names a pool of the run by metadata.name; the pool's libvirt URI "
                                  "is its provider ID"),
        "spec.taints": warned("a pool's taints are set with machinery.compute.machine_pool (taints), not by a "
                              "MachinePool reference")}),
    "Volume": table(dict({"spec.volumePoolRef.name": APPLIED, "spec.claimRef.name": APPLIED,
                          "spec.claimRef.uid": APPLIED},
                         **{"spec." + key: verdict if key != "encryption.secretRef.name" else STANDALONE_ENCRYPTION
                            for key, verdict in VOLUME_SPEC.items()})),
    "NetworkInterface": table(dict({"spec.machineRef.name": APPLIED, "spec.machineRef.uid": APPLIED},
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
        # any other capability is refused with its reason by the table (capabilities.*)
        cpu = fields.run(check.cpu_amount, caps["cpu"], "capabilities.cpu") if "cpu" in caps else \
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
        fields.known(spec, ("networkRef", "ips", "machineRef", "virtualIP", "prefixes", "ipFamilies", "providerID",
                            "attributes"), "spec")
        network = fields.mapping(spec.get("networkRef"), "spec.networkRef", required=True) or {}
        owner = fields.mapping(spec.get("machineRef"), "spec.machineRef") or {}
        obj.role = "nic"
        obj.data = {"network": fields.string(network.get("name"), "spec.networkRef.name", required="networkRef" in spec),
                    "ip_address": fixed_address(fields, spec.get("ips"), "spec.ips"),
                    "machine": fields.name(owner.get("name"), "spec.machineRef.name") if owner else None,
                    "machine_uid": fields.string(owner.get("uid"), "spec.machineRef.uid") if owner else None}
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
    image = oci_image(image, fields, image_path)
    resources = fields.mapping(spec.get("resources"), "spec.resources", required=image is None) or {}
    fields.known(resources, RESOURCES, "spec.resources")
    size = None
    if "storage" in resources:
        size = kube_quantity(fields, resources.get("storage"), "spec.resources.storage")
    elif image is None:
        fields.error("spec.resources.storage", "required value")
    pool = fields.mapping(spec.get("volumePoolRef"), "spec.volumePoolRef") or {}
    obj.role = "volume"
    obj.data = {"name": obj.name, "size": size, "image": image, "image_path": image_path,
                "pool": fields.string(pool.get("name"), "spec.volumePoolRef.name") if pool else None,
                "unclaimable": bool(fields.boolean(spec.get("unclaimable"), "spec.unclaimable")),
                "claim": _uid_reference(fields, spec.get("claimRef"), "spec.claimRef")}
    qos = disk_qos(fields, resources, "spec.resources")
    if qos:
        obj.data["qos"] = qos
    fields.run(_attachable, obj.name, "metadata.name")


def disk_qos(fields, resources, path):
    """{iops, throughput} of an IronCore volume's ``resources``: ``iops`` (a quantity: ``3000``, ``3k``) is the
    disk's I/O operations per second, ``tps`` (bytes per second: ``200M``, ``1Gi``) its throughput, which the
    disk QoS here takes in whole MB/s (10^6 bytes): a rest is rounded down, with a warning. Both are limits of
    the disk (libvirt's iotune), in the ranges the collection's volumes take."""
    qos = {}
    for key, option, unit in (("iops", "iops", 1), ("tps", "throughput", MEGABYTE)):
        if resources.get(key) is None:
            continue
        where = "%s.%s" % (path, key)
        try:
            value = parse_quantity(resources[key], where)
        except ValidationError as exc:
            fields.error(where, exc.message)
            continue
        low, high = getattr(cap, option).range
        if not low <= value // unit <= high:
            fields.error(where, "must be between %s and %s (%s, the disk limits libvirt applies here), got %s"
                         % (low * unit, high * unit, "I/O operations per second" if unit == 1 else
                            "%d to %d MB/s" % (low, high), resources[key]))
            continue
        if value % unit:
            fields.warn(where, "%s bytes per second: the disk's throughput is limited in whole MB/s (10^6 bytes), "
                        "so to %d MB/s" % (value, value // unit))
        qos[option] = value // unit
    return qos


def _volume_image(spec, fields, prefix="spec"):
    """(image, the path it was given at) of a Volume's spec, or (None, None). ``dataSource.osImage`` is
    IronCore's OSImageSource (``{image: ...}``); a plain string is taken too."""
    source = fields.mapping(spec.get("dataSource"), prefix + ".dataSource") or {}
    fields.known(source, ("osImage", "snapshotRef", "volumeSnapshotRef"), prefix + ".dataSource")
    os_image, os_path = source.get("osImage"), prefix + ".dataSource.osImage"
    if isinstance(os_image, dict):
        fields.known(os_image, ("image", "architecture"), os_path)
        architecture = fields.string(os_image.get("architecture"), os_path + ".architecture")
        if architecture is not None and architecture not in ARCHITECTURES:
            fields.error(os_path + ".architecture", "%r: the pools here run %s guests (amd64, x86_64)"
                         % (architecture, "x86_64"))
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
    from ansible_collections.machinery.compute.plugins.module_utils.core import storage
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
        params["image"] = oci_image(fields.string(spec.get("image"), "spec.image"), fields, "spec.image")
    pull = fields.mapping(spec.get("imagePullSecret"), "spec.imagePullSecret")
    if pull:
        fields.known(pull, ("name",), "spec.imagePullSecret")
        refs_pull = ("spec.imagePullSecret.name", fields.name(pull.get("name"), "spec.imagePullSecret.name"))
    else:
        refs_pull = None
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
    refs = {"class": params["machine_class"], "volumes": [], "nics": [], "secret": None, "pull": refs_pull}
    params["volumes"] = []
    seen = set()
    template_pools = []  # (path, pool) of the ephemeral volumes' volumePoolRef
    for index, item in fields.items(spec.get("volumes"), "spec.volumes"):
        where = "spec.volumes[%d]" % index
        fields.known(item, ("name", "device", "volumeRef", "emptyDisk", "localDisk", "ephemeral"), where)
        name = fields.name(item.get("name"), where + ".name")
        if name in seen:
            fields.error(where + ".name", "duplicate name %r" % name)
        seen.add(name)
        sources = [key for key in ("volumeRef", "emptyDisk", "localDisk", "ephemeral") if key in item]
        if len(sources) != 1:
            fields.error(where, "give exactly one of volumeRef, emptyDisk, localDisk or ephemeral")
            continue
        entry = {"name": name}
        if item.get("device"):
            entry["device"] = virtio_device(str(item["device"]), bool(params.get("image")))
        if "volumeRef" in item:
            ref = fields.mapping(item["volumeRef"], where + ".volumeRef", required=True) or {}
            entry["volume"] = fields.name(ref.get("name"), where + ".volumeRef.name")
            refs["volumes"].append((where + ".volumeRef.name", entry["volume"]))
        elif "localDisk" in item:
            # v0.5: a disk of the pool host's own storage that lives and dies with the machine, sized as
            # libvirt-provider's localdisk plugin sizes it: one filled from an OS image is that image as it is,
            # an empty one is sizeLimit large, or LOCAL_DISK_DEFAULT when sizeLimit is unset or zero
            disk = fields.mapping(item["localDisk"], where + ".localDisk", required=True) or {}
            fields.known(disk, ("sizeLimit", "image"), where + ".localDisk")
            image = fields.string(disk.get("image"), where + ".localDisk.image")
            limit = disk.get("sizeLimit")
            if image is not None:
                entry["image"] = oci_image(image, fields, where + ".localDisk.image")
                obj.where["volumes[%d].image" % len(params["volumes"])] = where + ".localDisk.image"
                if limit is not None and not _is_zero(limit):
                    kube_quantity(fields, limit, where + ".localDisk.sizeLimit")  # still a quantity, or refused
                    fields.warn(where + ".localDisk.sizeLimit", LOCAL_DISK_LIMIT)
            elif limit is None or _is_zero(limit):
                entry["size"] = LOCAL_DISK_DEFAULT
            else:
                entry["size"] = kube_quantity(fields, limit, where + ".localDisk.sizeLimit")
                obj.where["volumes[%d].size" % len(params["volumes"])] = where + ".localDisk.sizeLimit"
            entry["ephemeral"] = True
            if name:
                params["labels"][VOLUME_MARK + name] = "local"
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
            fields.known(spec_of, VOLUME_SPEC_KEYS + ("volumePoolRef",), at + ".spec")
            image, image_path = _volume_image(spec_of, fields, at + ".spec")
            resources = fields.mapping(spec_of.get("resources"), at + ".spec.resources") or {}
            fields.known(resources, RESOURCES, at + ".spec.resources")
            for option, value in disk_qos(fields, resources, at + ".spec.resources").items():
                entry[option] = value
                obj.where["volumes[%d].%s" % (len(params["volumes"]), option)] = "%s.spec.resources.%s" % (
                    at, "iops" if option == "iops" else "tps")
            volume_pool = fields.mapping(spec_of.get("volumePoolRef"), at + ".spec.volumePoolRef")
            if volume_pool is not None:
                fields.known(volume_pool, ("name",), at + ".spec.volumePoolRef")
                named = fields.string(volume_pool.get("name"), at + ".spec.volumePoolRef.name", required=True)
                if named:
                    template_pools.append((at + ".spec.volumePoolRef.name", named))
            secret = ((fields.mapping(spec_of.get("encryption"), at + ".spec.encryption") or {}).get("secretRef")
                      or {})
            if secret:
                refs.setdefault("encryption", []).append(
                    (at + ".spec.encryption.secretRef", secret.get("name"), len(params["volumes"])))
                entry["encrypted"] = True
            if fields.boolean(spec_of.get("unclaimable"), at + ".spec.unclaimable"):
                fields.error(at + ".spec.unclaimable", "true: the volume could not be claimed by this Machine, "
                             "whose ephemeral volume it is")
            if image:
                entry["image"] = oci_image(image, fields, image_path)
                obj.where["volumes[%d].image" % len(params["volumes"])] = image_path
                if resources.get("storage") is not None:  # the disk's size, filled from the image (IronCore's)
                    entry["size"] = kube_quantity(fields, resources.get("storage"), at + ".spec.resources.storage")
                    obj.where["volumes[%d].size" % len(params["volumes"])] = at + ".spec.resources.storage"
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
            fields.known(nic_spec, ("networkRef", "ips", "virtualIP", "prefixes", "ipFamilies", "providerID",
                                    "attributes", "machineRef"), at + ".spec")
            _template_owner(obj, fields, nic_spec.get("machineRef"), at + ".spec.machineRef")
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
                          fields.string(ignition.get("key"), "spec.ignitionRef.key"))
    if spec.get("hostname") is not None:
        params["hostname"] = fields.run(check.hostname, spec["hostname"], "spec.hostname")
    guest = fields.mapping(spec.get("guestConfig"), "spec.guestConfig") or {}
    fields.known(guest, ("hostname",), "spec.guestConfig")
    if guest.get("hostname") is not None:  # v0.5's place for it
        if params.get("hostname") not in (None, guest["hostname"]):
            fields.error("spec.guestConfig.hostname", "differs from spec.hostname; give one of them")
        params["hostname"] = fields.run(check.hostname, guest["hostname"], "spec.guestConfig.hostname")
        obj.where["hostname"] = "spec.guestConfig.hostname"
    _efi_vars(obj, spec, params, fields)
    _firmware(obj, params, refs, fields)
    pool_path = _volume_pools(params, template_pools, fields)
    where_hostname = obj.where.get("hostname")
    obj.where.update(OPTION_PATHS)
    if where_hostname:
        obj.where["hostname"] = where_hostname
    if pool_path:
        obj.where["machine_pool"] = pool_path
    if refs.get("firmware_path"):
        obj.where["firmware"] = refs["firmware_path"]
    machine_object(obj, params, refs)


def _volume_pools(params, template_pools, fields):
    """An ephemeral volume's ``volumePoolRef``: the pool whose storage holds it, which is its Machine's (a
    machine's disks are in its own pool's storage). It places the Machine there when nothing else does, and is
    refused when it names another pool than the Machine's (or than another ephemeral volume's). The path that
    placed the machine, or None."""
    placed = None
    for path, pool in template_pools:
        if params.get("machine_pool") is None:
            params["machine_pool"], placed = pool, path
        elif params["machine_pool"] != pool:
            fields.error(path, "%r: an ephemeral volume is made in the storage of its Machine's pool, and the "
                         "Machine is on %r (%s)" % (pool, params["machine_pool"], placed or "spec.machinePoolRef.name"))
    return placed


def _template_owner(obj, fields, value, path):
    """An ephemeral NIC template's ``machineRef`` (IronCore sets it to the Machine that owns the NIC): it must be
    this Machine, by name and, when both are given, by uid."""
    owner = fields.mapping(value, path)
    if not owner:
        return
    fields.known(owner, ("name", "uid"), path)
    name = fields.string(owner.get("name"), path + ".name")
    if name is not None and name != obj.name:
        fields.error(path + ".name", "%r: an ephemeral NetworkInterface belongs to the Machine whose template makes "
                     "it, %s" % (name, obj.name))
    uid = fields.string(owner.get("uid"), path + ".uid")
    own = (obj.doc.get("metadata") or {}).get("uid")
    if uid is not None and own is not None and uid != own:
        fields.error(path + ".uid", "%r is not this Machine's metadata.uid (%r)" % (uid, own))
    elif uid is not None and own is None:
        fields.warn(path + ".uid", "the Machine has no metadata.uid in these documents to check %r against: not "
                    "checked (a machine here is known by its name)" % uid)


def link_volume(obj, objects, fields, _pools=None):
    """A standalone Volume's ``resources.iops`` and ``tps`` are limits of a disk: they go to the disk of each
    Machine of the documents that attaches the Volume (its ``volumeRef``); with none, they are not applied."""
    qos = obj.data.get("qos") or {}
    if not qos:
        return
    users = 0
    for other in objects.values():
        if other.dialect is not obj.dialect or other.role != "machine":
            continue
        for entry in other.params.get("volumes") or []:
            if entry.get("volume") == obj.name:
                for option, value in qos.items():
                    entry.setdefault(option, value)
                users += 1
    if not users:
        for key in ("iops", "tps"):
            if (obj.doc.get("spec") or {}).get("resources", {}).get(key) is not None:
                fields.warn("spec.resources." + key, "a limit of the disk a Machine attaches the Volume as (libvirt's "
                            "iotune); no Machine of these documents attaches it: not applied")


def _boots_oci(params):
    """Whether the machine boots an OCI image: its image, or (with none) the first of its volumes made from one."""
    if params.get("image"):
        return oci.is_oci(params["image"])
    first = next((vol for vol in params.get("volumes") or [] if vol.get("image")), None)
    return bool(first) and oci.is_oci(first["image"])


def _firmware(obj, params, refs, fields):
    """The firmware of a new machine. A Machine that boots an OCI image (what IronCore's tools build and its
    libvirt-provider boots, always with UEFI: gardenlinux' layout has an EFI system partition) boots UEFI, and so
    does one with efiVars; one that boots a published image, a path, a URL or a volume keeps the collection's
    default, BIOS (the form the collection's own documents have used, whose images may boot BIOS only).
    IronCore has no firmware field: the collection's ``firmware`` is given by the annotation
    ``machinery.compute/firmware`` (bios or uefi), which a Machine with efiVars cannot set to bios. The default is
    for new machines only (link): an existing machine keeps the firmware it was made with."""
    annotations = (obj.doc.get("metadata") or {}).get("annotations") or {}
    given = annotations.get(FIRMWARE_ANNOTATION) if isinstance(annotations, dict) else None
    path = "metadata.annotations." + FIRMWARE_ANNOTATION
    if given is not None:
        chosen = fields.string(given, path, choices=options.FIRMWARES)
        if chosen and params.get("firmware") and chosen != params["firmware"]:
            fields.error(path, "%s: the Machine's efiVars are UEFI variables, which only UEFI firmware holds"
                         % chosen)
        elif chosen:
            params["firmware"] = chosen
            obj.where["firmware"] = refs["firmware_path"] = path
        return
    if not params.get("firmware") and _boots_oci(params):
        params["firmware"] = "uefi"
        refs["firmware_default"] = True


def _efi_vars(obj, spec, params, fields):
    """spec.efiVars: the machine's efi_vars (IronCore's ``uuid`` is the vendor GUID). EFI variables live in UEFI
    firmware, so a Machine that gives them is a UEFI machine (IronCore has no firmware field of its own)."""
    entries, seen = [], {}
    for index, item in fields.items(spec.get("efiVars"), "spec.efiVars"):
        where = "spec.efiVars[%d]" % index
        fields.known(item, ("name", "uuid", "value"), where)
        try:
            entry = efi.check_entry({"name": item.get("name"), "guid": item.get("uuid"), "value": item.get("value")},
                                    where, {"guid": "uuid"})
        except ValidationError as exc:
            fields.error(exc.field, exc.message)
            continue
        key = (entry["guid"], entry["name"])
        if key in seen:
            fields.error(where + ".name", "variable %s of vendor %s is given twice (also as %s)"
                         % (entry["name"], entry["guid"], seen[key]))
            continue
        seen[key] = where
        entries.append(entry)
    if spec.get("efiVars"):
        params["efi_vars"] = entries
        params["firmware"] = "uefi"
        obj.where["efi_vars"] = obj.where["firmware"] = "spec.efiVars"


def _exists(obj, pools):
    """Whether the Machine is already a machine of the pools (on its pinned pool when it has one)."""
    pinned = obj.params.get("machine_pool")
    return any(machine.get("name") == obj.name and (pinned is None or machine.get("pool") == pinned)
               for machine in getattr(pools, "machines", None) or [])


def link(obj, objects, fields, _pools=None):
    """Resolve a Machine's references to the other documents: its NetworkInterfaces and ignition Secret (which
    must be among the documents) and its Volumes (in the documents, or already in the pool's storage)."""
    refs = obj.refs
    if refs.get("firmware_default") and _exists(obj, _pools):
        obj.params.pop("firmware", None)  # fixed at creation: an existing machine keeps its own (BIOS, made before)
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
        _check_uid(found, found.data.get("machine_uid"), obj, "spec.machineRef.uid", fields)
    if refs.get("secret"):
        path, name, key = refs["secret"]
        secret = objects.get(("Secret", name))
        if secret is None:
            fields.error(path + ".name", "Secret %r is not among the documents" % name)
        else:
            key = key or _ignition_key(secret.doc)
            text = secret_value(fields, secret.doc, key, path + ".key")
            if text is not None:
                obj.params["ignition"] = _ignition_document(fields, text, key, path)
    if refs.get("pull"):
        path, name = refs["pull"]
        secret = objects.get(("Secret", name))
        images = [obj.params.get("image")] + [vol.get("image") for vol in obj.params.get("volumes") or []]
        registries = {image[len("oci://"):].split("/", 1)[0] for image in images
                      if isinstance(image, str) and image.startswith("oci://")}
        if secret is None:
            fields.error(path, "Secret %r is not among the documents" % name)
        elif not registries:
            fields.warn(path, "the Machine's images are no OCI references: a pull secret has nothing to pull; "
                              "not applied")
        else:
            credentials = pull_credentials(fields, secret.doc, sorted(registries)[0], path)
            if credentials:
                obj.params["image_pull_secret"] = credentials
    for path, name, index in refs.get("encryption") or []:
        secret = objects.get(("Secret", name))
        if secret is None:
            fields.error(path + ".name", "Secret %r is not among the documents" % name)
            continue
        passphrase = secret_value(fields, secret.doc, ENCRYPTION_KEY, path + ".name")
        if passphrase is not None:
            obj.params["volumes"][index]["passphrase"] = passphrase
    for path, name in refs.get("volumes") or []:
        volume = objects.get(("Volume", name))
        if volume is None:
            continue
        if volume.data.get("unclaimable"):
            fields.error(path, "Volume %r is unclaimable (its spec.unclaimable): no Machine may claim it" % name)
        claim = volume.data.get("claim") or {}
        if claim.get("name") and claim["name"] != obj.name:
            fields.error(path, "Volume %r is claimed by Machine %r (its spec.claimRef)" % (name, claim["name"]))
        elif claim.get("name"):
            _check_uid(volume, claim.get("uid"), obj, "spec.claimRef.uid", fields)


def pull_credentials(fields, secret, registry, path):
    """{username, password} for ``registry`` from a pull Secret: a ``kubernetes.io/dockerconfigjson`` one
    (``.dockerconfigjson``: auths by registry, each with username and password or ``auth``, base64 of
    user:password), or one with ``username`` and ``password`` keys (``kubernetes.io/basic-auth``)."""
    import base64
    for part in ("stringData", "data"):
        if isinstance(secret.get(part), dict) and ".dockerconfigjson" in secret[part]:
            text = secret_value(fields, secret, ".dockerconfigjson", path)
            try:
                auths = json.loads(text or "").get("auths") or {}
            except (ValueError, AttributeError):
                fields.error(path, "the secret's .dockerconfigjson is not JSON with auths")
                return None
            names = [registry, "https://" + registry]
            if registry == oci.DEFAULT_REGISTRY:  # Docker Hub's entry as docker login writes it
                names += ["https://index.docker.io/v1/", oci.LEGACY_REGISTRY, oci.api_host(registry)]
            entry = next((auths[name] for name in names if isinstance(auths.get(name), dict)), None)
            if not isinstance(entry, dict):
                fields.error(path, "the secret's .dockerconfigjson has no auths entry for %s (it has %s)"
                             % (registry, ", ".join(sorted(auths)) or "none"))
                return None
            if entry.get("username"):
                return {"username": entry["username"], "password": entry.get("password") or ""}
            try:
                user, _sep, password = base64.b64decode(entry.get("auth") or "").decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, password = "", ""
            if not user:
                fields.error(path, "the secret's auths entry for %s has no username/password or auth" % registry)
                return None
            return {"username": user, "password": password}
    username = secret_value(fields, secret, "username", path)
    password = secret_value(fields, secret, "password", path)
    return {"username": username, "password": password} if username is not None and password is not None else None


def _ignition_key(secret):
    """The key an ignitionRef without one reads: IronCore's ``ignition.yaml`` when the Secret has it, else the
    seed's ``ignition``, else IronCore's (whose absence is then reported)."""
    for key in DEFAULT_IGNITION_KEYS:
        for part in ("stringData", "data"):
            if isinstance(secret.get(part), dict) and key in secret[part]:
                return key
    return DEFAULT_IGNITION_KEYS[0]


def _ignition_document(fields, text, key, path):
    """An Ignition config, JSON as Ignition writes it (IronCore's ``ignition.yaml`` holds JSON too), or YAML."""
    try:
        return json.loads(text)
    except ValueError as exc:
        import yaml
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError:
            document = None
        if isinstance(document, dict) and "ignition" in document:
            return document
        fields.error(path, "the secret's %s is no Ignition config (neither JSON nor YAML with an ignition key): %s"
                     % (key, exc))
        return None


def _check_uid(target, uid, machine, path, fields):
    """A reference's uid (a NetworkInterface's machineRef, a Volume's claimRef) against the Machine document's own
    metadata.uid: a mismatch names a different Machine of the same name and is refused; without a uid on the
    Machine there is nothing to check it against, which is said."""
    if not uid:
        return
    own = (machine.doc.get("metadata") or {}).get("uid")
    target_fields = Fields(fields.problems, target.ref)
    if own is None:
        target_fields.warn(path, "Machine %s has no metadata.uid in these documents to check %r against: not "
                           "checked (a machine here is known by its name)" % (machine.name, uid))
    elif own != uid:
        target_fields.error(path, "%r is not the uid of Machine %s (%r): it refers to another Machine of that name"
                            % (uid, machine.name, own))


def _uid_reference(fields, value, path):
    ref = fields.mapping(value, path) or {}
    fields.known(ref, ("name", "uid"), path)
    return {"name": fields.string(ref.get("name"), path + ".name"),
            "uid": fields.string(ref.get("uid"), path + ".uid")} if ref else None


def oci_image(text, fields=None, path=None):
    """An image reference of an IronCore document as IronCore's puller reads it: an OCI reference normalized as
    containerd does (oci.normalize: ``gardenlinux:rootfs-image`` is ``docker.io/library/gardenlinux:rootfs-image``,
    ``foo/bar`` ``docker.io/foo/bar:latest``, a missing tag ``latest``), the collection's ``oci://`` image. Kept as
    they are: a URL, a path (``/...``, ``./...``), a file that exists, and a bare name with no tag
    (``my-image``), which is an image published on the pools (docs/manifests.md). A reference that cannot be
    normalized is refused under ``path`` (None is returned)."""
    if not isinstance(text, str) or text.startswith(("/", ".")):
        return text
    if "://" in text and not oci.is_oci(text):
        return text
    if not oci.is_oci(text) and (is_reference(text) or os.path.isfile(text)):
        return text
    try:
        return oci.SCHEME + oci.normalize(text, path or "image")
    except MachineryError as exc:
        if fields is not None:
            fields.error(path, exc.message)
        return None


def ironcore_reference(image):
    """An image as an IronCore document writes it: an OCI reference with no scheme, anything else as it is."""
    return image[len(oci.SCHEME):] if oci.is_oci(image) else image


def virtio_device(device, after_image=False):
    """A Machine's volume device as a virtio disk name: IronCore's admission names them ``oda``, ``odb``... and its
    libvirt-provider makes each ``v`` + the rest (``vda``); a single letter is ``vd`` + it. With ``spec.image``
    the image is the machine's disk ``vda`` here, so IronCore's names move one letter on (``oda`` is ``vdb``)."""
    if len(device) == 1:
        device = "od" + device
    if not device.startswith("od") or len(device) != 3 or not "a" <= device[2] <= "y":
        return device
    return "vd" + (chr(ord(device[2]) + 1) if after_image else device[2])


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
    marks = {key[len(VOLUME_MARK):]: labels.pop(key) for key in list(labels) if key.startswith(VOLUME_MARK)}
    templates = {name for name, how in marks.items() if how == "template"}
    local = {name for name, how in marks.items() if how == "local"}
    spec = {"machineClassRef": {"name": machine.get("machine_class")},
            "image": ironcore_reference(machine.get("image")),
            "machinePoolRef": {"name": machine.get("pool")},
            "power": "On" if powered_on(machine) else "Off"}
    if not spec["image"]:
        del spec["image"]  # a machine that boots from its first volume
    volumes = []
    for vol in record_spec.get("volumes") or []:
        if vol.get("source") == "volume":
            volumes.append({"name": vol["name"], "volumeRef": {"name": vol["volume"]}})
        elif vol["name"] in local:
            if vol.get("source") == "image":  # the image's own size: sizeLimit would not be applied
                disk = {"image": ironcore_reference((vol.get("image") or {}).get("source"))}
            else:
                disk = {"sizeLimit": _quantity(vol.get("size"))}
            volumes.append({"name": vol["name"], "localDisk": disk})
        elif vol.get("source") == "image":
            template = {"image": ironcore_reference((vol.get("image") or {}).get("source"))}
            if vol.get("size"):
                template["resources"] = {"storage": _quantity(vol["size"])}
            volumes.append({"name": vol["name"], "ephemeral": {"volumeTemplate": {"spec": template}}})
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
    if record_spec.get("efi_vars"):
        spec["efiVars"] = [{"name": entry["name"], "uuid": entry["guid"], "value": entry["value"]}
                           for entry in record_spec["efi_vars"]]
    # the firmware when it is not the one the exported Machine would get by default: a re-apply makes the same
    firmware = record_spec.get("firmware") or "bios"
    default = "uefi" if record_spec.get("efi_vars") or _boots_oci(
        {"image": machine.get("image"), "volumes": [{"image": (vol.get("image") or {}).get("source")}
                                                    for vol in record_spec.get("volumes") or []
                                                    if vol.get("source") == "image"]}) else "bios"
    annotations = {FIRMWARE_ANNOTATION: firmware} if firmware != default else {}
    if not machine.get("machine_class"):
        del spec["machineClassRef"]
    metadata = {"name": machine["name"]}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return [{"apiVersion": COMPUTE, "kind": "Machine", "metadata": metadata, "spec": spec}] + interfaces


def _is_zero(value):
    """Whether a quantity is zero (0, "0", "0Gi", "0.0"): what Go's resource.Quantity.Value() makes 0 bytes."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value == 0
    return isinstance(value, str) and re.match(r"^0+(\.0*)?([KMGTPE]i|[mkMGTPE])?$", value.strip()) is not None


def _quantity(value):
    from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
    return format_quantity(value or 0)


__all__ = ["KINDS", "read", "link", "status", "TABLES", "row", "export", "columns", "ManifestObject"]
