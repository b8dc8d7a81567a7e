# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission on a pool: its lock (taken in URI order across the pools a name must be unique on) and the
capacity check made under it, so concurrent runs neither double-book a pool nor create one name twice."""

from __future__ import annotations

import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils import capacity
from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import registry as reg
from ansible_collections.machinery.compute.plugins.module_utils.errors import NameTaken, PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity


# A run converging many machines (machine_batch, machine_set) admits them one after another on the same pools:
# the threads hand the pools' admission locks over to each other instead of giving them back to libvirt and
# taking them again (four storage volume calls a pool per machine), for at most HAND_OVER_SECONDS, so other runs
# still get their turn; the last admission of the process to leave gives them back.
HAND_OVER_SECONDS = 5.0


class Admission:
    """The admission locks of this pool and of the peer pools a name must be unique across.

    Locks are taken in the order of their URIs, so concurrent runs never wait on each other in a circle. Under
    them, a name found on a peer pool means another run created it there first."""

    _process_locks = {}
    _process_locks_guard = threading.Lock()
    _kept = {}  # uri -> (registry.AdmissionLock, monotonic time it was taken): held, handed over within the process
    _inside = 0  # admissions of this process entered and not left

    def __init__(self, ctx, peer_uris):
        self.ctx = ctx
        self.peers = []
        self.opened = []
        for uri in sorted(set(peer_uris) - {ctx.uri}):
            conn = ctx.peer_connections.get(uri)
            if conn is None:
                conn = lv.open_connection(uri, "unique_across")
                self.opened.append(conn)
            self.peers.append((uri, conn))
        self.locks = []
        self.held = []
        self.counted = False

    @classmethod
    def process_lock(cls, uri):
        """Threads of one run queue here before taking the pool's volume lock, instead of polling it."""
        with cls._process_locks_guard:
            return cls._process_locks.setdefault(uri, threading.Lock())

    def __enter__(self):
        holders = [(self.ctx.uri, self.ctx.conn)] + self.peers
        with self._process_locks_guard:
            Admission._inside += 1
            self.counted = True
        try:
            for uri, conn in sorted(holders, key=lambda holder: holder[0]):
                local = self.process_lock(uri)
                local.acquire()
                self.held.append(local)
                with self._process_locks_guard:
                    kept = Admission._kept.pop(uri, None)
                if kept is not None and time.monotonic() - kept[1] < HAND_OVER_SECONDS:
                    self.locks.append((uri, conn, kept))
                    continue
                if kept is not None:  # held long enough: other runs get their turn
                    kept[0].release()
                registry_pool = lv.lookup_storage_pool(conn, reg.REGISTRY_POOL)
                if registry_pool is not None:
                    self.locks.append((uri, conn, (reg.AdmissionLock(conn, registry_pool).acquire(),
                                                   time.monotonic())))
        except BaseException:
            self.__exit__()
            raise
        return self

    def check_unique(self, name):
        for uri, conn in self.peers:
            if lv.lookup_domain(conn, name) is not None:
                raise NameTaken("a machine named %s already exists on pool %s" % (name, uri), "name")

    def __exit__(self, *exc_info):
        giving_back = []
        with self._process_locks_guard:
            if self.counted:
                Admission._inside -= 1
                self.counted = False
            others = Admission._inside > 0
            for uri, conn, (lock, taken) in self.locks:
                if others and conn not in self.opened and time.monotonic() - taken < HAND_OVER_SECONDS:
                    Admission._kept[uri] = (lock, taken)
                else:
                    giving_back.append(lock)
            if not others:  # the last one out: nothing stays held after the run
                giving_back += [lock for lock, _taken in Admission._kept.values()]
                Admission._kept.clear()
        for lock in reversed(giving_back):
            lock.release()
        self.locks = []
        for local in reversed(self.held):
            local.release()
        self.held = []
        for conn in self.opened:
            try:
                conn.close()
            except lv.libvirt.libvirtError:
                pass
        self.opened = []
        self.peers = []
        return False


def check_room(ctx, spec, disks=None, locked=False):
    """Refuse a machine the pool has no room for: the machines already defined there (other than this one)
    plus ``spec`` must fit in what the pool's registration makes allocatable, and so must the new ``disks``
    ([(field, virtual bytes)]) in its storage.

    A plan checks against the pool as this run listed it (when it did); under the admission lock (``locked``)
    the sizes are read as they are now."""
    registration = ctx.registration
    if not registration:
        return
    if locked:
        sizes = capacity.current_sizes(ctx.conn, ctx.records)
    else:
        sizes = capacity.machine_sizes(ctx.conn, ctx.listed())
    allocatable = capacity.registered_allocatable(ctx.conn, registration)
    others = [size for size in sizes if size[0] != spec["name"]]
    used_cpu = sum(size[1] or 0 for size in others)
    used_memory = sum(size[2] or 0 for size in others)
    if used_cpu + spec["cpu"] > allocatable["cpu"] or used_memory + spec["memory"] > allocatable["memory"]:
        raise PoolFull("pool %s is full: %d/%d cpu and %s/%s memory are allocated, %s needs %d cpu and %s"
                       % (ctx.name, used_cpu, allocatable["cpu"], format_quantity(used_memory),
                          format_quantity(allocatable["memory"]), spec["name"], spec["cpu"],
                          format_quantity(spec["memory"])), "machine_pool")
    check_storage(ctx, disks or [], sizes)


def check_storage(ctx, disks, sizes=None):
    """Refuse new disks ([(field, virtual bytes)]) that do not fit in the storage the pool's registration
    makes allocatable (thin disks count their virtual size); the error names the field of the disk that
    does not fit."""
    registration = ctx.registration
    if not registration or not disks:
        return
    sizes = capacity.machine_sizes(ctx.conn) if sizes is None else sizes
    storage = capacity.storage_of(ctx.conn)
    allocatable = capacity.storage_allocatable(storage, registration)
    used = capacity.disks_allocated(sizes)
    for field, size in disks:
        if used + size > allocatable:
            raise PoolFull("does not fit in the storage of pool %s: %s of %s are allocated (storage overcommit %s), "
                           "this disk needs %s more" % (ctx.name, format_quantity(used), format_quantity(allocatable),
                                                        (registration.get("overcommit") or {}).get("storage", 1.0),
                                                        format_quantity(size)), field)
        used += size
