# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OpenShift Machine API: machine.openshift.io/v1beta1 Machine, MachineSet and MachineHealthCheck, with a
``providerSpec.value`` of kind ``LibvirtMachineProviderSpec`` (docs/manifests.md) that carries what ``machine``
takes; v1 Secret for a ``userDataSecret``.

A Machine maps onto ``machine`` (the batch core), a MachineSet onto ``machine_set``, a MachineHealthCheck onto
``machine_health_check``.
"""

from __future__ import annotations

import json
import re

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.manifests.conformance import (
    APPLIED, refused, table, warned)
from ansible_collections.machinery.compute.plugins.module_utils.manifests.documents import (
    kube_quantity, powered_on, secret_value)
from ansible_collections.machinery.compute.plugins.module_utils.manifests import go_zero
from ansible_collections.machinery.compute.plugins.module_utils.manifests import openshift_libvirt as upstream
from ansible_collections.machinery.compute.plugins.module_utils.manifests.objects import machine_object

API = "machine.openshift.io/v1beta1"
KINDS = {API: ("Machine", "MachineSet", "MachineHealthCheck"), "v1": ("Secret",)}
PROVIDER_API = "machinery.compute/v1alpha1"
PROVIDER_KIND = "LibvirtMachineProviderSpec"
# providerSpec.value key -> machine option
PROVIDER_KEYS = {"machineClass": "machine_class", "cpu": "cpu", "memory": "memory", "image": "image",
                 "imageChecksum": "image_checksum", "rootSize": "root_size", "firmware": "firmware",
                 "sshAuthorizedKeys": "ssh_authorized_keys", "machinePool": "machine_pool",
                 "machinePoolSelector": "machine_pool_selector", "tolerations": "tolerations", "state": "state",
                 "swap": "swap"}
VOLUME_KEYS = {"name": "name", "size": "size", "volume": "volume", "image": "image", "device": "device",
               "bus": "bus", "ephemeral": "ephemeral"}
NIC_KEYS = {"name": "name", "network": "network", "bridge": "bridge", "mac": "mac", "model": "model"}

# --- what becomes of every field (conformance.py) ---------------------------------------------------------------

NODE_ONLY = warned("it belongs to the Kubernetes Node of the machine: a libvirt pool has no Node; not applied")
PROVIDER_ID = warned("set by the provider, not by the user: the status shows libvirt:///<pool>/<uuid>")
AUTHORITATIVE = warned("machinery.compute is the only API serving these machines: not applied")
AUTOSCALER = warned("no cluster autoscaler scales a machine_set: replicas is applied as written")
TEMPLATE_META = warned("a member is named <set>-<suffix> by its set, on the pools of the run: the template's name, "
                       "generateName, namespace and owners are not applied")
TEMPLATE_CREATED = warned("set by a Kubernetes API server (the older Machine API embedded a full ObjectMeta in the "
                          "template); a member is created when its set makes it: not applied")
MATCH_EXPRESSIONS = refused("machines are selected by matchLabels only; give matchLabels")


def _machine_spec_fields(prefix):
    value = prefix + ".providerSpec.value."
    fields = {value + key: APPLIED for key in ("apiVersion", "kind", "volumes", "networkInterfaces",
                                               "userDataSecret.name", "userDataSecret.key") + tuple(PROVIDER_KEYS)}
    fields.update({value + "volumes[]." + key: APPLIED for key in VOLUME_KEYS})
    fields.update({value + "networkInterfaces[]." + key: APPLIED for key in NIC_KEYS})
    fields.update({value + "machinePoolSelector.*": APPLIED, value + "sshAuthorizedKeys": APPLIED,
                   value + "tolerations[].key": APPLIED, value + "tolerations[].operator": APPLIED,
                   value + "tolerations[].value": APPLIED, value + "tolerations[].effect": APPLIED,
                   prefix + ".providerID": PROVIDER_ID, prefix + ".taints": NODE_ONLY,
                   prefix + ".metadata": NODE_ONLY,
                   prefix + ".lifecycleHooks": warned("lifecycle hooks hold a Node's drain; libvirt machines have "
                                                      "no Node to drain: not applied")})
    for key in ("machinePoolSelector", "tolerations"):
        fields.pop(value + key, None)
    fields.update(upstream.fields_table(prefix + ".providerSpec.value"))
    return fields


SECRET_FIELDS = {"data.*": APPLIED, "stringData.*": APPLIED, "type": APPLIED,
                 "immutable": warned("libvirt keeps no Secret object: the text is read once, by userDataSecret")}
FIELDS = {
    "Machine": table(dict(_machine_spec_fields("spec"), **{"spec.authoritativeAPI": AUTHORITATIVE})),
    "MachineSet": table(dict(_machine_spec_fields("spec.template.spec"), **{
        "spec.replicas": APPLIED, "spec.selector.matchLabels.*": APPLIED, "spec.selector.matchExpressions":
        MATCH_EXPRESSIONS, "spec.deletePolicy": APPLIED, "spec.template.metadata.labels.*": APPLIED,
        "spec.template.metadata.annotations.*": warned("a member's annotations are not kept on libvirt pools"),
        "spec.minReadySeconds": warned("a member counts as available as soon as it is Ready: not applied"),
        "spec.authoritativeAPI": AUTHORITATIVE, "spec.template.spec.authoritativeAPI": AUTHORITATIVE,
        "spec.template.metadata.name": TEMPLATE_META, "spec.template.metadata.generateName": TEMPLATE_META,
        "spec.template.metadata.namespace": TEMPLATE_META, "spec.template.metadata.ownerReferences": TEMPLATE_META,
        "spec.template.metadata.creationTimestamp": TEMPLATE_CREATED,
        "metadata.annotations.machine.openshift.io/cluster-api-autoscaler-node-group-min-size": AUTOSCALER,
        "metadata.annotations.machine.openshift.io/cluster-api-autoscaler-node-group-max-size": AUTOSCALER})),
    "MachineHealthCheck": table({
        "spec.selector.matchLabels.*": APPLIED, "spec.selector.matchExpressions": MATCH_EXPRESSIONS,
        "spec.unhealthyConditions[].type": APPLIED, "spec.unhealthyConditions[].status": APPLIED,
        "spec.unhealthyConditions[].timeout": APPLIED, "spec.maxUnhealthy": APPLIED,
        "spec.nodeStartupTimeout": APPLIED,
        "spec.remediationTemplate": warned("no external remediation serves libvirt machines: unhealthy machines "
                                           "are remediated by the check itself (deleted, as without a template)")}),
    "Secret": table(SECRET_FIELDS),
}
# health check option -> the document's field (the conditions' items are recorded per object)
CHECK_PATHS = {"selector": "spec.selector", "selector.match_labels": "spec.selector.matchLabels",
               "max_unhealthy": "spec.maxUnhealthy", "node_startup_timeout": "spec.nodeStartupTimeout",
               "unhealthy_conditions": "spec.unhealthyConditions", "name": "metadata.name"}


def unset_zero_values(kind, doc):
    """The document as read: the zero values Go writes for fields without omitempty are unset (go_zero.py)."""
    return go_zero.unset_zero_values(kind, doc)


def where_of(path):
    """machine option -> its field under the providerSpec.value at ``path``."""
    found = {option: "%s.%s" % (path, key) for key, option in PROVIDER_KEYS.items()}
    found.update(labels="metadata.labels", name="metadata.name", volumes=path + ".volumes",
                 network_interfaces=path + ".networkInterfaces", ssh_authorized_keys=path + ".sshAuthorizedKeys",
                 ignition=path + ".userDataSecret", cloud_init=path + ".userDataSecret")
    return found


def upstream_where_of(path):
    """machine option -> its field under an upstream LibvirtMachineProviderConfig at ``path``."""
    return {"memory": path + ".domainMemory", "cpu": path + ".domainVcpu", "image": path + ".volume.baseVolumeID",
            "root_size": path + ".volume.volumeSize", "network_interfaces": path + ".networkInterfaceName",
            "network_interfaces[0]": path + ".networkInterfaceName",
            "network_interfaces[0].network": path + ".networkInterfaceName",
            "network_interfaces[0].ip_address": path + ".networkInterfaceAddress",
            "ignition": path + ".ignition.userDataSecret", "cloud_init": path + ".cloudInit",
            "machine_pool": path + ".uri", "labels": "metadata.labels", "name": "metadata.name"}


def provider_spec(fields, value, path, labels, member_of_set=False):
    """Machine parameters from a providerSpec.value (validated field by field): ours, or the OpenShift libvirt
    provider's own LibvirtMachineProviderConfig (openshift_libvirt.py)."""
    value = fields.mapping(value, path, required=True) or {}
    if upstream.is_upstream(value):
        return upstream.read(fields, value, path, labels, member_of_set)
    fields.known(value, ("apiVersion", "kind", "volumes", "networkInterfaces", "userDataSecret") + tuple(PROVIDER_KEYS),
                 path)
    if value.get("kind") != PROVIDER_KIND:
        fields.error(path + ".kind", "must be %s (the libvirt provider of machinery.compute) or %s (OpenShift's "
                     "libvirt provider), got %r" % (PROVIDER_KIND, upstream.KIND, value.get("kind")))
    if value.get("apiVersion") not in (None, PROVIDER_API):
        fields.error(path + ".apiVersion", "must be %s" % PROVIDER_API)
    params = {"labels": labels}
    for key, option in PROVIDER_KEYS.items():
        if value.get(key) is not None:
            params[option] = value[key]
    if params.get("state") is not None:
        fields.string(params["state"], path + ".state", choices=("running", "stopped", "present"))
    if "cpu" in params:
        params["cpu"] = fields.run(check.cpu_count, params["cpu"], path + ".cpu")
    if "memory" in params:
        kube_quantity(fields, params["memory"], path + ".memory", True)
    if "machine_class" in params:
        fields.class_name(params["machine_class"], path + ".machineClass")
    elif "cpu" not in params or "memory" not in params:
        fields.error(path + ".machineClass", "give machineClass, or both cpu and memory")
    if "image" in params:
        fields.string(params["image"], path + ".image")
    if "firmware" in params:
        fields.string(params["firmware"], path + ".firmware", choices=options.FIRMWARES)
    if params.get("tolerations") is not None:
        from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import (
            normalize_tolerations)
        params["tolerations"] = fields.run(normalize_tolerations, params["tolerations"], path + ".tolerations")
    if "machine_pool_selector" in params:
        fields.run(check.labels, params["machine_pool_selector"], path + ".machinePoolSelector")
    volumes = []
    for index, item in fields.items(value.get("volumes"), path + ".volumes"):
        where = "%s.volumes[%d]" % (path, index)
        fields.known(item, tuple(VOLUME_KEYS), where)
        fields.name(item.get("name"), where + ".name")
        if sum(1 for key in ("size", "volume", "image") if item.get(key) is not None) != 1:
            fields.error(where, "give exactly one of size, volume or image")
        if item.get("size") is not None:
            kube_quantity(fields, item["size"], where + ".size")
        if item.get("bus") is not None:
            fields.string(item["bus"], where + ".bus", choices=options.DISK_BUSES)
        fields.boolean(item.get("ephemeral"), where + ".ephemeral")
        volumes.append({VOLUME_KEYS[key]: item[key] for key in item if key in VOLUME_KEYS})
    if "volumes" in value:
        params["volumes"] = volumes
    nics = []
    for index, item in fields.items(value.get("networkInterfaces"), path + ".networkInterfaces"):
        where = "%s.networkInterfaces[%d]" % (path, index)
        fields.known(item, tuple(NIC_KEYS), where)
        fields.name(item.get("name"), where + ".name")
        if bool(item.get("network")) == bool(item.get("bridge")):
            fields.error(where, "give exactly one of network or bridge")
        if item.get("mac"):
            fields.run(check.mac_address, item["mac"], where + ".mac")
        if item.get("model") is not None:
            fields.string(item["model"], where + ".model", choices=options.NIC_MODELS)
        nics.append({NIC_KEYS[key]: item[key] for key in item if key in NIC_KEYS})
    if "networkInterfaces" in value:
        params["network_interfaces"] = nics
    secret = fields.mapping(value.get("userDataSecret"), path + ".userDataSecret")
    refs = {"class": params.get("machine_class"), "volumes": [], "secret": None}
    for index, item in enumerate(volumes):
        if item.get("volume"):
            refs["volumes"].append(("%s.volumes[%d].volume" % (path, index), item["volume"]))
    if secret:
        fields.known(secret, ("name", "key"), path + ".userDataSecret")
        refs["secret"] = (path + ".userDataSecret", fields.name(secret.get("name"), path + ".userDataSecret.name"),
                          secret.get("key") or "userData")
    return params, refs


