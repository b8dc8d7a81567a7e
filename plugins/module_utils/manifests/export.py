# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Existing machines written out as manifests of a dialect (manifest_info): what a machine's record and status
say, in the fields that applying the document reads back, so applying an export to the same pools changes
nothing."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import read_fleet
from ansible_collections.machinery.compute.plugins.module_utils.manifests import (
    ironcore, kupenstack, openshift, vitistack)

EXPORTERS = {"ironcore": ironcore, "openshift": openshift, "kupenstack": kupenstack, "vitistack": vitistack}


def exporter(dialect):
    if dialect in EXPORTERS:
        return EXPORTERS[dialect]
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
    raise ValidationError("exporting to %s is not supported yet; export to %s" % (dialect, " or ".join(EXPORTERS)),
                          "dialect")


def export_machines(entries, dialect, names=None, labels=None):
    """[document] of every machine of the pools (filtered by names and labels), and the pools' warnings."""
    module = exporter(dialect)
    fleet = Fleet(entries)
    try:
        snapshots, contexts, machines = read_fleet(fleet)
        pool_labels = {snapshot["name"]: snapshot.get("labels") or {} for snapshot in snapshots}
        by_uri = {ctx.uri: ctx for ctx in contexts}
        documents = []
        for machine in sorted(machines, key=lambda item: item["name"]):
            if names and machine["name"] not in names:
                continue
            if labels and any((machine.get("labels") or {}).get(k) != v for k, v in labels.items()):
                continue
            dom = lv.lookup_domain(by_uri[machine["uri"]].conn, machine["name"])
            record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))) or {}
            if getattr(module, "EXPORT_NEEDS_POOL", False):  # the image's os, the pool's region and zone
                ctx = by_uri[machine["uri"]]
                image = ctx.registry.get("image-%s" % machine.get("image")) if machine.get("image") else None
                exported = module.export(machine, record.get("spec") or {}, image or {},
                                         pool_labels.get(machine.get("pool")) or {})
            else:
                exported = module.export(machine, record.get("spec") or {})
            documents.extend(exported if isinstance(exported, list) else [exported])
        offline = ["pool %s is offline: %s" % (uri, why) for uri, why in fleet.offline.items()]
    finally:
        fleet.close()
    return documents, offline
