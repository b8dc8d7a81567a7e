# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documents as Go writes them: the zero values of fields without ``omitempty`` read as unset.

encoding/json writes every field of a Go struct whose tag has no ``omitempty``, whether it was set or not, and
writes a struct (``metav1.Time``, an embedded ``ObjectMeta``) even with ``omitempty``. So what an API server,
``oc get -o yaml`` or openshift/installer prints carries ``ignKey: ""``, ``cloudInit: null`` or
``creationTimestamp: null`` for fields nobody set. Each table here lists, for one kind, the field paths (as the
conformance tables write them: ``[]`` for any list item) that the upstream Go type writes without
``omitempty`` and the zero value it writes for them; ``unset`` takes them out of a copy of the document before
it is read, so such a field reads exactly as if it were absent: a required one is then "required value", an
optional one has its default. A zero value is matched by type as well (``0`` is not ``false``), and only at
these paths: a user's own ``""`` elsewhere stays an error naming its field.

Sources: openshift/api ``machine/v1beta1`` (types_machine.go, types_machineset.go,
types_machinehealthcheck.go), openshift/cluster-api-provider-libvirt ``pkg/apis/libvirtproviderconfig/v1beta1``
(LibvirtMachineProviderConfig, Ignition, CloudInit, Volume), k8s.io/apimachinery ``metav1.ObjectMeta``.
"""

from __future__ import annotations

import copy

# metav1.ObjectMeta: CreationTimestamp is a metav1.Time, a struct, so omitempty never drops it; its zero
# marshals as null. Every object's metadata, and every embedded ObjectMeta of the older Machine API (a
# MachineSet template's and a MachineSpec's metadata were metav1.ObjectMeta before openshift/api had its own).
OBJECT_META = {"metadata.creationTimestamp": None}

# LibvirtMachineProviderConfig: every field but volume.volumeSize is written without omitempty.
LIBVIRT_PROVIDER = {
    "domainMemory": 0, "domainVcpu": 0, "ignKey": "", "ignition": None, "cloudInit": None, "volume": None,
    "networkInterfaceName": "", "networkInterfaceHostname": "", "networkInterfaceAddress": "", "networkUUID": "",
    "autostart": False, "uri": "",
    "ignition.userDataSecret": "",
    "cloudInit.userDataSecret": "", "cloudInit.sshAccess": False,
    "volume.poolName": "", "volume.baseVolumeID": "", "volume.volumeName": "",
}

# openshift/api MachineSpec, under spec (a Machine) or spec.template.spec (a MachineSet). Its metadata and
# lifecycleHooks are structs ({} when empty, dropped as empty by the conformance tables already); the older
# metav1.ObjectMeta metadata carries creationTimestamp: null.
MACHINE_SPEC = {"metadata.creationTimestamp": None}


def _under(prefix, table):
    return {"%s.%s" % (prefix, path): zero for path, zero in table.items()}


MACHINE_API = {  # kind -> {path: the zero value Go writes there}
    "Machine": dict(OBJECT_META, **dict(_under("spec", MACHINE_SPEC),
                                        **_under("spec.providerSpec.value", LIBVIRT_PROVIDER))),
    "MachineSet": dict(OBJECT_META, **dict(
        _under("spec.template", OBJECT_META), **dict(
            _under("spec.template.spec", MACHINE_SPEC),
            **dict(_under("spec.template.spec.providerSpec.value", LIBVIRT_PROVIDER),
                   # MachineSetStatus.Replicas has no omitempty: every status carries replicas: 0
                   **{"status.replicas": 0})))),
    "MachineHealthCheck": dict(OBJECT_META, **{
        # UnhealthyConditions is a slice without omitempty: nil marshals as null
        "spec.unhealthyConditions": None,
        # an UnhealthyCondition's type and status are strings without omitempty
        "spec.unhealthyConditions[].type": "", "spec.unhealthyConditions[].status": "",
        # MachineHealthCheckStatus: two *int and an int32 without omitempty
        "status.expectedMachines": None, "status.currentHealthy": None, "status.remediationsAllowed": 0}),
}


def is_zero(value, zero):
    """Whether ``value`` is Go's ``zero``: equal and of the same type (``0`` is no ``false``, ``""`` no null)."""
    if zero is None:
        return value is None
    return type(value) is type(zero) and value == zero


def _without(value, parts, zero):
    """``value`` without the field at ``parts`` (a path split at dots, ``name[]`` for every item of a list) when
    it holds ``zero``; the very same object when nothing is taken out. Only the mappings and lists on the way
    to a field taken out are copied (shallow), so the document handed in is never changed. The mappings are
    read through dict's own methods: a reader's document may be a mapping that records what is read."""
    if not isinstance(value, dict) or not dict.__contains__(value, parts[0].rstrip("[]")):
        return value
    head, rest = parts[0], parts[1:]
    listed = head.endswith("[]")
    key = head[:-2] if listed else head
    child = dict.__getitem__(value, key)
    if not rest:
        if listed or not is_zero(child, zero):
            return value
        result = copy.copy(value)
        dict.__delitem__(result, key)
        return result
    if listed:
        if not isinstance(child, list):
            return value
        items = [_without(item, rest, zero) for item in child]
        changed = items if any(new is not old for new, old in zip(items, child)) else child
    else:
        changed = _without(child, rest, zero)
    if changed is child:
        return value
    result = copy.copy(value)
    dict.__setitem__(result, key, changed)
    return result


def unset(doc, zeros):
    """``doc`` without the fields that hold, at a path of ``zeros``, the zero value Go writes there (a copy when
    one is taken out). Deeper paths go first, so a parent is judged after its children are taken out."""
    for path in sorted(zeros, key=lambda found: -found.count(".")):
        doc = _without(doc, path.split("."), zeros[path])
    return doc


def unset_zero_values(kind, doc):
    """``doc``, a Machine API document of ``kind``, with the zero values Go writes for it read as unset."""
    zeros = MACHINE_API.get(kind)
    return unset(doc, zeros) if zeros and isinstance(doc, dict) else doc