def read(obj, fields):
    doc = obj.doc
    if obj.kind == "Secret":
        fields.known(doc, ("apiVersion", "kind", "metadata", "data", "stringData", "type", "immutable"), "")
        fields.string(doc.get("type"), "type")  # shown in the table
        obj.role = "secret"
        return
    fields.known(doc, ("apiVersion", "kind", "metadata", "spec"), "", ("status",))
    spec = fields.mapping(doc.get("spec"), "spec", required=True) or {}
    if obj.kind == "Machine":
        fields.known(spec, ("providerSpec", "providerID", "taints", "lifecycleHooks", "metadata",
                            "authoritativeAPI"), "spec")
        provider = fields.mapping(spec.get("providerSpec"), "spec.providerSpec", required=True) or {}
        params, refs = provider_spec(fields, provider.get("value"), "spec.providerSpec.value", obj.labels)
        params["name"] = obj.name
        obj.where.update((upstream_where_of if "libvirt" in refs else where_of)("spec.providerSpec.value"))
        machine_object(obj, params, refs)
    elif obj.kind == "MachineSet":
        fields.known(spec, ("replicas", "selector", "template", "deletePolicy", "minReadySeconds",
                            "authoritativeAPI"), "spec")
        replicas = fields.integer(spec.get("replicas", 1), "spec.replicas", minimum=0)
        selector = fields.mapping(spec.get("selector"), "spec.selector", required=True) or {}
        fields.known(selector, ("matchLabels", "matchExpressions"), "spec.selector")
        match = fields.run(check.labels, selector.get("matchLabels") or {}, "spec.selector.matchLabels")
        if selector and not match:
            fields.error("spec.selector.matchLabels", "needs at least one label")
        template = fields.mapping(spec.get("template"), "spec.template", required=True) or {}
        fields.known(template, ("metadata", "spec"), "spec.template")
        meta = fields.mapping(template.get("metadata"), "spec.template.metadata") or {}
        fields.known(meta, ("labels", "annotations", "name", "generateName", "namespace", "ownerReferences",
                            "creationTimestamp"), "spec.template.metadata")
        labels = fields.run(check.labels, meta.get("labels") or {}, "spec.template.metadata.labels") or {}
        if match and labels is not None and any(labels.get(k) != v for k, v in match.items()):
            fields.error("spec.selector", "selector does not match the template's labels")
        tspec = fields.mapping(template.get("spec"), "spec.template.spec", required=True) or {}
        fields.known(tspec, ("providerSpec", "metadata", "taints", "lifecycleHooks", "providerID",
                             "authoritativeAPI"), "spec.template.spec")
        provider = fields.mapping(tspec.get("providerSpec"), "spec.template.spec.providerSpec", required=True) or {}
        params, refs = provider_spec(fields, provider.get("value"), "spec.template.spec.providerSpec.value", labels,
                                     member_of_set=True)
        policy = fields.string(spec.get("deletePolicy"), "spec.deletePolicy", choices=options.DELETE_POLICIES)
        obj.where.update((upstream_where_of if "libvirt" in refs else where_of)(
            "spec.template.spec.providerSpec.value"))
        obj.where.update(labels="spec.template.metadata.labels")
        machine_object(obj, {"name": obj.name, "replicas": replicas, "selector": {"match_labels": match or {}},
                             "template": params, "delete_policy": policy or "Random"}, refs, role="set")
    else:
        fields.known(spec, ("selector", "unhealthyConditions", "maxUnhealthy", "nodeStartupTimeout",
                            "remediationTemplate"), "spec")
        selector = fields.mapping(spec.get("selector"), "spec.selector", required=True) or {}
        fields.known(selector, ("matchLabels", "matchExpressions"), "spec.selector")
        match = fields.run(check.labels, selector.get("matchLabels") or {}, "spec.selector.matchLabels")
        if selector and not match:
            fields.error("spec.selector.matchLabels", "needs at least one label")
        conditions, unknown = [], []
        obj.where.update(CHECK_PATHS)
        for index, item in fields.items(spec.get("unhealthyConditions"), "spec.unhealthyConditions"):
            where = "spec.unhealthyConditions[%d]" % index
            fields.known(item, ("type", "status", "timeout"), where)
            kind = fields.string(item.get("type"), where + ".type", required=True)
            status = fields.string(item.get("status"), where + ".status", required=True,
                                   choices=("True", "False", "Unknown"))
            timeout = fields.string(item.get("timeout"), where + ".timeout", required=True)
            timeout = fields.run(go_duration, timeout, where + ".timeout") if timeout else None
            rule = _condition_rule(fields, kind, status, where)
            if rule is None or timeout is None:
                continue
            rule["timeout"] = timeout
            if rule["type"] == "NodeReady" and status == "Unknown":
                unknown.append(timeout)  # the Node stopped reporting: here, its pool stopped answering too
            same = next((found for found in conditions if (found["type"], found["status"]) ==
                         (rule["type"], rule["status"])), None)
            if same is None:
                obj.where["unhealthy_conditions[%d]" % len(conditions)] = where
                conditions.append(rule)
            elif timeout < same["timeout"]:  # the controller remediates at the first timeout that elapses
                obj.where["unhealthy_conditions[%d]" % conditions.index(same)] = where
                same["timeout"] = timeout
        params = {"name": obj.name, "selector": {"match_labels": match or {}}, "startup_condition": "NodeReady"}
        if conditions:
            params["unhealthy_conditions"] = conditions
        if unknown:
            params["unreachable_timeout"] = min(unknown)
        if spec.get("maxUnhealthy") is not None:
            params["max_unhealthy"] = spec["maxUnhealthy"]
        if spec.get("nodeStartupTimeout") is not None:
            startup = fields.string(str(spec["nodeStartupTimeout"]), "spec.nodeStartupTimeout")
            startup = fields.run(go_duration, startup, "spec.nodeStartupTimeout") if startup else None
            if startup is not None:
                params["node_startup_timeout"] = startup  # 0 disables the startup check, as upstream
        machine_object(obj, params, {}, role="check")


