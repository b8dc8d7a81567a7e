# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission on a pool: its lock (taken in URI order across the pools a name must be unique on) and the
capacity check made under it, so concurrent runs neither double-book a pool nor create one name twice."""

from __future__ import annotations

import itertools
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.pools import capacity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals as journal
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules as rules
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents as reg
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, NameTaken, PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity


# A run converging many machines (machine_batch, machine_set) admits them on the same pools from many threads. The
# process holds each pool's libvirt admission lock once for all of them (a share per admission using it) instead of
# giving it back and taking it again per machine (four storage volume calls a pool per machine), and only the
# pool a machine is created on is exclusive to one thread at a time (its capacity check and create): machines
# bound for different pools are admitted in parallel even when their names must be unique across all of them.
# After HAND_OVER_SECONDS a held lock takes no new shares until the ones in flight have left; then it goes back to
# libvirt, so other runs get their turn; the last admission of the process to leave gives every lock back.
HAND_OVER_SECONDS = 5.0


class _PoolHold:
    """This process's hold on one pool's admission lock, shared by the admissions of its threads."""

    __slots__ = ("lock", "conn", "held", "busy", "taken", "users", "closing", "names", "epoch", "wave")

    def __init__(self):
        self.lock = None  # registry.AdmissionLock, or None for a pool without a registry (nothing to lock)
        self.conn = None
        self.held = False
        self.busy = False  # a thread is taking or giving back the libvirt lock, outside the guard
        self.taken = 0.0
        self.users = 0
        self.closing = False  # held over a connection an admission opened itself: give back when unused
        # the pool's domain names when the lock was taken, plus those admitted since: while the lock is held no
        # other run creates a domain there, so a name not in it needs no lookup (one in it is looked up)
        self.names = None
        self.epoch = None  # a number of its own each time the lock is taken from libvirt (registry.Registry.put)
        self.wave = None  # journal.Wave of the creates admitted in this epoch, deleted before the lock goes back

    def stale(self):
        return self.closing or time.monotonic() - self.taken >= HAND_OVER_SECONDS


def _end_wave(wave, epoch):
    """Delete the wave of a hold (journal.Wave, or None) before its lock goes back: every create it lists has
    ended. One that cannot be deleted now is removed as a dead run's by the next holder of the lock."""
    if wave is None:
        return
    try:
        wave.delete(epoch)
    except (MachineryError, lv.libvirt.libvirtError):
        pass


