# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KupenStack: kupenstack.io/v1alpha1 VirtualMachine.

A VirtualMachine has no image: it boots from the first volume of ``diskAttachments`` (volumes of the pool's
storage, made beforehand). ``virtualNetworks`` are libvirt networks (a NIC each, named after its network),
``publicKey`` an SSH key given by cloud-init, ``running`` the power state. Deleting it leaves its volumes and
networks, as KupenStack does. ``swap`` maps onto the machine's swap option (see pending.py).
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import APPLIED, table
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import kube_quantity
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import machine_object
from ansible_collections.machinery.compute.plugins.module_utils.manifests.pending import refuse_pending

API = "kupenstack.io/v1alpha1"
KINDS = {API: ("VirtualMachine",)}
CLASS_PATH = "spec"
POOL_PATH = "spec"
# a VirtualMachine's namespace, kept as a label of its machine (the record keeps labels): exported back, and the
# same name from another namespace is refused rather than taking over this one's machine
NAMESPACE_LABEL = "kupenstack.io/namespace"
DEFAULT_NAMESPACE = "default"
FIELDS = {"VirtualMachine": table({
    "metadata.namespace": APPLIED, "spec.running": APPLIED, "spec.vcpu": APPLIED, "spec.memory": APPLIED,
    "spec.swap": APPLIED, "spec.publicKey": APPLIED, "spec.virtualNetworks": APPLIED,
    "spec.diskAttachments[].name": APPLIED})}
OPTION_PATHS = {"cpu": "spec.vcpu", "memory": "spec.memory", "swap": "spec.swap", "state": "spec.running",
                "ssh_authorized_keys": "spec.publicKey", "ssh_authorized_keys[0]": "spec.publicKey",
                "network_interfaces": "spec.virtualNetworks", "volumes": "spec.diskAttachments",
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
    doc = obj.doc
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    fields.known(spec, ("running", "vcpu", "memory", "swap", "publicKey", "virtualNetworks", "diskAttachments"),
                 "spec")
    running = fields.boolean(spec.get("running", True), "spec.running")
    namespace = obj.doc["metadata"].get("namespace") or DEFAULT_NAMESPACE
    labels = dict(obj.labels)
    if fields.run(check.label_value, namespace, "metadata.namespace"):
        labels[NAMESPACE_LABEL] = namespace
    obj.data["namespace"] = namespace
    params = {"name": obj.name, "labels": labels, "state": "stopped" if running is False else "running"}
    if "vcpu" not in spec:
        fields.error("spec.vcpu", "required value")
    else:
        params["cpu"] = fields.run(check.cpu_count, spec["vcpu"], "spec.vcpu") \
            if isinstance(spec["vcpu"], int) and not isinstance(spec["vcpu"], bool) \
            else fields.error("spec.vcpu", "must be an integer")
    if "memory" not in spec:
        fields.error("spec.memory", "required value")
    else:
        params["memory"] = kube_quantity(fields, spec["memory"], "spec.memory", True)
    if spec.get("swap") not in (None, 0, "0"):
        params["swap"] = kube_quantity(fields, spec["swap"], "spec.swap")
    if spec.get("publicKey") is not None:
        key = fields.string(spec["publicKey"], "spec.publicKey")
        if key and fields.run(ssh_public_key, key, "spec.publicKey"):
            params["ssh_authorized_keys"] = [key.strip()]
    networks = fields.strings(spec.get("virtualNetworks"), "spec.virtualNetworks")
    nics = []
    for index, network in enumerate(networks):
        name = fields.name(network, "spec.virtualNetworks[%d]" % index)
        if name in [nic["name"] for nic in nics]:
            fields.error("spec.virtualNetworks[%d]" % index, "network %r is listed twice" % name)
        obj.where["network_interfaces[%d]" % len(nics)] = "spec.virtualNetworks[%d]" % index
        nics.append({"name": name, "network": network, "ephemeral": True})
    params["network_interfaces"] = nics
    volumes, refs = [], {"volumes": []}
    attachments = fields.items(spec.get("diskAttachments"), "spec.diskAttachments", required=True)
    if "diskAttachments" in spec and not attachments and isinstance(spec.get("diskAttachments"), list):
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


def link(obj, objects, fields, pools=None):
    """The same name from a second namespace is refused: it would take over the first namespace's machine."""
    for machine in (getattr(pools, "machines", None) or []):
        theirs = (machine.get("labels") or {}).get(NAMESPACE_LABEL)
        if machine.get("name") == obj.name and theirs and theirs != obj.data["namespace"]:
            fields.error("metadata.namespace", "VirtualMachine %s exists in namespace %r (on pool %s); names are "
                         "unique per pool, so %r cannot have one of the same name"
                         % (obj.name, theirs, machine.get("pool"), obj.data["namespace"]))


def status(obj, observed):
    machine = observed.get("machine")
    if observed.get("deletion"):
        # deleted (its volumes and networks stay): Terminating, then gone
        return {"phase": "Terminating"} if observed["deletion"] == "deleting" else {}
    if machine is None:
        return {"phase": "Pending"}
    shown = ["%s(%s)" % (nic.get("network"), address) for nic in machine.get("network_interfaces") or []
             for address in nic.get("ip_addresses") or []]
    return {"id": machine.get("uuid"), "phase": machine["phase"], "node": machine.get("pool"),
            "ip": ", ".join(shown), "restartCount": machine.get("restart_count", 0)}


TABLES = {"VirtualMachine": ("NAME", "STATUS", "RESTARTS", "AGE", "NODE", "NETWORKS(IP)")}


def row(obj, shown, observed):
    machine = observed.get("machine") or {}
    return (obj.name, shown.get("phase") or "-", str(shown.get("restartCount", 0)), machine.get("age") or "-",
            shown.get("node") or "-", shown.get("ip") or "<none>")


def export(machine, record_spec):
    spec = {"running": machine.get("phase") in ("Running", "Pending"), "vcpu": machine.get("cpu"),
            "memory": machine.get("memory"),
            "virtualNetworks": [nic["network"] for nic in record_spec.get("network_interfaces") or []
                                if nic.get("network")],
            "diskAttachments": [{"name": vol["volume"]} for vol in record_spec.get("volumes") or []
                                if vol.get("source") == "volume"]}
    if record_spec.get("swap"):
        spec["swap"] = format_quantity(record_spec["swap"])
    labels = dict(machine.get("labels") or {})
    metadata = {"name": machine["name"], "namespace": labels.pop(NAMESPACE_LABEL, DEFAULT_NAMESPACE)}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API, "kind": "VirtualMachine", "metadata": metadata, "spec": spec}