# Node condition types of Kubernetes and OpenShift that libvirt cannot observe, and why (warned, not applied)
UNOBSERVABLE = {
    "Terminating": "OpenShift's termination handler sets it on a Node when its cloud announces the instance's "
                   "end (a spot instance); a libvirt pool announces no such end",
    "MemoryPressure": "the kubelet's eviction signal inside the guest; libvirt sees no guest memory pressure",
    "DiskPressure": "the kubelet's eviction signal inside the guest; libvirt sees no guest filesystem",
    "PIDPressure": "the kubelet's eviction signal inside the guest; libvirt sees no guest processes",
    "NetworkUnavailable": "set by a cloud's route controller or a CNI plugin inside the cluster; libvirt sees no "
                          "pod network",
}


def _condition_rule(fields, kind, status, where):
    """The health check's rule for an unhealthyConditions item, or None when it has no effect on libvirt (a
    warning names it and says why). Ready is the guest's readiness (NodeReady), never a running domain; the
    collection's own condition types (the seed's) keep their meaning."""
    if kind is None or status is None:
        return None
    if kind == "Ready":
        return {"type": "NodeReady", "status": status}
    if kind in options.CONDITION_TYPES and kind != "NodeReady":
        if status == "Unknown":
            fields.warn(where + ".status", "%s is read from libvirt and is never Unknown: this rule never matches"
                        % kind)
            return None
        return {"type": kind, "status": status}
    reason = UNOBSERVABLE.get(kind, "no such condition is observed on a libvirt machine")
    fields.warn(where + ".type", "%s: %s; not applied" % (kind, reason))
    return None


