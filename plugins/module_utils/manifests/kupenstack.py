# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KupenStack: kupenstack.io/v1alpha1 VirtualMachine, in both its forms, and the kinds it refers to.

The implemented VirtualMachine (Kupenstack/kupenstack apis/v1alpha1) names an ``image`` (an Image: the root
disk's image), a ``flavor`` (a Flavor: a machine class, with the root disk, swap and ephemeral disk sizes), a
``keyPair`` (a KeyPair: the SSH key given by cloud-init) and ``network`` (Networks: a NIC on each; ``default``
when none is named, as KupenStack's controller does). The design document's form (``vcpu``, ``memory``,
``swap``, ``publicKey``, ``virtualNetworks``, ``diskAttachments``, ``running``) applies too: ``vcpu`` and
``memory`` override the flavor, ``diskAttachments`` are attached after the image's root disk (the first one is
booted when there is no image), ``virtualNetworks`` get NICs after ``network``'s. Deleting a VirtualMachine
leaves its volumes and networks, as KupenStack does. The other kinds are in kupenstack_kinds.py.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests import kupenstack_kinds as kinds
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import APPLIED, table
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import kube_quantity, powered_on
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import machine_object
from ansible_collections.machinery.compute.plugins.module_utils.manifests.pending import refuse_pending

API = "kupenstack.io/v1alpha1"
KINDS = {API: ("VirtualMachine", "Flavor", "Image", "KeyPair", "Network", "VirtualNetwork", "Volume")}
DEFAULT_NETWORK = "default"  # KupenStack's network of a VirtualMachine that names none
CLASS_PATH = "spec.flavor"
POOL_PATH = "spec"
# a VirtualMachine's namespace, kept as a label of its machine (the record keeps labels): exported back, and the
# same name from another namespace is refused rather than taking over this one's machine
NAMESPACE_LABEL = "kupenstack.io/namespace"
DEFAULT_NAMESPACE = "default"
FIELDS = dict(kinds.FIELDS, VirtualMachine=table({
    "metadata.namespace": APPLIED, "spec.running": APPLIED, "spec.vcpu": APPLIED, "spec.memory": APPLIED,
    "spec.swap": APPLIED, "spec.publicKey": APPLIED, "spec.virtualNetworks": APPLIED,
    "spec.diskAttachments[].name": APPLIED, "spec.image": APPLIED, "spec.flavor": APPLIED,
    "spec.keyPair": APPLIED, "spec.network": APPLIED}))
OPTION_PATHS = {"cpu": "spec.vcpu", "memory": "spec.memory", "swap": "spec.swap", "state": "spec.running",
                "machine_class": "spec.flavor", "image": "spec.image",
                "ssh_authorized_keys": "spec.publicKey", "ssh_authorized_keys[0]": "spec.publicKey",
                "network_interfaces": "spec.network", "volumes": "spec.diskAttachments",
                "labels": "metadata.labels", "name": "metadata.name", "machine_pool": "spec.diskAttachments[0].name"}
SSH_KEY_TYPES = ("ssh-rsa", "ssh-dss", "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                 "ecdsa-sha2-nistp521", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def ssh_public_key(value, field):
    """An OpenSSH public key line: a known key type, then its base64 blob, which names the same type."""
    import base64
    import binascii
    import struct
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
    parts = str(value).split()
    if len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
        raise ValidationError("is not an SSH public key (\"<type> <base64> [comment]\", type one of %s)"
                              % ", ".join(SSH_KEY_TYPES[:3]), field)
    try:
        blob = base64.b64decode(parts[1], validate=True)
        length = struct.unpack(">I", blob[:4])[0]
        named = blob[4:4 + length].decode()
    except (binascii.Error, ValueError, struct.error, UnicodeDecodeError):
        raise ValidationError("the key's base64 part is not an SSH public key blob", field) from None
    if named != parts[0]:
        raise ValidationError("the key says %s but its blob is %s" % (parts[0], named), field)
    return str(value).strip()


def read(obj, fields):
    if obj.kind == "Flavor":
        return kinds.read_flavor(obj, fields)
    if obj.kind == "Image":
        return kinds.read_image(obj, fields)
    if obj.kind == "KeyPair":
        return kinds.read_keypair(obj, fields, ssh_public_key)
    if obj.kind in ("Network", "VirtualNetwork"):
        return kinds.read_network(obj, fields)
    if obj.kind == "Volume":
        return kinds.read_volume(obj, fields)
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, ("running", "vcpu", "memory", "swap", "publicKey", "virtualNetworks", "diskAttachments",
                        "image", "flavor", "keyPair", "network"), "spec")
    running = fields.boolean(spec.get("running", True), "spec.running")
    namespace = obj.doc["metadata"].get("namespace") or DEFAULT_NAMESPACE
    labels = dict(obj.labels)
    if fields.run(check.label_value, namespace, "metadata.namespace"):
        labels[NAMESPACE_LABEL] = namespace
    obj.data["namespace"] = namespace
    params = {"name": obj.name, "labels": labels, "state": "stopped" if running is False else "running"}
    refs = {"volumes": []}
    flavor = fields.class_name(spec.get("flavor"), "spec.flavor", required=False)
    if flavor:
        params["machine_class"] = refs["class"] = flavor
    if spec.get("image") is not None:
        refs["image"] = fields.name(spec.get("image"), "spec.image")
    if spec.get("keyPair") is not None:
        refs["keypair"] = fields.name(spec.get("keyPair"), "spec.keyPair")
    if "vcpu" in spec:
        params["cpu"] = fields.run(check.cpu_count, spec["vcpu"], "spec.vcpu") \
            if isinstance(spec["vcpu"], int) and not isinstance(spec["vcpu"], bool) \
            else fields.error("spec.vcpu", "must be an integer")
    elif not flavor:
        fields.error("spec.vcpu", "required value (or spec.flavor)")
    if "memory" in spec:
        params["memory"] = kube_quantity(fields, spec["memory"], "spec.memory", True)
    elif not flavor:
        fields.error("spec.memory", "required value (or spec.flavor)")
    if spec.get("swap") not in (None, 0, "0"):
        params["swap"] = kube_quantity(fields, spec["swap"], "spec.swap")
    if spec.get("publicKey") is not None:
        key = fields.string(spec["publicKey"], "spec.publicKey")
        if key and fields.run(ssh_public_key, key, "spec.publicKey"):
            params["ssh_authorized_keys"] = [key.strip()]
    nics = []
    named = fields.strings(spec.get("network"), "spec.network")
    listed = [("spec.network[%d]" % index, name) for index, name in enumerate(named)]
    listed += [("spec.virtualNetworks[%d]" % index, name)
               for index, name in enumerate(fields.strings(spec.get("virtualNetworks"), "spec.virtualNetworks"))]
    if not listed and spec.get("network") is None and spec.get("virtualNetworks") is None:
        listed = [("spec.network", DEFAULT_NETWORK)]  # KupenStack's controller: no network is [default]
    for where, network in listed:
        name = fields.name(network, where)
        if name in [nic["name"] for nic in nics]:
            fields.error(where, "network %r is listed twice" % name)
        obj.where["network_interfaces[%d]" % len(nics)] = where
        obj.where["network_interfaces[%d].network" % len(nics)] = where
        nics.append({"name": name, "network": network, "ephemeral": True})
    params["network_interfaces"] = nics
    volumes = []
    attachments = fields.items(spec.get("diskAttachments"), "spec.diskAttachments",
                               required=spec.get("image") is None)
    if "diskAttachments" in spec and not attachments and isinstance(spec.get("diskAttachments"), list) \
            and spec.get("image") is None:
        fields.error("spec.diskAttachments", "needs at least one volume: the machine boots from the first")
    for index, item in attachments:
        where = "spec.diskAttachments[%d]" % index
        fields.known(item, ("name",), where)
        name = fields.name(item.get("name"), where + ".name")
        if name in [vol["name"] for vol in volumes]:
            fields.error(where + ".name", "volume %r is attached twice" % name)
        obj.where["volumes[%d]" % len(volumes)] = where
        volumes.append({"name": name, "volume": name, "ephemeral": False})
        refs["volumes"].append((where + ".name", name))
    params["volumes"] = volumes
    refuse_pending(fields, params, {("swap",): "spec.swap"})
    obj.where.update(OPTION_PATHS)
    machine_object(obj, params, refs)
    return None


def _link_refs(obj, objects, fields, pools):
    """The implemented VirtualMachine's references: its Flavor's disk, swap and ephemeral sizes (the class itself
    is checked by the engine), its Image (among the documents or published), its KeyPair (among the
    documents: the pools keep no key pairs) and its networks (a Network or VirtualNetwork among the documents,
    or a libvirt network of the pools, checked by the engine)."""
    params, refs = obj.params, obj.refs
    flavor = objects.get(("Flavor", refs.get("class"))) if refs.get("class") else None
    image = objects.get(("Image", refs.get("image"))) if refs.get("image") else None
    if refs.get("image"):
        params["image"] = refs["image"]
        obj.where["image"] = "spec.image"
    if flavor is not None and flavor.dialect.__name__ == __name__:
        if flavor.refs.get("disk"):
            params["root_size"] = flavor.refs["disk"] * kinds.GIB
            obj.where["root_size"] = "spec.flavor"
        if flavor.refs.get("swap") and "swap" not in params:
            params["swap"] = flavor.refs["swap"] * kinds.MIB
            obj.where["swap"] = "spec.flavor"
        if flavor.refs.get("ephemeral"):
            obj.where["volumes[%d]" % len(params["volumes"])] = "spec.flavor"
            params["volumes"].append({"name": "ephemeral", "size": flavor.refs["ephemeral"] * kinds.GIB,
                                      "ephemeral": True})
        if image is not None:
            if image.data.get("min_disk") and flavor.refs.get("disk") and flavor.refs["disk"] < image.data["min_disk"]:
                fields.error("spec.flavor", "flavor %s has a %d GB disk; image %s needs at least %d GB (minDisk)"
                             % (flavor.name, flavor.refs["disk"], image.name, image.data["min_disk"]))
            ram = params.get("memory") or flavor.data.get("memory") or 0
            if image.data.get("min_ram") and ram < image.data["min_ram"] * kinds.MIB:
                fields.error("spec.flavor", "%d MB of memory; image %s needs at least %d MB (minRam)"
                             % (ram // kinds.MIB, image.name, image.data["min_ram"]))
    if image is not None and image.data.get("min_disk") and not params.get("root_size"):
        params["root_size"] = image.data["min_disk"] * kinds.GIB
    if refs.get("keypair"):
        keypair = objects.get(("KeyPair", refs["keypair"]))
        if keypair is None:
            fields.error("spec.keyPair", "KeyPair %r is not among the documents (the pools keep no key pairs: apply "
                         "it with the VirtualMachine)" % refs["keypair"])
        elif keypair.data.get("public_key"):
            keys = params.setdefault("ssh_authorized_keys", [])
            if keypair.data["public_key"] not in keys:
                keys.append(keypair.data["public_key"])


def url_checksum(url, path, fields, pools):
    """The sha256 of an image URL a KupenStack document gives without one: downloaded once and recorded on this
    controller (images.checksum_of_url), warned the first time; None without pools to download for."""
    from ansible_collections.machinery.compute.plugins.module_utils.machines import images
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError
    contexts = getattr(pools, "contexts", None)
    if not contexts:
        return None
    try:
        checksum, first = images.checksum_of_url(url, contexts[0].url_opener)
    except MachineryError as exc:
        fields.error(path, exc.message)
        return None
    if first:
        fields.warn(path, "no checksum given: %s was downloaded once and its sha256 %s recorded on this controller; "
                    "a later change of the file at that URL is refused as a checksum mismatch" % (url, checksum))
    return checksum


def link_image(obj, objects, fields, pools=None):
    if obj.data.get("url"):
        obj.data["checksum"] = url_checksum(obj.data["url"], "spec.src", fields, pools)


def link_volume(obj, objects, fields, pools=None):
    """A Volume's source.image: an Image among the documents or published (by name), or a URL, fetched once and
    copied from the controller's cache."""
    image = obj.data.get("image")
    if not image or "://" not in image:
        return
    checksum = url_checksum(image, "spec.source.image", fields, pools)
    if checksum:
        from ansible_collections.machinery.compute.plugins.module_utils.machines import images
        import os
        obj.data["image"] = os.path.join(images.cache_dir(), "images", checksum)


def link(obj, objects, fields, pools=None):
    """The references of a VirtualMachine; the same name from a second namespace is refused: it would take over
    the first namespace's machine."""
    _link_refs(obj, objects, fields, pools)
    for machine in (getattr(pools, "machines", None) or []):
        theirs = (machine.get("labels") or {}).get(NAMESPACE_LABEL)
        if machine.get("name") == obj.name and theirs and theirs != obj.data["namespace"]:
            fields.error("metadata.namespace", "VirtualMachine %s exists in namespace %r (on pool %s); names are "
                         "unique per pool, so %r cannot have one of the same name"
                         % (obj.name, theirs, machine.get("pool"), obj.data["namespace"]))


def status(obj, observed):
    if obj.kind != "VirtualMachine":
        return kinds.status(obj, observed)
    machine = observed.get("machine")
    if observed.get("deletion"):
        # deleted (its volumes and networks stay): Terminating, then gone
        return {"phase": "Terminating"} if observed["deletion"] == "deleting" else {}
    if machine is None:
        return {"phase": "Pending"}
    shown = ["%s(%s)" % (nic.get("network"), address) for nic in machine.get("network_interfaces") or []
             for address in nic.get("ip_addresses") or []]
    # the implemented CRD's state and the design's phase, both
    return {"id": machine.get("uuid"), "phase": machine["phase"], "state": machine["phase"],
            "node": machine.get("pool"), "ip": ", ".join(shown), "restartCount": machine.get("restart_count", 0)}


TABLES = dict(kinds.TABLES, VirtualMachine=("NAME", "STATUS", "RESTARTS", "AGE", "NODE", "NETWORKS(IP)"))


def row(obj, shown, observed):
    if obj.kind != "VirtualMachine":
        return kinds.row(obj, shown, observed)
    machine = observed.get("machine") or {}
    return (obj.name, shown.get("phase") or "-", str(shown.get("restartCount", 0)), machine.get("age") or "-",
            shown.get("node") or "-", shown.get("ip") or "<none>")


def export(machine, record_spec):
    """A VirtualMachine of an existing machine: its published image and class as ``image`` and ``flavor`` (the
    Image and Flavor documents are not exported: the image and class are on the pools already), its size as
    ``vcpu`` and ``memory``, its networks as ``network`` and its attached volumes as ``diskAttachments``."""
    spec = {"running": powered_on(machine), "vcpu": machine.get("cpu"),
            "memory": machine.get("memory"),
            "network": [nic["network"] for nic in record_spec.get("network_interfaces") or []
                        if nic.get("network")]}
    attached = [{"name": vol["volume"]} for vol in record_spec.get("volumes") or [] if vol.get("source") == "volume"]
    if attached:
        spec["diskAttachments"] = attached
    image = (record_spec.get("image") or {}).get("source") if isinstance(record_spec.get("image"), dict) \
        else record_spec.get("image")
    if image:
        spec["image"] = image
    if machine.get("machine_class"):
        spec["flavor"] = machine["machine_class"]
    if record_spec.get("swap"):
        spec["swap"] = format_quantity(record_spec["swap"])
    labels = dict(machine.get("labels") or {})
    metadata = {"name": machine["name"], "namespace": labels.pop(NAMESPACE_LABEL, DEFAULT_NAMESPACE)}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API, "kind": "VirtualMachine", "metadata": metadata, "spec": spec}