class Admission:
    """The admission locks of this pool and of the peer pools a name must be unique across, and this pool (and
    the machine's name) to this thread alone within the process.

    Locks are taken in the order of their URIs, so concurrent runs never wait on each other in a circle. Under
    them, a name found on a peer pool means another run created it there first."""

    _guard = threading.Condition()
    _holds = {}  # uri -> _PoolHold
    _targets = {}  # uri -> threading.Lock: one thread of the process admits onto a pool at a time
    _names = set()  # machine names being admitted by a thread of this process
    _inside = 0  # admissions of this process entered and not left
    _claimed = {}  # uri -> names of the machines this process holds for a create there (claim)
    _epochs = itertools.count(1)

    def __init__(self, ctx, peer_uris, name=None):
        self.ctx = ctx
        self.name = name
        self.peers = []
        self.opened = []
        for uri in sorted(set(peer_uris) - {ctx.uri}):
            conn = ctx.peer_connections.get(uri)
            if conn is None:
                conn = lv.open_connection(uri, "unique_across")
                self.opened.append(conn)
            self.peers.append((uri, conn))
        self.shared = []
        self.epoch = None  # of this pool's lock, held by the process unbroken while this admission is inside
        self.target = None
        self.named = False
        self.counted = False

    @classmethod
    def process_lock(cls, uri):
        with cls._guard:
            return cls._targets.setdefault(uri, threading.Lock())

    def __enter__(self):
        holders = [(self.ctx.uri, self.ctx.conn)] + self.peers
        with self._guard:
            Admission._inside += 1
            self.counted = True
        try:
            for uri, conn in sorted(holders, key=lambda holder: holder[0]):
                self._share(uri, conn)
                self.shared.append(uri)
            if self.name is not None:
                with self._guard:
                    while self.name in Admission._names:
                        self._guard.wait()
                    Admission._names.add(self.name)
                    self.named = True
            self.target = self.process_lock(self.ctx.uri)
            self.target.acquire()
            hold = Admission._holds[self.ctx.uri]
            self.epoch = hold.epoch if hold.lock is not None else None
        except BaseException:
            self.target = None
            self.__exit__()
            raise
        return self

    def _share(self, uri, conn):
        """A share of the pool's admission lock: taken from libvirt by the first admission that needs it."""
        guard = self._guard
        with guard:
            while True:
                hold = Admission._holds.setdefault(uri, _PoolHold())
                if hold.busy or (hold.held and hold.stale() and hold.users):
                    guard.wait()  # taken or given back by another thread, or draining before it goes back
                    continue
                if hold.held and not hold.stale():
                    hold.users += 1
                    return
                # free, or held long enough and unused: (give it back and) take it from libvirt again; idle holds of
                # pools that sort after it go back first, so this thread never waits while holding them
                giving_back = [other for other_uri, other in Admission._holds.items()
                               if other_uri > uri and other.held and not other.users and not other.busy]
                for other in giving_back:
                    other.busy = True
                expired, hold.lock, hold.held, hold.busy = hold.lock, None, False, True
                expired_wave, hold.wave = hold.wave, None
                break
        try:
            self._give_back(giving_back)
            if expired is not None:
                _end_wave(expired_wave, hold.epoch)
                expired.release()
            registry_pool = lv.lookup_storage_pool(conn, reg.REGISTRY_POOL)
            lock = reg.AdmissionLock(conn, registry_pool).acquire() if registry_pool is not None else None
            names = {dom.name() for dom in conn.listAllDomains(0)} if lock is not None else None
        except BaseException:
            with guard:
                hold.busy = False
                guard.notify_all()
            raise
        with guard:
            hold.lock, hold.conn, hold.held, hold.busy, hold.names = lock, conn, True, False, names
            hold.epoch = next(Admission._epochs)
            hold.taken = time.monotonic()
            hold.closing = any(conn is opened for opened in self.opened)
            hold.users = 1
            guard.notify_all()

    def _give_back(self, holds):
        try:
            for hold in holds:
                wave, hold.wave = hold.wave, None
                _end_wave(wave, hold.epoch)
                if hold.lock is not None:
                    hold.lock.release()
        finally:
            with self._guard:
                for hold in holds:
                    hold.lock, hold.conn, hold.held, hold.busy, hold.users = None, None, False, False, 0
                    hold.names, hold.wave = None, None
                self._guard.notify_all()

    def journal(self, name, volumes):
        """List the create of ``name`` and the ``volumes`` it makes in this epoch's wave on the pool (journal.py)
        before any of them is made. The first create of an epoch removes what dead runs' waves list, and writes
        the wave with every create the run has planned on the pool (PoolContext.planned_creates), so the others
        of the epoch find themselves listed and write nothing."""
        hold = Admission._holds[self.ctx.uri]
        if hold.lock is None:
            return  # a pool without a registry: nothing to journal in
        if hold.wave is None:
            self.clean_dead_waves()  # this epoch's own is not written yet: every wave there is a dead run's
            hold.wave = journal.Wave(self.ctx.registry, journal.wave_key(self.epoch))
        if not hold.wave.lists(name, volumes):
            machines = dict(hold.wave.machines)
            machines.update(self.ctx.planned_creates.copy())  # other threads plan meanwhile
            machines[name] = volumes
            hold.wave.write(machines, self.epoch)

    def clean_dead_waves(self):
        """Under the lock: remove what every wave on the pool but this epoch's lists (all are dead runs')."""
        hold = Admission._holds[self.ctx.uri]
        own = hold.wave.key if hold.wave is not None else None
        registry = self.ctx.registry
        with self._guard:
            claimed = set(Admission._claimed.get(self.ctx.uri, ()))
        journal.clean_waves(self.ctx, [key for key in registry.keys(journal.WAVE_PREFIX, self.epoch) if key != own],
                            self.epoch, claimed)

    def claim(self, name):
        """Hold machine ``name`` on the pool for its create (registry.claim), once this epoch's wave lists it: a
        handle to give to ``unclaim``, True on a pool without a registry (nothing to hold), or None when another
        run holds the machine (the caller lets the lock go and waits for that hold)."""
        hold = Admission._holds[self.ctx.uri]
        if hold.lock is None:
            return True
        volume = reg.claim(self.ctx.registry.pool, name)
        if volume is not None:
            with self._guard:
                Admission._claimed.setdefault(self.ctx.uri, set()).add(name)
        return volume

    def unclaim(self, name, volume):
        """Give back the hold ``claim`` took, before this admission leaves (so before the wave goes)."""
        if volume is True or volume is None:
            return
        try:
            reg.unclaim(self.ctx.registry.pool, volume, name)
        finally:
            with self._guard:
                Admission._claimed.get(self.ctx.uri, set()).discard(name)

    def step_aside(self):
        """Let the next admission of this process onto the pool (and of the name) in while this one keeps its
        share of the locks: the create is made, and what follows it (its start) needs no room check, only the wave
        to stay. Leaving does it first."""
        if self.target is not None:
            self.target.release()
            self.target = None
        with self._guard:
            if self.named:
                Admission._names.discard(self.name)
                names = Admission._holds[self.ctx.uri].names
                if names is not None:
                    names.add(self.name)  # created, or maybe: the next admission of the name looks it up
                self.named = False
                self._guard.notify_all()

    def may_exist(self, name):
        """Whether a domain ``name`` may be defined on the pool: not when the names listed as the lock was taken
        (and admitted since) lack it, as no other run creates there while the process holds the lock."""
        names = Admission._holds[self.ctx.uri].names
        return names is None or name in names

    def check_unique(self, name):
        for uri, conn in self.peers:
            names = Admission._holds[uri].names
            if names is not None and name not in names:
                continue
            if lv.lookup_domain(conn, name) is not None:
                raise NameTaken("a machine named %s already exists on pool %s" % (name, uri), "name")

    def group_members(self, group):
        """[(pool uri, machine)] of the members of a hard affinity ``group`` defined on the peer pools, read under
        their locks (so no other run adds one meanwhile); None for any other group (nothing to read)."""
        if not group or group.get("policy") != "affinity":
            return None
        found = []
        for uri, conn in self.peers:
            for dom in conn.listAllDomains(0):
                try:
                    record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)))
                except lv.libvirt.libvirtError as exc:
                    if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_DOMAIN:
                        continue  # undefined since it was listed (a deletion needs no lock)
                    raise
                theirs = ((record or {}).get("spec") or {}).get("server_group") or {}
                if theirs.get("name") == group["name"]:
                    found.append((uri, dom.name()))
        return found

    def __exit__(self, *exc_info):
        self.step_aside()
        giving_back = []
        with self._guard:
            for uri in self.shared:
                Admission._holds[uri].users -= 1
            self.shared = []
            if self.counted:
                Admission._inside -= 1
                self.counted = False
            last = Admission._inside == 0
            for hold in Admission._holds.values():
                if hold.held and not hold.users and not hold.busy and (last or hold.stale()):
                    hold.busy = True
                    giving_back.append(hold)
            self._guard.notify_all()
        try:
            self._give_back(giving_back)
        finally:
            with self._guard:  # a lock another admission still shares keeps the connection it was taken on
                in_use = [hold.conn for hold in Admission._holds.values() if hold.held]
            for conn in self.opened:
                if any(conn is used for used in in_use):
                    continue
                try:
                    conn.close()
                except lv.libvirt.libvirtError:
                    pass
            self.opened = []
            self.peers = []
        return False