GO_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def go_duration(text, field):
    """Seconds of a Go duration (time.ParseDuration, what metav1.Duration reads): a sequence of decimal numbers
    each with a unit (ns, us, ms, s, m, h), ``1.5h``, ``300ms``, ``1h2m3s``; ``0`` alone needs no unit. Negative
    durations are refused (a timeout cannot be)."""
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
    value = str(text).strip()
    if value in ("0", "+0"):
        return 0.0
    body = value[1:] if value.startswith("+") else value
    if value.startswith("-"):
        raise ValidationError("%r is negative; a timeout cannot be" % value, field)
    total, position = 0.0, 0
    while position < len(body):
        match = _GO_PART.match(body, position)
        if match is None or match.group(1) in ("", "."):
            raise ValidationError("%r is not a Go duration such as 300ms, 90s, 1.5h or 1h2m3s" % value, field)
        total += float(match.group(1)) * GO_UNITS[match.group(2)]
        position = match.end()
    if not body:
        raise ValidationError("%r is not a Go duration such as 300ms, 90s, 1.5h or 1h2m3s" % value, field)
    return total


def _owning_set(obj, objects):
    """The MachineSet among the documents that owns Machine ``obj`` (its controller ownerReference), or None: an
    export of a set with its members (``oc get machines,machinesets -o yaml``) lists each member as a Machine."""
    for owner in (obj.doc.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("kind") == "MachineSet" and owner.get("controller") and \
                ("MachineSet", owner.get("name")) in objects:
            return owner["name"]
    return None


def link(obj, objects, fields, _pools=None):
    owner = _owning_set(obj, objects) if obj.kind == "Machine" else None
    if owner is not None:
        obj.role = "member"  # converged by nothing here: its set makes and keeps its members
        fields.warn("metadata.ownerReferences", "a member of MachineSet %s among these documents: the set makes its "
                    "members (named <set>-<suffix>), so it is not applied as a Machine of its own" % owner)
        return
    if "libvirt" in obj.refs:
        target = obj.params["template"] if obj.role == "set" else obj.params
        secrets = {name: found for (kind, name), found in objects.items() if kind == "Secret"}
        upstream.link(obj, target, fields, _pools if hasattr(_pools, "context") else None, secrets)
        return
    secret_ref = obj.refs.get("secret")
    if not secret_ref:
        return
    path, name, key = secret_ref
    secret = objects.get(("Secret", name))
    if secret is None:
        fields.error(path + ".name", "Secret %r is not among the documents" % name)
        return
    text = secret_value(fields, secret.doc, key, path + ".key")
    if text is None:
        return
    target = obj.params["template"] if obj.role == "set" else obj.params
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and "ignition" in document:
        target["ignition"] = document
    else:
        target["cloud_init"] = {"user_data": text}


PHASES = {"Pending": "Provisioned", "Running": "Running", "Shutdown": "Provisioned", "Terminating": "Deleting",
          "Terminated": "Deleting", "Failed": "Failed"}


def status(obj, observed):
    if obj.kind == "Machine":
        machine = observed.get("machine")
        if observed.get("deletion"):
            return {"phase": "Deleting"} if observed["deletion"] == "deleting" else {}
        if machine is None:
            return {"phase": "Provisioning"}
        pool_uuid = "%s/%s" % (machine.get("pool"), machine.get("uuid"))
        if "libvirt" in obj.refs:  # as OpenShift's libvirt provider reports it
            networks = [nic.get("network") for nic in obj.params.get("network_interfaces") or []]
            return {"phase": PHASES.get(machine["phase"], "Provisioning"), "providerID": "libvirt:///" + pool_uuid,
                    "providerStatus": upstream.provider_status(machine),
                    "addresses": upstream.addresses(machine, networks[0] if networks else None),
                    "conditions": machine.get("conditions") or []}
        return {"phase": PHASES.get(machine["phase"], "Provisioning"), "providerID": "libvirt:///" + pool_uuid,
                "providerStatus": {"kind": "LibvirtMachineProviderStatus", "instanceState": machine["phase"],
                                   "pool": machine.get("pool")},
                "addresses": [{"type": "InternalIP", "address": address}
                              for address in machine.get("ip_addresses") or []] +
                [{"type": "Hostname", "address": machine["name"]}],
                "conditions": machine.get("conditions") or []}
    if obj.kind == "MachineSet":
        result = observed.get("set") or {}
        return {"replicas": result.get("replicas", 0), "fullyLabeledReplicas": result.get("replicas", 0),
                "readyReplicas": result.get("ready_replicas", 0),
                "availableReplicas": result.get("available_replicas", 0)}
    if obj.kind == "MachineHealthCheck":
        result = observed.get("check") or {}
        covered = result.get("covered") or 0
        covered = covered if isinstance(covered, int) else len(covered)
        unhealthy = len(result.get("unhealthy") or [])
        # as the machine-api-operator counts: a machine a timeout is still timing is not healthy yet
        return {"expectedMachines": covered, "currentHealthy": covered - unhealthy - len(result.get("waiting") or []),
                "remediationsAllowed": max(0, int(result.get("max_unhealthy") or 0) - unhealthy)}
    return {}


TABLES = {
    "Machine": ("NAME", "PHASE", "TYPE", "REGION", "ZONE", "AGE"),
    "MachineSet": ("NAME", "DESIRED", "CURRENT", "READY", "AVAILABLE", "AGE"),
    "MachineHealthCheck": ("NAME", "MAXUNHEALTHY", "EXPECTEDMACHINES", "CURRENTHEALTHY"),
    "Secret": ("NAME", "TYPE"),
}


def member_row(machine):
    """A MachineSet's member in the Machine table, as ``oc get machines`` lists a set's machines."""
    return (machine["name"], PHASES.get(machine.get("phase"), "Provisioning"), machine.get("machine_class") or "-",
            machine.get("pool") or "-", "", machine.get("age") or "-")


def row(obj, shown, observed):
    if obj.kind == "Machine":
        machine = observed.get("machine") or {}
        return (obj.name, shown.get("phase") or "-", obj.params.get("machine_class") or "-", machine.get("pool") or "-",
                "", machine.get("age") or "-")
    if obj.kind == "MachineSet":
        return (obj.name, str(obj.params.get("replicas")), str(shown.get("replicas")), str(shown.get("readyReplicas")),
                str(shown.get("availableReplicas")), (observed.get("set") or {}).get("age") or "-")
    if obj.kind == "MachineHealthCheck":
        return (obj.name, str(obj.params.get("max_unhealthy", "100%")), str(shown.get("expectedMachines")),
                str(shown.get("currentHealthy")))
    return (obj.name, str(obj.doc.get("type") or "Opaque"))


def export(machine, record_spec):
    value = {"apiVersion": PROVIDER_API, "kind": PROVIDER_KIND, "image": machine.get("image")}
    if machine.get("machine_class"):
        value["machineClass"] = machine["machine_class"]
    else:
        value.update(cpu=machine.get("cpu"), memory=machine.get("memory"))
    if not powered_on(machine):
        value["state"] = "stopped"
    volumes = []
    for vol in record_spec.get("volumes") or []:
        entry = {"name": vol["name"]}
        if vol.get("source") == "volume":
            entry["volume"] = vol["volume"]
        elif vol.get("source") == "image":
            entry["image"] = (vol.get("image") or {}).get("source")
        else:
            from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
            entry["size"] = format_quantity(vol.get("size") or 0)
        volumes.append(entry)
    value["volumes"] = volumes
    value["networkInterfaces"] = [{key: nic[key] for key in ("name", "network", "bridge", "mac") if nic.get(key)}
                                  for nic in record_spec.get("network_interfaces") or []]
    value["machinePool"] = machine.get("pool")
    metadata = {"name": machine["name"]}
    if machine.get("labels"):
        metadata["labels"] = dict(machine["labels"])
    return {"apiVersion": API, "kind": "Machine", "metadata": metadata,
            "spec": {"providerSpec": {"value": value}}}
