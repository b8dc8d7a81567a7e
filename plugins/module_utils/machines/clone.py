# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clones: a new machine whose root disk is made from another machine's (or one of its snapshots').

- ``full``: the root disk is an independent flat copy (qemu-img convert on the pool host, through libvirt);
  across pools the copy is made on the source's pool and streamed over;
- ``linked``: the source's disk is captured as a base in the image cache of the clone's pool (flat, by checksum,
  as capture.py does) and the root disk is a thin overlay on it. The base is a backing file, so no prune removes
  it while a clone uses it, and deleting the source machine leaves it alone.

The clone is otherwise a new machine: its own name, UUID (libvirt's), MACs (derived from its name), cloud-init
instance id (from its name) and boot configuration. The source must be stopped, or its snapshot given (the stopped
machine is reverted to it for the copy and back); it is held while its disk is read.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines import capture
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

MODES = ("full", "linked")


def clone_source(value, default_uri):
    """The ``clone_from`` option checked: {uri, machine, snapshot, mode}."""
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping with machine (and uri, snapshot, mode)", "clone_from")
    unknown = sorted(str(key) for key in value if key not in ("uri", "machine", "snapshot", "mode"))
    if unknown:
        raise ValidationError("unknown key %s; it takes uri, machine, snapshot, mode" % ", ".join(unknown),
                              "clone_from")
    snapshot = value.get("snapshot")
    return {"uri": value.get("uri") or default_uri,
            "machine": check.dns_label(value.get("machine"), "clone_from.machine"),
            "snapshot": check.dns_label(snapshot, "clone_from.snapshot") if snapshot else None,
            "mode": check.one_of(value.get("mode") or options.option(options.CLONE_SOURCE, "mode").default, MODES,
                                 "clone_from.mode")}


def source_context(ctx, uri):
    """The PoolContext of the source's pool: ``ctx`` itself, or one over a connection opened once a run."""
    if uri == ctx.uri:
        return ctx
    sources = ctx.__dict__.setdefault("clone_sources", {})
    if uri not in sources:
        conn = ctx.peer_connections.get(uri) or lv.open_connection(uri, "clone_from.uri")
        ctx.peer_connections.setdefault(uri, conn)
        sources[uri] = PoolContext(conn, uri, ctx.coordination)
    return sources[uri]


def image_facts(ctx, value, name):
    """The image facts (as machine_spec.resolve makes them) of a clone's root: read only; the source refused with
    the reason when it cannot be copied."""
    source = clone_source(value, ctx.uri)
    if source["machine"] == name and source["uri"] == ctx.uri:
        raise ValidationError("a machine cannot be cloned from itself", "clone_from.machine")
    origin = source_context(ctx, source["uri"])
    seen = capture.observe_source(origin, source["machine"])
    problem = capture.refusal(seen, source, False, option="clone_from")
    if problem is not None:
        raise problem
    where = "%s/%s%s" % (seen["pool"], source["machine"], "@%s" % source["snapshot"] if source["snapshot"] else "")
    image = {"source": "clone:" + where,
             "checksum": None, "virtual_size": seen["root_size"], "clone": dict(source, path=seen["root"]["path"])}
    return {"image": image, "format": "qcow2", "size": seen["root_size"]}


def holds(ctx, spec):
    """The hold on the source machine of a clone being created: its disk is read, and reverted for a snapshot."""
    clone = ((spec or {}).get("image") or {}).get("clone")
    if not clone:
        return []
    origin = source_context(ctx, clone["uri"])
    return [origin.coordination.of(origin, clone["machine"], field="clone_from.machine")]


def linked_base(ctx, clone, name):
    """(cached base volume, its checksum) on the clone's pool."""
    origin = source_context(ctx, clone["uri"])
    return capture.captured_base(origin, ctx, clone["machine"], clone["path"], clone["snapshot"],
                                 capture.scratch_name(name, clone["machine"]))


def full_root(ctx, clone, volume_name, capacity):
    """The clone's root volume ``volume_name``: a flat copy of the source's disk, at least ``capacity`` bytes."""
    origin = source_context(ctx, clone["uri"])
    if origin is ctx:
        return capture.copy_root(ctx.conn, ctx.storage, clone["machine"], clone["path"], clone["snapshot"],
                                 volume_name, capacity)
    scratch = capture.scratch_name(volume_name.rsplit("-root", 1)[0], clone["machine"])
    flat = capture.copy_root(origin.conn, origin.storage, clone["machine"], clone["path"], clone["snapshot"],
                             scratch)
    try:
        length = flat.infoFlags(lv.libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
        vol = storage.create_volume(ctx.storage, volume_name, max(length, 1), "raw", replace=True)
        capture.stream_copy(origin.conn, flat, ctx.conn, vol)
    finally:
        storage.delete_volume(origin.storage, scratch)
    storage.refresh(ctx.storage)
    vol = ctx.storage.storageVolLookupByName(volume_name)
    if vol.info()[1] < capacity:
        writer.write(vol, "resize", capacity, 0)
    return vol
