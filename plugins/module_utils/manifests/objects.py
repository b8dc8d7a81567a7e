# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One document of a manifest as the engine handles it, whatever its dialect."""

from __future__ import annotations

import re

# roles: what each object becomes for the cores
ROLES = ("class", "pool", "secret", "volume", "nic", "machine", "set", "check")


class ManifestObject:
    """A document: its kind, name and dialect, the parameters of the core it maps onto (``params``), facts
    of kinds that are no machine (``data``) and the references it makes (``refs``)."""

    def __init__(self, origin, doc, dialect, api_version, kind, name, labels):
        self.origin = origin
        self.doc = doc
        self.dialect = dialect
        self.api_version = api_version
        self.kind = kind
        self.name = name
        self.labels = labels or {}
        self.role = None
        self.params = {}
        self.data = {}
        self.refs = {}
        # a machine option's path (``volumes[0].size``) -> the document's (``spec.volumes[0].emptyDisk.sizeLimit``)
        self.where = {}

    @property
    def ref(self):
        return "%s/%s" % (self.kind, self.name)

    @property
    def key(self):
        return (self.kind, self.name)

    def __repr__(self):
        return "ManifestObject(%s)" % self.ref


def machine_object(obj, params, refs, role="machine"):
    obj.role = role
    obj.params = params
    obj.refs = refs
    return obj


def document_path(obj, field):
    """The document's path of a core's ``field`` (``volumes[0].size``): the object's own record of it, else that
    of its longest recorded prefix with the rest appended, else None."""
    if not field:
        return None
    if field in obj.where:
        return obj.where[field]
    parts = re.split(r"(?=[.\[])", field)
    for cut in range(len(parts) - 1, 0, -1):
        head = "".join(parts[:cut])
        if head in obj.where:
            return obj.where[head] + "".join(parts[cut:])
    return None


def columns(header, rows):
    """kubectl get style lines: columns padded to their widest cell, three spaces apart."""
    rows = [tuple(header)] + [tuple("-" if cell is None else str(cell) for cell in row) for row in rows]
    widths = [max(len(row[index]) for row in rows) for index in range(len(header))]
    return ["   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