def check_room(ctx, spec, disks=None, locked=False, epoch=None, elsewhere=None):
    """Refuse a machine the pool has no room for: the machines already defined there (other than this one)
    plus ``spec`` must fit in what the pool's registration makes allocatable, and so must the new ``disks``
    ([(field, virtual bytes)]) in its storage; a machine of a hard anti-affinity server group is refused where
    a member of its group is defined, and one of an affinity group where none is while some are ``elsewhere``
    (Admission.group_members).

    A plan checks against the pool as this run listed it (when it did); under the admission lock (``locked``)
    the sizes are read as they are now: once in the lock's ``epoch`` (Admission.epoch), then kept with the
    machines this process admitted since (``admitted``), as no other run creates on the pool meanwhile (one
    deleting there only leaves more room than counted)."""
    registration = ctx.registration
    if not registration:
        return
    if locked and epoch is not None and ctx.locked_sizes[0] == epoch:
        sizes = ctx.locked_sizes[1]
    elif locked:
        sizes = capacity.Tally(capacity.current_sizes(ctx.conn, ctx.known_records()))
        if epoch is not None:
            ctx.locked_sizes = (epoch, sizes)
    else:
        sizes = ctx.machine_sizes()
    allocatable = capacity.allocatable_for(ctx.host_capacity(), registration)
    used_cpu, used_memory = sizes.used_except(spec["name"])  # a Tally: no pass over the pool's machines per create
    if used_cpu + spec["cpu"] > allocatable["cpu"] or used_memory + spec["memory"] > allocatable["memory"]:
        raise PoolFull("pool %s is full: %d/%d cpu and %s/%s memory are allocated, %s needs %d cpu and %s"
                       % (ctx.name, used_cpu, allocatable["cpu"], format_quantity(used_memory),
                          format_quantity(allocatable["memory"]), spec["name"], spec["cpu"],
                          format_quantity(spec["memory"])), "machine_pool")
    # a hard anti-affinity rule is re-checked here as capacity is: a concurrent run may have placed a member
    if spec.get("server_group"):
        refused = rules.admission_refusal(spec["server_group"], ctx.name, [
            (size.name, size.server_group) for size in sizes if size.name != spec["name"]], elsewhere)
        if refused:
            raise PoolFull(refused, "server_group")
    check_storage(ctx, disks or [], sizes)


