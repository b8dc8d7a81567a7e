# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vitistack: vitistack.io/v1alpha1 Machine and MachineClass, both generations of the Machine CRD.

The first generation (vitistack/crds, the seed) names the size ``instanceType`` and the provider
``providerConfig.name``; the current one (vitistack/common) names a ``MachineClass`` object ``machineClass`` and
the provider ``provider``, and adds ``cloudInit``, ``os.isoUri``, ``network.networkNamespaceName``,
``disks[].device`` and ``machineType``. Both apply: a document using a field only the current generation has is
read by the current CRD (``provider`` required), any other by the first (nothing required).

``spec.name`` is the guest's host name; the class is a machine class (named as written: ``t3.medium``); a
``MachineClass`` document publishes one (cores x sockets x threads vCPUs, ``memory.quantity``); ``provider``
must be among the providers the run serves (the manifest option ``providers``); ``os.imageID`` is a published
image or an image URL (the kubevirt operator's use), ``os.isoUri`` an image URL too; without an image the
machine boots an empty root disk, as the kubevirt operator's machines do (their network boot is warned about);
``disks[].type`` is the bus; ``cloudInit`` is the NoCloud seed. What has no meaning on libvirt is warned about
with the reason (conformance tables below); what cannot be done is refused with the reason.
"""

from __future__ import annotations

import base64
import binascii
import re

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import (
    APPLIED, refused, table, warned)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import kube_quantity, secret_value
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import columns, machine_object
from ansible_collections.machinery.compute.plugins.module_utils.manifests.pending import refuse_pending
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity

API = "vitistack.io/v1alpha1"
KINDS = {API: ("Machine", "MachineClass"), "v1": ("ConfigMap",)}
# vitistack's default provider (DefaultMachineProviderType in vitistack/common) for a first-generation document
# that names none
DEFAULT_PROVIDER = "kubevirt"
OS_FAMILIES = ("linux", "windows")
ARCHITECTURES = ("amd64", "arm64", "x86_64")
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABEL = "topology.kubernetes.io/zone"
MIN_MEMORY = 16 * 2 ** 20
GIB = 2 ** 30
# the kubevirt operator's size for a machine naming no class (defaultMachineClassValues), and its root disk when
# the document gives no disks
DEFAULT_CPU = 2
DEFAULT_MEMORY = 2 * GIB
DEFAULT_ROOT_GB = 10
BOOT_VOLUME = "boot"
# disks[].type as the kubevirt operator reads it (determineBusType): sata and scsi are buses, nvme and every
# other value virtio; a cloud's volume type (gp3, pd-ssd, Premium_LRS) is warned about, the bus stays virtio
BUSES = {"virtio": "virtio", "sata": "sata", "scsi": "scsi", "nvme": "virtio"}
SPEC = ("name", "instanceType", "machineClass", "machineType", "provider", "os", "providerConfig", "cpu",
        "memory", "disks", "network", "sshKeys", "userData", "tags", "securityGroups", "monitoring", "backup",
        "cloudInit")
# fields only the current generation has: a document using one is read by the current CRD
CURRENT_ONLY = ("machineClass", "provider", "cloudInit")
CLASS_PATH = "spec.instanceType"
BACKUPS_IN_STATUS = True  # the engine reads each machine's list of backups for BackupReady
POOL_PATH = "spec.providerConfig.region"
NO_PUBLIC = warned("libvirt networks have no public addresses: not applied")
ONE_SUBNET = warned("a libvirt network is one subnet (spec.network.vpc): not applied")
FIELDS = {"Machine": table({
    "spec.name": APPLIED, "spec.instanceType": APPLIED, "spec.machineClass": APPLIED, "spec.provider": APPLIED,
    "spec.machineType": warned("a provider's machine type override; the libvirt machine type is the newest q35 "
                               "the pool offers, chosen by the collection: not applied"),
    "spec.os.family": APPLIED, "spec.os.distribution": APPLIED,
    "spec.os.version": APPLIED, "spec.os.architecture": APPLIED, "spec.os.imageID": APPLIED,
    "spec.os.isoUri": APPLIED,
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
    "spec.disks[].type": APPLIED, "spec.disks[].device": APPLIED,
    "spec.network.vpc": APPLIED, "spec.network.privateIP": APPLIED, "spec.network.subnet": ONE_SUBNET,
    "spec.network.networkNamespaceName": warned(
        "names a vitistack NetworkNamespace (VLAN and IP prefix kept by vitistack's network operators), which "
        "libvirt pools do not have: not applied; the NICs join spec.network.vpc"),
    "spec.network.assignPublicIP": NO_PUBLIC, "spec.network.publicIP": NO_PUBLIC,
    "spec.network.interfaces[].name": APPLIED, "spec.network.interfaces[].primary": APPLIED,
    "spec.network.interfaces[].securityGroups": APPLIED, "spec.network.interfaces[].subnet": ONE_SUBNET,
    "spec.sshKeys": APPLIED, "spec.userData": APPLIED, "spec.tags.*": APPLIED, "spec.securityGroups": APPLIED,
    "spec.monitoring": warned("has no meaning on libvirt pools and is ignored"),
    "spec.backup": warned("backups run on a schedule outside the pools: see docs/manifests.md for the AWX/cron "
                          "recipe and machinery.compute.machine_backup for the retention"),
    "spec.cloudInit.type": APPLIED, "spec.cloudInit.userData": APPLIED, "spec.cloudInit.userDataBase64": APPLIED,
    "spec.cloudInit.networkData": APPLIED, "spec.cloudInit.networkDataBase64": APPLIED,
    "spec.cloudInit.userDataSecretRef.name": APPLIED, "spec.cloudInit.userDataSecretRef.key": APPLIED,
    "spec.cloudInit.networkDataSecretRef.name": APPLIED, "spec.cloudInit.networkDataSecretRef.key": APPLIED,
    "spec.cloudInit.userDataConfigMapRef.name": APPLIED, "spec.cloudInit.userDataConfigMapRef.key": APPLIED,
    "spec.cloudInit.networkDataConfigMapRef.name": APPLIED, "spec.cloudInit.networkDataConfigMapRef.key": APPLIED,
}), "MachineClass": table({
    "spec.enabled": APPLIED, "spec.cpu.cores": APPLIED, "spec.cpu.sockets": APPLIED, "spec.cpu.threads": APPLIED,
    "spec.memory.quantity": APPLIED,
    "spec.memory.minQuantity": warned("a libvirt guest has one memory size (spec.memory.quantity); no range is "
                                      "kept: not applied"),
    "spec.memory.maxQuantity": warned("a libvirt guest has one memory size (spec.memory.quantity); no range is "
                                      "kept: not applied"),
    "spec.default": warned("the kubevirt operator gives a machine naming no class its own default size (2 cores, "
                           "2Gi), not a default class, and so does this run: not applied"),
    "spec.category": warned("a catalogue field for vitistack's UI; a published class keeps cpu and memory: "
                            "not applied"),
    "spec.description": warned("a catalogue field for vitistack's UI; a published class keeps cpu and memory: "
                               "not applied"),
    "spec.displayName": warned("a catalogue field for vitistack's UI; a published class keeps cpu and memory: "
                               "not applied"),
    "spec.machineProviders": warned("lists the providers that offer the class; the kubevirt operator does not "
                                    "check it either, and the class is published on every pool of the run: not "
                                    "applied"),
    "spec.gpu.cores": refused("GPUs are not passed through to machines by this collection: a class with GPU "
                              "cores cannot be honoured"),
    "spec.gpu.manufacturer": warned("names the GPU maker of spec.gpu.cores; with no GPU cores it has no effect"),
}), "ConfigMap": table({
    "data.*": APPLIED, "binaryData.*": warned("only text keys hold cloud-init data: not applied"),
    "immutable": warned("the pools keep no ConfigMaps: it is read in this run only")})}
OPTION_PATHS = {"image": "spec.os", "cpu": "spec.cpu", "topology": "spec.cpu",
                "memory": "spec.memory", "root_size": "spec.disks", "volumes": "spec.disks",
                "network_interfaces": "spec.network", "ssh_authorized_keys": "spec.sshKeys",
                "cloud_init": "spec.userData", "labels": "spec.tags", "machine_pool_selector": "spec.providerConfig",
                "hostname": "spec.name", "name": "metadata.name"}
_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")
_DEVICE = re.compile(r"^(/dev/)?(?P<name>(vd|sd)[a-z]{1,2})$")


def read(obj, fields):
    if obj.kind == "MachineClass":
        return read_class(obj, fields)
    if obj.kind == "ConfigMap":
        fields.known(obj.doc, ("apiVersion", "kind", "metadata", "data", "binaryData", "immutable"), "")
        fields.mapping(obj.doc.get("data"), "data")
        obj.role = "config"
        return None
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, SPEC, "spec")
    os_value = spec.get("os") if isinstance(spec.get("os"), dict) else {}
    network_value = spec.get("network") if isinstance(spec.get("network"), dict) else {}
    current = any(key in spec for key in CURRENT_ONLY) or "isoUri" in os_value \
        or "networkNamespaceName" in network_value
    params = {"name": obj.name}
    if spec.get("name") is not None:
        # the machine's own name: its guest's host name (cloud-init, Ignition), apart from the object's name
        host = fields.string(spec.get("name"), "spec.name")
        if host:
            params["hostname"] = fields.run(check.hostname, host, "spec.name")
    params["machine_class"], class_path = machine_class(fields, spec)
    obj.data["class_path"] = class_path
    _provider(fields, spec, params, obj, current)
    refs = {"class": params["machine_class"], "volumes": [], "os": _os(fields, spec.get("os"))}
    if params["machine_class"] is None:
        # no class: the kubevirt operator's own default size, unless the document gives cpu and memory
        params["cpu"], params["memory"] = DEFAULT_CPU, DEFAULT_MEMORY
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
    # an image: named, fetched from a URL, or the published one whose os matches
    has_image = any(os_value.get(key) for key in ("imageID", "isoUri", "family", "distribution", "version"))
    _disks(fields, spec.get("disks"), params, has_image)
    obj.data["boot_image_volume"] = params.pop("boot_image_volume", False)
    _network(fields, spec.get("network"), spec.get("securityGroups"), params)
    keys = fields.strings(spec.get("sshKeys"), "spec.sshKeys")
    if keys:
        params["ssh_authorized_keys"] = keys
    if spec.get("userData") is not None and spec.get("cloudInit") is not None:
        fields.error("spec.userData", "give the user data once: spec.userData or spec.cloudInit")
    elif spec.get("userData") is not None:
        if fields.string(spec.get("userData"), "spec.userData"):
            params["cloud_init"] = {"user_data": spec["userData"]}
            if keys and not spec["userData"].lstrip().startswith("#cloud-config"):
                # a script and keys: cloud-init takes both as a MIME multipart (keys in a cloud-config part)
                params["cloud_init"] = {"user_data": multipart(keys, spec["userData"])}
                del params["ssh_authorized_keys"]
    refs["cloud_init"] = _cloud_init(fields, spec.get("cloudInit"))
    tags = fields.mapping(spec.get("tags"), "spec.tags")
    labels = dict(obj.labels)
    if tags:
        labels.update(fields.run(check.labels, tags, "spec.tags") or {})
    params["labels"] = labels
    fields.boolean(spec.get("monitoring"), "spec.monitoring")
    if spec.get("machineType") is not None:
        fields.string(spec.get("machineType"), "spec.machineType")
    _backup(fields, spec.get("backup"))
    refuse_pending(fields, params, {
        ("topology",): "spec.cpu (sockets or threadsPerCore above 1)",
        ("volumes", "iops"): "spec.disks[].iops", ("volumes", "throughput"): "spec.disks[].throughput",
        ("volumes", "encrypted"): "spec.disks[].encrypted",
        ("network_interfaces", "ip_address"): "spec.network.privateIP",
        ("network_interfaces", "security_groups"): "spec.securityGroups / spec.network.interfaces[].securityGroups"})
    obj.where.update(OPTION_PATHS)
    obj.where["machine_class"] = class_path
    for index, volume in enumerate(params.get("volumes") or []):
        obj.where["volumes[%d]" % index] = volume.pop("at")
    for index, nic in enumerate(params.get("network_interfaces") or []):
        obj.where["network_interfaces[%d]" % index] = nic.pop("at")
    machine_object(obj, params, refs)
    return None


def read_class(obj, fields):
    """A vitistack MachineClass onto a machine class: cores x sockets x threads vCPUs, memory.quantity."""
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, ("enabled", "default", "category", "memory", "cpu", "machineProviders", "gpu", "description",
                        "displayName"), "spec")
    cpu = fields.mapping(spec.get("cpu"), "spec.cpu", required=True) or {}
    fields.known(cpu, ("cores", "sockets", "threads"), "spec.cpu")
    cores = fields.integer(cpu.get("cores"), "spec.cpu.cores", 1, 256, required=True)
    sockets = fields.integer(cpu.get("sockets"), "spec.cpu.sockets", 1, 16) or 1
    threads = fields.integer(cpu.get("threads"), "spec.cpu.threads", 1, 8) or 1
    total = cores * sockets * threads if cores else None
    if total and total > check.MAX_CPU:
        fields.error("spec.cpu", "%d sockets x %d cores x %d threads is %d vCPUs; at most %d"
                     % (sockets, cores, threads, total, check.MAX_CPU))
    memory = fields.mapping(spec.get("memory"), "spec.memory", required=True) or {}
    fields.known(memory, ("quantity", "minQuantity", "maxQuantity"), "spec.memory")
    size = kube_quantity(fields, memory.get("quantity"), "spec.memory.quantity", True) \
        if "quantity" in memory else fields.error("spec.memory.quantity", "required value")
    gpu = fields.mapping(spec.get("gpu"), "spec.gpu") or {}
    fields.known(gpu, ("cores", "manufacturer"), "spec.gpu")
    fields.integer(gpu.get("cores"), "spec.gpu.cores", minimum=0)
    enabled = fields.boolean(spec.get("enabled"), "spec.enabled")
    fields.strings(spec.get("machineProviders"), "spec.machineProviders")
    obj.role = "class"
    obj.data = {"name": obj.name, "cpu": total, "memory": size}
    obj.refs = {"enabled": bool(enabled), "providers": list(spec.get("machineProviders") or [])}
    if topology_of(sockets, cores, threads):
        obj.refs["topology"] = topology_of(sockets, cores, threads)


def topology_of(sockets, cores, threads):
    return {"sockets": sockets, "cores": cores, "threads": threads} if sockets > 1 or threads > 1 else None


def machine_class(fields, spec):
    """(class, its path): ``machineClass`` (current) or ``instanceType`` (first generation), named as written
    when it is a Kubernetes object name (``t3.medium``). A cloud type that is none (``Standard_B2s``) maps onto
    one: lower case, ``_`` a ``-`` (``standard-b2s``)."""
    given = [(key, spec.get(key)) for key in ("machineClass", "instanceType") if spec.get(key) is not None]
    if len(given) == 2 and given[0][1] != given[1][1]:
        fields.error("spec.instanceType", "names class %r, spec.machineClass %r: give one"
                     % (given[1][1], given[0][1]))
        return None, "spec.machineClass"
    if not given:
        return None, "spec.machineClass"
    key, value = given[0]
    path = "spec." + key
    text = fields.string(value, path)
    if text is None:
        return None, path
    if re.match(r"^[a-z0-9.-]+$", text):
        return fields.class_name(text, path), path
    return fields.class_name(re.sub(r"_", "-", text.lower()), path), path


def _cloud_init(fields, value):
    """The cloudInit block as references to resolve in link(): {user: (path, how, what), network: ...}."""
    value = fields.mapping(value, "spec.cloudInit")
    if value is None:
        return None
    fields.known(value, ("type", "userData", "userDataBase64", "networkData", "networkDataBase64",
                         "userDataSecretRef", "networkDataSecretRef", "userDataConfigMapRef",
                         "networkDataConfigMapRef"), "spec.cloudInit")
    kind = fields.string(value.get("type", "noCloud"), "spec.cloudInit.type", choices=("noCloud", "configDrive"))
    if kind == "configDrive":
        fields.error("spec.cloudInit.type", "configDrive is not built: a machine's cloud-init seed is a NoCloud "
                     "cidata ISO on a SATA cdrom, which cloud-init reads the same way; use type noCloud")
    found = {}
    for part, default_key in (("user", "userdata"), ("network", "networkdata")):
        stem = "%sData" % part
        sources = [key for key in (stem, stem + "Base64", stem + "SecretRef", stem + "ConfigMapRef")
                   if value.get(key) is not None]
        if len(sources) > 1:
            fields.error("spec.cloudInit." + sources[1], "give %s once (also in spec.cloudInit.%s)"
                         % (stem, sources[0]))
            continue
        if not sources:
            continue
        key = sources[0]
        path = "spec.cloudInit." + key
        if key == stem:
            text = fields.string(value[key], path)
            found[part] = (path, "text", text)
        elif key.endswith("Base64"):
            try:
                found[part] = (path, "text", base64.b64decode(str(value[key]), validate=True).decode())
            except (binascii.Error, ValueError, UnicodeDecodeError):
                fields.error(path, "is not valid base64 text")
        else:
            ref = fields.mapping(value[key], path) or {}
            fields.known(ref, ("name", "key"), path)
            name = fields.name(ref.get("name"), path + ".name")
            wanted = fields.string(ref.get("key"), path + ".key") or default_key
            found[part] = (path, "Secret" if key.endswith("SecretRef") else "ConfigMap", (name, wanted))
    return found


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
    """What the image is chosen by. Nothing is required (neither CRD requires os); imageID is a published image
    or an http(s) URL, isoUri an http(s) URL."""
    value = fields.mapping(value, "spec.os")
    if value is None:
        return None
    fields.known(value, ("family", "distribution", "version", "architecture", "imageID", "imageFamily", "isoUri"),
                 "spec.os")
    wanted = {}
    if value.get("family") is not None:
        wanted["family"] = fields.string(value.get("family"), "spec.os.family", choices=OS_FAMILIES)
    if value.get("distribution") is not None:
        wanted["distribution"] = fields.string(value.get("distribution"), "spec.os.distribution")
    if value.get("version") is not None:
        wanted["version"] = _text(fields, value.get("version"), "spec.os.version")
    if value.get("architecture") is not None:
        wanted["architecture"] = fields.string(value["architecture"], "spec.os.architecture", choices=ARCHITECTURES)
    sources = [key for key in ("imageID", "isoUri") if value.get(key) is not None]
    if len(sources) == 2:
        fields.error("spec.os.isoUri", "the machine boots one image: give spec.os.imageID or spec.os.isoUri")
    elif sources:
        path = "spec.os." + sources[0]
        text = fields.string(value[sources[0]], path)
        if text and "://" in text:
            if not re.match(r"^https?://[^/\s]+/\S*$", text):
                fields.error(path, "%r is no http(s) URL of an image" % text)
            else:
                wanted["url"] = (path, text)
        elif text and sources[0] == "isoUri":
            fields.error(path, "%r is no http(s) URL of an ISO image" % text)
        elif text:
            wanted["imageID"] = fields.name(text, path)
    return wanted


def _text(fields, value, path, required=False):
    """A string field YAML may have read as a number (version: 12)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return fields.string(value, path, required=required)


def _provider(fields, spec, params, obj, current):
    """The provider (``provider``, else ``providerConfig.name``; the current CRD requires ``provider``, the first
    defaults to vitistack's default provider), kept for the engine to check against the run's ``providers``.
    ``region`` and ``zone`` select pools by their topology labels."""
    config = fields.mapping(spec.get("providerConfig"), "spec.providerConfig") or {}
    fields.known(config, ("name", "region", "zone", "config", "credentialsRef"), "spec.providerConfig")
    named = fields.string(spec.get("provider"), "spec.provider")
    legacy = fields.string(config.get("name"), "spec.providerConfig.name")
    if named and legacy and named != legacy:
        fields.error("spec.providerConfig.name", "names provider %r, spec.provider %r: give one" % (legacy, named))
    if named:
        obj.data.update(provider=named, provider_path="spec.provider")
    elif legacy:
        obj.data.update(provider=legacy, provider_path="spec.providerConfig.name")
    elif current:
        fields.error("spec.provider", "required value (the current Machine CRD requires it; libvirt, or a provider "
                     "of the manifest option providers)")
    else:
        obj.data.update(provider=DEFAULT_PROVIDER, provider_path="spec (no provider: vitistack's default, %s)"
                        % DEFAULT_PROVIDER)
    if isinstance(config.get("config"), dict):
        for key, item in config["config"].items():
            if not isinstance(item, str):
                fields.error("spec.providerConfig.config.%s" % key, "must be a string")
    credentials = fields.mapping(config.get("credentialsRef"), "spec.providerConfig.credentialsRef") or {}
    fields.known(credentials, ("secretName", "namespace"), "spec.providerConfig.credentialsRef")
    region = fields.string(config.get("region"), "spec.providerConfig.region")
    zone = fields.string(config.get("zone"), "spec.providerConfig.zone")
    selector = {}
    if region:
        selector[REGION_LABEL] = fields.run(check.label_value, region, "spec.providerConfig.region")
    if zone:
        selector[ZONE_LABEL] = fields.run(check.label_value, zone, "spec.providerConfig.zone")
    if selector:
        params["machine_pool_selector"] = selector


def _disks(fields, value, params, has_image):
    """The boot disk is the root disk: the image's overlay of sizeGB (with limits of its own, or encrypted: a
    volume of the image, booted, encrypted as a full LUKS copy); without an image (the kubevirt operator's PXE
    machines) an empty disk of sizeGB (10 GB when no disk is given) that the machine boots. The other disks are
    empty volumes. ``type`` is the bus, ``device`` the device name."""
    volumes, boot_seen = [], False
    names = set()
    items = fields.items(value, "spec.disks")
    for index, item in items:
        where = "spec.disks[%d]" % index
        fields.known(item, ("name", "sizeGB", "type", "boot", "encrypted", "iops", "throughput", "device"), where)
        name = fields.name(item.get("name"), where + ".name") if item.get("name") is not None \
            else ("root" if item.get("boot") else "disk%d" % index)  # the kubevirt operator's names
        if name in names:
            fields.error(where + ".name", "duplicate name %r" % name)
        names.add(name)
        size = fields.integer(item.get("sizeGB"), where + ".sizeGB", 1, 65536, required=True)
        iops = fields.integer(item.get("iops"), where + ".iops", 100, 64000)
        throughput = fields.integer(item.get("throughput"), where + ".throughput", 125, 4000)
        boot = fields.boolean(item.get("boot"), where + ".boot")
        encrypted = fields.boolean(item.get("encrypted"), where + ".encrypted")
        bus = "virtio"
        if item.get("type") is not None:
            kind = fields.string(item.get("type"), where + ".type")
            if kind in BUSES:
                bus = BUSES[kind]
            elif kind:
                fields.warn(where + ".type", "%r is a cloud's volume type, not a bus (virtio, sata, scsi, nvme): the "
                            "disk is a qcow2 volume on the virtio bus, as the kubevirt operator makes it" % kind)
        device = None
        if item.get("device") is not None:
            text = fields.string(item.get("device"), where + ".device")
            found = _DEVICE.match(text or "")
            prefix = check.DEVICE_PREFIX.get(bus)
            if text and (not found or not found.group("name").startswith(prefix)):
                fields.warn(where + ".device", "%r is not a %s device name (/dev/%sX): the device is assigned in "
                            "order" % (text, bus, prefix))
            elif found:
                device = found.group("name")
        qos = {key: option for key, option in (("iops", iops), ("throughput", throughput), ("encrypted", encrypted))
               if option is not None and option is not False}
        if boot:
            if boot_seen:
                fields.error(where + ".boot", "only one disk can be the boot disk")
            boot_seen = True
            if has_image and not (iops or throughput or encrypted):
                if size:
                    params["root_size"] = size * GIB
                if bus != "virtio" or device not in (None, "vda"):
                    fields.warn(where + (".type" if bus != "virtio" else ".device"),
                                "the root disk of an image is vda on the virtio bus: not applied")
                continue
            if has_image:
                # limits of its own, or encrypted (a full LUKS copy of the image, no overlay over the cached one):
                # the boot disk is a volume of the image (link() names it), booted first
                params["boot_image_volume"] = True
        # the machine's own "root" is the image's disk: an empty boot disk named root (the kubevirt operator's
        # name) is the volume "boot", exported back as root
        entry = {"name": BOOT_VOLUME if boot and name == "root" else name, "size": size * GIB if size else None,
                 "at": where}
        if bus != "virtio":
            entry["bus"] = bus
        if device:
            entry["device"] = device
        entry.update(qos)
        if encrypted:
            # the CRD has no passphrase: a random key per volume, kept only in the pool's private libvirt secret
            # (machine.py); the record never holds it, so a later apply's new key changes nothing
            import secrets
            entry["passphrase"] = secrets.token_urlsafe(32)
        volumes.insert(0, entry) if boot else volumes.append(entry)
    if not has_image and not items:
        # no image and no disks: the kubevirt operator's empty 10 GB root disk
        volumes.append({"name": BOOT_VOLUME, "size": DEFAULT_ROOT_GB * GIB, "at": "spec.disks"})
    if not has_image:
        fields.warn("spec.os", "no image: the machine boots its empty boot disk, as the kubevirt operator's do; "
                    "their network boot (PXE) after it is not set up on libvirt pools, so the firmware finds no "
                    "system until one is installed on the disk")
    if volumes:
        params["volumes"] = volumes


def link(obj, objects, fields, pools=None):
    """What the machine refers to: its class (a disabled MachineClass is refused, as the kubevirt operator
    refuses it), its image (imageID names it, a URL is fetched, else the one published image whose os matches)
    and its cloud-init data (inline, or a Secret's or ConfigMap's key among the documents)."""
    cls = objects.get(("MachineClass", obj.params.get("machine_class")))
    if cls is not None and cls.dialect.__name__ == __name__ and not cls.refs.get("enabled"):
        fields.error(obj.data["class_path"], "MachineClass %r is not enabled (spec.enabled: true publishes it)"
                     % cls.name)
    _link_cloud_init(obj, objects, fields)
    wanted = obj.refs.get("os")
    if wanted and wanted.get("url"):
        path, url = wanted["url"]
        obj.params["image"] = url
        obj.where["image"] = obj.where["image_checksum"] = path
        _url_checksum(obj, path, url, fields, pools)
        _boot_volume_image(obj, path)
        return
    if wanted and wanted.get("imageID"):
        obj.params["image"] = wanted["imageID"]
        obj.where["image"] = "spec.os.imageID"
        _boot_volume_image(obj, "spec.os.imageID")
        return
    keys = [key for key in ("family", "distribution", "version", "architecture") if (wanted or {}).get(key)]
    if pools is None or not set(keys) - {"architecture"}:
        return  # no image: the machine boots its empty root disk
    found = sorted({name for images in pools.images.values() for name, doc in images.items()
                    if all(str((doc.get("os") or {}).get(key)) == wanted[key] for key in keys)})
    if not found:
        fields.error("spec.os", "no image published on the pools is %s; publish one with machine_image (os: ...) "
                     "or give spec.os.imageID" % " ".join(wanted[key] for key in keys))
    elif len(found) > 1:
        fields.error("spec.os", "%d published images match (%s); name one with imageID"
                     % (len(found), ", ".join(found)))
    else:
        obj.params["image"] = found[0]
        _boot_volume_image(obj, "spec.os")


def _boot_volume_image(obj, path):
    """A boot disk of an image with iops or throughput of its own is the machine's first volume, of that image
    (the machine then has no image of its own and boots that volume), as the volume module makes one."""
    if not obj.data.get("boot_image_volume"):
        return
    volume = obj.params["volumes"][0]
    volume["image"] = obj.params.pop("image")
    if obj.params.get("image_checksum"):
        volume["image_checksum"] = obj.params.pop("image_checksum")
    obj.where["volumes[0].image"] = obj.where["volumes[0].image_checksum"] = path


def _url_checksum(obj, path, url, fields, pools):
    """An image URL has no checksum in a vitistack document: the first run downloads the file once and records
    its sha256 on the controller; later runs verify the download against it, so a file changed at that URL is
    noticed (a checksum mismatch) rather than booted."""
    from ansible_collections.machinery.compute.plugins.module_utils.machines import images
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
    contexts = getattr(pools, "contexts", None)
    if not contexts:
        return  # no pools to read (the parser's own tests): the apply resolves it
    try:
        checksum, first = images.checksum_of_url(url, contexts[0].url_opener)
    except MachineryError as exc:
        fields.error(path, exc.message)
        return
    obj.params["image_checksum"] = checksum
    if first:
        fields.warn(path, "no checksum given: %s was downloaded once and its sha256 %s recorded on this controller; "
                    "a later change of the file at that URL is refused as a checksum mismatch" % (url, checksum))


def _link_cloud_init(obj, objects, fields):
    found = obj.refs.get("cloud_init")
    if found is None:
        return
    texts = {}
    for part, (path, how, what) in found.items():
        if how == "text":
            texts[part] = what
            continue
        name, key = what
        source = objects.get((how, name))
        if source is None:
            fields.error(path + ".name", "%s %r is not among the documents (the pools keep no %ss)" % (how, name, how))
            continue
        if how == "Secret":
            texts[part] = secret_value(fields, source.doc, key, path + ".key")
        else:
            data = source.doc.get("data") if isinstance(source.doc.get("data"), dict) else {}
            if key not in data:
                fields.error(path + ".key", "the ConfigMap %s has no key %r" % (name, key))
            else:
                texts[part] = str(data[key])
    cloud_init = {"user_data": texts.get("user") or "#cloud-config\n"}  # the operator's no-op user data
    if texts.get("network"):
        cloud_init["network_config"] = texts["network"]
    obj.params["cloud_init"] = cloud_init
    obj.where["cloud_init"] = "spec.cloudInit"


def _network(fields, value, groups, params):
    groups = fields.strings(groups, "spec.securityGroups")
    value = fields.mapping(value, "spec.network")
    if value is None:
        if groups:
            fields.error("spec.securityGroups", "security groups apply to network interfaces; give spec.network")
        return
    fields.known(value, ("vpc", "subnet", "assignPublicIP", "privateIP", "publicIP", "interfaces",
                         "networkNamespaceName"), "spec.network")
    vpc = fields.name(value.get("vpc"), "spec.network.vpc", required=False)
    if value.get("networkNamespaceName") is not None:
        fields.name(value.get("networkNamespaceName"), "spec.network.networkNamespaceName")
    private = None
    if value.get("privateIP") is not None:
        private = fields.run(_ipv4, value["privateIP"], "spec.network.privateIP")
    nics = []
    for index, item in fields.items(value.get("interfaces"), "spec.network.interfaces"):
        where = "spec.network.interfaces[%d]" % index
        fields.known(item, ("name", "primary", "subnet", "securityGroups"), where)
        nic = {"name": fields.name(item.get("name"), where + ".name"), "primary": fields.boolean(item.get("primary"),
               where + ".primary"), "at": where}
        if vpc:
            nic["network"] = vpc
        own = fields.strings(item.get("securityGroups"), where + ".securityGroups")
        if own or groups:
            nic["security_groups"] = list(dict.fromkeys(list(groups) + list(own)))
        nics.append(nic)
    if nics and not vpc:
        fields.error("spec.network.interfaces", "an interface joins a libvirt network, and spec.network.vpc names "
                     "none: give spec.network.vpc (a network of the pools)")
        nics = []
    if not nics and vpc:
        nics = [{"name": "eth0", "network": vpc, "primary": True, "at": "spec.network.vpc"}]
        if groups:
            nics[0]["security_groups"] = list(groups)
    elif not nics and groups:
        fields.error("spec.securityGroups", "security groups apply to network interfaces; give spec.network.vpc")
    primaries = [nic for nic in nics if nic.get("primary")]
    if len(primaries) > 1:
        fields.error("spec.network.interfaces", "only one interface can be primary")
    if private:
        (primaries or nics)[0]["ip_address"] = private
    for nic in nics:
        nic.pop("primary", None)
    if nics:
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
    if obj is not None and obj.kind == "MachineClass":
        published = observed.get("pools") or []
        return {"name": obj.name, "phase": "Ready" if published else "Pending",
                "status": "Published" if published else "NotPublished",
                "message": "published on %s" % ", ".join(published) if published else "published on no pool"}
    if obj is not None and obj.kind == "ConfigMap":
        return {}
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


# the columns of `kubectl get machines` with vitistack's CRD (Phase, State, Public IPs, Provider, Machine Class,
# Age), the pool added; a MachineClass's as its catalogue lists it
TABLES = {"Machine": ("NAME", "PHASE", "STATE", "PUBLIC IPS", "PROVIDER", "MACHINE CLASS", "POOL", "AGE"),
          "MachineClass": ("NAME", "CPU", "MEMORY", "ENABLED", "POOLS")}


def row(obj, shown, observed):
    if obj.kind == "MachineClass":
        return (obj.name, obj.data.get("cpu"), format_quantity(obj.data["memory"]) if obj.data.get("memory") else "-",
                str(bool(obj.refs.get("enabled"))).lower(), ",".join(observed.get("pools") or []) or "<none>")
    machine = observed.get("machine") or {}
    return (obj.name, shown.get("phase"), shown.get("state") or "-", "<none>", obj.data.get("provider") or "-",
            obj.params.get("machine_class") or "-", machine.get("pool") or "-", machine.get("age") or "-")


EXPORT_NEEDS_POOL = True


def export(machine, record_spec, image, pool_labels):
    """A Machine document of an existing machine: its class, image (imageID and the published os), the pool's
    region and zone, cpu, memory, disks, network and tags. Applying it to the same pools changes nothing; the
    boot configuration (spec.name, sshKeys, userData, cloudInit) is never kept on the pools, so it is not
    exported."""
    system = dict(image.get("os") or {})
    # spec.name, the guest's host name, is boot configuration, which the pools never keep: left out, an apply of
    # the export keeps the machine's boot configuration as it is
    spec = {"providerConfig": {"name": "libvirt", "region": pool_labels.get(REGION_LABEL) or machine.get("pool")}}
    if machine.get("image"):
        spec["os"] = dict({key: str(system[key]) for key in ("family", "distribution", "version", "architecture")
                           if system.get(key)}, imageID=machine["image"])
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
        booted_image = vol.get("source") == "image" and vol.get("boot")
        if booted_image:  # a boot disk of an image with limits of its own: the image is the machine's
            source = vol["image"].get("source") if isinstance(vol.get("image"), dict) else vol.get("image")
            spec["os"] = dict(spec.get("os") or {}, imageID=source)
        elif vol.get("source") != "empty":
            continue
        disk = {"name": vol["name"], "sizeGB": int(vol.get("size") or 0) // GIB}
        if vol.get("boot"):
            disk.update(boot=True, name="root" if vol["name"] == BOOT_VOLUME else vol["name"])
        if vol.get("bus") and vol["bus"] != "virtio":
            disk["type"] = vol["bus"]
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
