# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What becomes of every field of a dialect's schema, kept as data (the conformance issue).

A user of IronCore, OpenShift, KupenStack or vitistack judges the collection field by field: each field their
schema allows is applied, refused naming it, or warned about naming it; never silently ignored. Each dialect
keeps one table per kind, ``{path: verdict}``, with every field path its source document allows (``[]`` stands
for any list index; ``*`` for any key of a free-form mapping). A verdict is ``APPLIED`` (the reader turns it into
what a core takes), ``warned(reason)`` or ``refused(reason)``: the reason says why it has no effect on libvirt.

Warned and refused fields are acted on here, from the table alone, so a field cannot be classified and then
forgotten; tests/unit checks that the tables cover the seeds' schemas and that the readers read no field the
table does not list.
"""

from __future__ import annotations

APPLIED = ("applied", None)


def warned(reason):
    return ("warned", reason)


def refused(reason):
    return ("refused", reason)


# The metadata every kind shares. Server-populated fields have no meaning for libvirt: warned, so a document
# copied from `kubectl get -o yaml` is accepted and the user told what was left behind.
SERVER_SET = warned("set by a Kubernetes API server; libvirt keeps no such field and it is not applied")
METADATA = {
    "apiVersion": APPLIED, "kind": APPLIED, "metadata.name": APPLIED, "metadata.labels.*": APPLIED,
    "metadata.namespace": warned("libvirt pools have no namespaces: names are unique per pool, the namespace is "
                                 "not kept"),
    "metadata.annotations.*": warned("annotations are not kept on libvirt pools"),
    "metadata.uid": SERVER_SET, "metadata.resourceVersion": SERVER_SET, "metadata.generation": SERVER_SET,
    "metadata.creationTimestamp": SERVER_SET, "metadata.managedFields": SERVER_SET,
    # what `kubectl get -o yaml` / `oc get -o yaml` exports beside them (issue 39): a round trip applies
    "metadata.finalizers": warned("finalizers hold a Kubernetes object's deletion for its controllers; libvirt "
                                  "deletes a machine when the documents say so: not applied"),
    "metadata.ownerReferences": warned("owners are Kubernetes objects; a set's members are known by its labels "
                                       "on the pools: not applied"),
    "metadata.generateName": warned("metadata.name names the object; a name prefix to generate one from is not "
                                    "applied"),
    "metadata.deletionTimestamp": SERVER_SET, "metadata.deletionGracePeriodSeconds": SERVER_SET,
    "metadata.selfLink": SERVER_SET,
    "status": warned("status is reported by the run from libvirt, never read from the document"),
}


def table(kind_fields, **overrides):
    """A kind's table: the shared metadata, then the kind's own fields."""
    result = dict(METADATA)
    result.update(overrides)
    result.update(kind_fields)
    return result


def lookup(fields_table, where, parent):
    """The verdict of the field at ``where`` (its mapping at ``parent``), or None when the table does not list
    it: its own path, else ``<parent>.*`` (any key of a free-form mapping such as labels)."""
    found = fields_table.get(generic(where))
    if found is None and parent is not None:
        found = fields_table.get(generic(parent) + ".*")
    return found


def generic(path):
    """``spec.volumes[2].name`` -> ``spec.volumes[].name``."""
    out, depth = [], 0
    for char in path:
        if char == "[":
            depth += 1
            out.append("[")
        elif char == "]":
            depth -= 1
            out.append("]")
        elif depth == 0:
            out.append(char)
    return "".join(out)


def _is_set(value):
    return value not in (None, False, "", [], {})


def walk(value, path=""):
    """(concrete path, path of its mapping, value) of every field of a document, containers included, depth
    first. Keys may hold dots (labels, annotations): the parent path is kept rather than split back out."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = "%s.%s" % (path, key) if path else str(key)
            yield where, path or None, item
            yield from walk(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)):
                yield from walk(item, "%s[%d]" % (path, index))


def act(fields, doc, fields_table):
    """Warn about, or refuse, each field of ``doc`` the table classifies so, once per field (the outermost
    classified container), naming its path and the reason."""
    done = []
    for where, parent, value in walk(doc):
        if not _is_set(value) or any(where.startswith(prefix + ".") or where.startswith(prefix + "[")
                                     for prefix in done):
            continue
        found = lookup(fields_table, where, parent)
        if found is None or found[0] == "applied":
            continue
        done.append(where)
        if found[0] == "warned":
            fields.warn(where, found[1])
        else:
            fields.error(where, found[1])