def admitted(ctx, epoch, record):
    """Count a machine just created under the lock in ``epoch`` in the sizes the next check of the epoch uses."""
    if epoch is not None and ctx.locked_sizes[0] == epoch:
        spec = record["spec"]
        ctx.locked_sizes[1].append(capacity.MachineSize(spec["name"], spec["cpu"], spec["memory"],
                                                        spec.get("machine_class"), capacity.machine_disks(record),
                                                        spec.get("tolerations") or [], spec.get("server_group")))


def check_storage(ctx, disks, sizes=None):
    """Refuse new disks ([(field, virtual bytes)]) that do not fit in the storage the pool's registration
    makes allocatable (thin disks count their virtual size); the error names the field of the disk that
    does not fit."""
    registration = ctx.registration
    if not registration or not disks:
        return
    sizes = capacity.machine_sizes(ctx.conn) if sizes is None else sizes
    allocatable = capacity.storage_allocatable(ctx.storage_size(), registration)
    used = capacity.disks_allocated(sizes)
    for field, size in disks:
        if used + size > allocatable:
            raise PoolFull("does not fit in the storage of pool %s: %s of %s are allocated (storage overcommit %s), "
                           "this disk needs %s more" % (ctx.name, format_quantity(used), format_quantity(allocatable),
                                                        (registration.get("overcommit") or {}).get("storage", 1.0),
                                                        format_quantity(size)), field)
        used += size
