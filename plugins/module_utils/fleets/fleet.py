# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading a fleet of pools: the ``pools`` option, one connection per pool, and snapshots read in parallel
where an unreachable pool is Offline with its cause, never an exception. The scheduler lookup, machine_batch,
the info modules and the inventory all read pools through here."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import Coordination
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_classes


def pool_entries(items, field="pools"):
    """Normalize ``pools``: URIs or {name, uri} mappings -> [{name or None, uri}]."""
    if not isinstance(items, list) or not items:
        raise ValidationError("give a list of libvirt URIs or of mappings with name and uri", field)
    entries = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            item = {"uri": item}
        if not isinstance(item, dict) or not item.get("uri"):
            raise ValidationError("needs a uri", "%s[%d]" % (field, index))
        entries.append({"name": item.get("name"), "uri": lv.validate_uri(item["uri"], "%s[%d].uri" % (field,
                                                                                                      index))})
    return entries


def snapshot_of(ctx, given_name=None):
    """What the scheduler needs of one connected pool, in raw numbers."""
    registration = ctx.registration
    ctx.listing()  # read now: the run's listing, which its machines' first observations take too
    sizes = ctx.machine_sizes()
    snapshot = {"name": (registration or {}).get("name") or given_name or ctx.uri, "uri": ctx.uri,
                "labels": {}, "taints": [], "classes": {}, "machines": [size.name for size in sizes],
                "allocated": {"cpu": round(sum(size.cpu or 0 for size in sizes), 3),
                              "memory": sum(size.memory or 0 for size in sizes)},
                "allocatable": {"cpu": 0, "memory": 0}, "state": "Error", "problem": None}
    if not registration:
        snapshot["problem"] = "not registered (run machinery.compute.machine_pool)"
        return snapshot
    host = capacity.capacity_of(ctx.conn)
    status = capacity.pool_status(ctx, registration, sizes, host)
    # storage as admission counts it: thin disks by their virtual size against the registered allocatable
    snapshot["storage"] = {"allocatable": capacity.storage_allocatable(ctx.storage_size(), registration),
                           "allocated": capacity.disks_allocated(sizes)}
    snapshot["server_groups"] = {size.name: dict(size.server_group) for size in sizes if size.server_group}
    snapshot.update(labels=registration.get("labels") or {}, taints=registration.get("taints") or [],
                    classes={name: {"cpu": body["cpu"], "memory": body["memory"]}
                             for name, body in published_classes(ctx.registry).items()},
                    allocatable=capacity.allocatable_for(host, registration),
                    state=status["state"], problem="; ".join(status["problems"]) or None, status=status)
    return snapshot


def offline_snapshot(entry, problem):
    """A pool that could not be read: Offline, with nothing to offer."""
    return {"name": entry.get("name") or entry["uri"], "uri": entry["uri"], "state": "Offline",
            "problem": problem, "labels": {}, "taints": [], "classes": {}, "machines": [],
            "allocated": {"cpu": 0, "memory": 0}, "allocatable": {"cpu": 0, "memory": 0}}


def in_parallel(entries, work, workers=16):
    """``work(entry)`` for every pool entry on up to ``workers`` threads, results in the order given."""
    if not entries:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(entries)))) as executor:
        return list(executor.map(work, entries))


def read_each(entries, read, offline, workers=16):
    """The fleet reader: connect to every pool in parallel (one connection each) and ``read(ctx, entry)``; a
    pool that cannot be reached or read gives ``offline(entry, cause)`` instead of failing the others."""
    lv.require_libvirt()

    def one(entry):
        try:
            with lv.Connection(entry["uri"], name=entry.get("name")) as conn:
                return read(PoolContext(conn, entry["uri"]), entry)
        except lv.libvirt.libvirtError as exc:
            return offline(entry, lv.describe(exc))
        except MachineryError as exc:
            return offline(entry, str(exc))
    return in_parallel(entries, one, workers)


def read_snapshots(entries, workers=16):
    """Snapshots of every pool, read in parallel with one connection each, in the order given."""
    return read_each(entries, lambda ctx, entry: snapshot_of(ctx, entry.get("name")), offline_snapshot, workers)


class Fleet:
    """Open connections to every pool; pools that cannot be reached are kept as Offline snapshots."""

    def __init__(self, entries, opener=None, coordination=None):
        self.entries = entries
        self.contexts = {}
        self.coordination = coordination if coordination is not None else Coordination()
        self.offline = {}

        def connect(entry):
            try:
                return lv.open_connection(entry["uri"], "pools", entry.get("name"))
            except MachineryError as exc:
                return exc
        # Opened side by side: over ssh or TLS each connection costs a handshake, and they add up in a row.
        for entry, conn in zip(entries, in_parallel(entries, connect)):
            if isinstance(conn, MachineryError):
                self.offline[entry["uri"]] = str(conn)
                continue
            ctx = PoolContext(conn, entry["uri"], self.coordination)
            ctx.url_opener = opener
            self.contexts[entry["uri"]] = ctx
        for ctx in self.contexts.values():
            ctx.peer_connections = {uri: other.conn for uri, other in self.contexts.items() if uri != ctx.uri}

    @property
    def uris(self):
        return [entry["uri"] for entry in self.entries]

    def snapshots(self):
        """Fresh snapshots of every pool, read in parallel (registry reads are re-done)."""
        def take(entry):
            ctx = self.contexts.get(entry["uri"])
            if ctx is None:
                return offline_snapshot(entry, self.offline[entry["uri"]])
            try:
                ctx.forget_reads()
                snapshot = snapshot_of(ctx, entry.get("name"))
                ctx.prime()
            except lv.libvirt.libvirtError as exc:  # its daemon went away since the run began
                return offline_snapshot(entry, lv.describe(exc))
            except MachineryError as exc:
                return offline_snapshot(entry, str(exc))
            return snapshot
        return in_parallel(self.entries, take, len(self.entries))

    def close(self):
        for ctx in self.contexts.values():
            try:
                ctx.conn.close()
            except lv.libvirt.libvirtError:
                pass
