# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Admission on a pool: its lock (taken in URI order across the pools a name must be unique on), under which a
create checks the pool's room (pools/capacity.py ``check_room``) and journals and claims its machine, so concurrent
runs neither double-book a pool nor create one name twice (docs/concurrency.md)."""

from __future__ import annotations

import itertools
import random
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, NameTaken
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes


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
        self.lock = None  # locks.VolumeLock, or None for a pool without a registry (nothing to lock)
        self.conn = None
        self.held = False
        self.busy = False  # a thread is taking or giving back the libvirt lock, outside the guard
        self.taken = 0.0
        self.users = 0
        self.closing = False  # held over a connection an admission opened itself: give back when unused
        # the pool's domain names when the lock was taken, plus those admitted since: while the lock is held no
        # other run creates a domain there, so a name not in it needs no lookup (one in it is looked up)
        self.names = None
        self.epoch = None  # a number of its own each time the lock is taken from libvirt (documents.Registry.put)
        self.wave = None  # journals.Wave of the creates admitted in this epoch, deleted before the lock goes back

    def stale(self):
        return self.closing or time.monotonic() - self.taken >= HAND_OVER_SECONDS


def _end_wave(wave, epoch):
    """Delete the wave of a hold (journals.Wave, or None) before its lock goes back: every create it lists has
    ended. One that cannot be deleted now is removed as a dead run's by the next holder of the lock."""
    if wave is None:
        return
    try:
        wave.delete(epoch)
    except (MachineryError, lv.libvirt.libvirtError):
        pass


class Admissions:
    """What the admissions of one run share: its holds of the pools' admission locks and which of its threads
    admits onto which pool and name. One per run (Coordination.admissions); a test builds its own."""

    def __init__(self, identity=None):
        self.identity = identity if identity is not None else locks.Identity()
        self.guard = threading.Condition()
        self.holds = {}  # uri -> _PoolHold
        self.targets = {}  # uri -> threading.Lock: one thread of the run admits onto a pool at a time
        self.names = set()  # machine names being admitted by a thread of the run
        self.inside = 0  # admissions of the run entered and not left
        self.claimed = {}  # uri -> names of the machines the run holds for a create there (claim)
        self.claim_locks = {}  # (uri, name) -> (the claim's lock, the thread that took it): writer's check
        self.unlocked_claims = set()  # (uri, name) claimed on a pool without a registry (nothing to lock)
        # epochs name the waves (journals.wave_key) beside the process: counted from a random start, two runs'
        # objects in one process (tests) never name the same wave
        self.epochs = itertools.count(random.SystemRandom().randrange(1, 2 ** 31))

    def claims(self):
        """[(uri, name, lock, thread)] of the claims this run holds now (writer's check, holds.check_holds)."""
        with self.guard:
            return [(uri, name, lock, thread) for (uri, name), (lock, thread) in self.claim_locks.items()]

    def creating(self, name):
        """Whether this run claimed machine ``name`` for its create on some pool (writer.write's cover)."""
        with self.guard:
            return any(claimed == name for _uri, claimed in self.claim_locks) or \
                any(claimed == name for _uri, claimed in self.unlocked_claims)

    def target(self, uri):
        """The lock that lets one thread of the run at a time admit onto the pool at ``uri``."""
        with self.guard:
            return self.targets.setdefault(uri, threading.Lock())


class Admission:
    """The admission locks of this pool and of the peer pools a name must be unique across, and this pool (and
    the machine's name) to this thread alone within the run (the run's Admissions, ``ctx.coordination``).

    Locks are taken in the order of their URIs, so concurrent runs never wait on each other in a circle. Under
    them, a name found on a peer pool means another run created it there first."""

    def __init__(self, ctx, peer_uris, name=None):
        self.ctx = ctx
        self.table = ctx.coordination.admissions
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

    def __enter__(self):
        holders = [(self.ctx.uri, self.ctx.conn)] + self.peers
        with self.table.guard:
            self.table.inside += 1
            self.counted = True
        try:
            for uri, conn in sorted(holders, key=lambda holder: holder[0]):
                self._share(uri, conn)
                self.shared.append(uri)
            if self.name is not None:
                with self.table.guard:
                    while self.name in self.table.names:
                        self.table.guard.wait()
                    self.table.names.add(self.name)
                    self.named = True
            self.target = self.table.target(self.ctx.uri)
            self.target.acquire()
            hold = self.table.holds[self.ctx.uri]
            self.epoch = hold.epoch if hold.lock is not None else None
        except BaseException:
            self.target = None
            self.__exit__()
            raise
        return self

    def _share(self, uri, conn):
        """A share of the pool's admission lock: taken from libvirt by the first admission that needs it."""
        guard = self.table.guard
        with guard:
            while True:
                hold = self.table.holds.setdefault(uri, _PoolHold())
                if hold.busy or (hold.held and hold.stale() and hold.users):
                    guard.wait()  # taken or given back by another thread, or draining before it goes back
                    continue
                if hold.held and not hold.stale():
                    hold.users += 1
                    return
                # free, or held long enough and unused: (give it back and) take it from libvirt again; idle holds of
                # pools that sort after it go back first, so this thread never waits while holding them
                giving_back = [other for other_uri, other in self.table.holds.items()
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
            registry_pool = lv.lookup_storage_pool(conn, keys.REGISTRY_POOL)
            lock = locks.admission_lock(conn, registry_pool, self.table.identity).acquire() \
                if registry_pool is not None else None
            names = {dom.name() for dom in conn.listAllDomains(0)} if lock is not None else None
        except BaseException:
            with guard:
                hold.busy = False
                guard.notify_all()
            raise
        with guard:
            hold.lock, hold.conn, hold.held, hold.busy, hold.names = lock, conn, True, False, names
            hold.epoch = next(self.table.epochs)
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
            with self.table.guard:
                for hold in holds:
                    hold.lock, hold.conn, hold.held, hold.busy, hold.users = None, None, False, False, 0
                    hold.names, hold.wave = None, None
                self.table.guard.notify_all()

    def journal(self, name, made):
        """List the create of ``name`` and the volumes it makes (``made``) in this epoch's wave on the pool
        (journals.py) before any of them is made. The first create of an epoch removes what dead runs' waves list,
        and writes the wave with every create the run has planned on the pool (PoolContext.planned_creates), so
        the others of the epoch find themselves listed and write nothing."""
        hold = self.table.holds[self.ctx.uri]
        if hold.lock is None:
            return  # a pool without a registry: nothing to journal in
        if hold.wave is None:
            self.clean_dead_waves()  # this epoch's own is not written yet: every wave there is a dead run's
            hold.wave = journals.Wave(self.ctx.registry, journals.wave_key(self.table.identity, self.epoch))
        if not hold.wave.lists(name, made):
            machines = dict(hold.wave.machines)
            machines.update(self.ctx.planned_creates.copy())  # other threads plan meanwhile
            machines[name] = made
            hold.wave.write(machines, self.epoch)

    def clean_dead_waves(self):
        """Under the lock: remove what every wave on the pool but this epoch's lists (all are dead runs')."""
        hold = self.table.holds[self.ctx.uri]
        own = hold.wave.key if hold.wave is not None else None
        registry = self.ctx.registry
        with self.table.guard:
            claimed = set(self.table.claimed.get(self.ctx.uri, ()))
        journals.clean_waves(self.ctx, [key for key in registry.keys(keys.WAVE_PREFIX, self.epoch) if key != own],
                             self.epoch, claimed, self.table.identity)

    def claim(self, name):
        """Hold machine ``name`` on the pool for its create (``claim``), once this epoch's wave lists it: a
        handle to give to ``unclaim``, True on a pool without a registry (nothing to hold), or None when another
        run holds the machine (the caller lets the lock go and waits for that hold)."""
        hold = self.table.holds[self.ctx.uri]
        if hold.lock is None:
            with self.table.guard:
                self.table.unlocked_claims.add((self.ctx.uri, name))
            return True
        volume = claim(self.ctx.registry.pool, name, self.table.identity)
        if volume is not None:
            with self.table.guard:
                self.table.claimed.setdefault(self.ctx.uri, set()).add(name)
                self.table.claim_locks[(self.ctx.uri, name)] = (volume, threading.get_ident())
        return volume

    def unclaim(self, name, volume):
        """Give back the hold ``claim`` took, before this admission leaves (so before the wave goes)."""
        if volume is True:
            with self.table.guard:
                self.table.unlocked_claims.discard((self.ctx.uri, name))
            return
        if volume is None:
            return
        try:
            unclaim(volume)
        finally:
            with self.table.guard:
                self.table.claimed.get(self.ctx.uri, set()).discard(name)
                self.table.claim_locks.pop((self.ctx.uri, name), None)

    def step_aside(self):
        """Let the next admission of this process onto the pool (and of the name) in while this one keeps its
        share of the locks: the create is made, and what follows it (its start) needs no room check, only the wave
        to stay. Leaving does it first."""
        if self.target is not None:
            self.target.release()
            self.target = None
        with self.table.guard:
            if self.named:
                self.table.names.discard(self.name)
                names = self.table.holds[self.ctx.uri].names
                if names is not None:
                    names.add(self.name)  # created, or maybe: the next admission of the name looks it up
                self.named = False
                self.table.guard.notify_all()

    def may_exist(self, name):
        """Whether a domain ``name`` may be defined on the pool: not when the names listed as the lock was taken
        (and admitted since) lack it, as no other run creates there while the process holds the lock."""
        names = self.table.holds[self.ctx.uri].names
        return names is None or name in names

    def check_unique(self, name):
        for uri, conn in self.peers:
            names = self.table.holds[uri].names
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
        with self.table.guard:
            for uri in self.shared:
                self.table.holds[uri].users -= 1
            self.shared = []
            if self.counted:
                self.table.inside -= 1
                self.counted = False
            last = self.table.inside == 0
            for hold in self.table.holds.values():
                if hold.held and not hold.users and not hold.busy and (last or hold.stale()):
                    hold.busy = True
                    giving_back.append(hold)
            self.table.guard.notify_all()
        try:
            self._give_back(giving_back)
        finally:
            with self.table.guard:  # a lock another admission still shares keeps the connection it was taken on
                in_use = [hold.conn for hold in self.table.holds.values() if hold.held]
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


# A create holds its machine too, but more cheaply than a change does (a marker and a lock volume, made and deleted,
# for each machine of a batch). Under the pool's admission lock, once the wave of its process (journals.py) lists
# the machine, the create makes the hold's lock volume alone: the wave names its holder. It deletes it before its
# process's hold of the admission lock ends, and the wave goes only then, so a claim without a live wave listing it
# is a dead run's. A run that finds the machine held otherwise (a move of it, an update, a deletion) lets the
# admission lock go and waits for that hold as any change does (holds.machine_hold).
def claim(pool, machine, identity):
    """Hold ``machine`` for a create, with no holder marker (see above): the lock (locks.machine_lock, taken),
    or None when the machine is held already."""
    lock = locks.machine_lock(pool, machine, identity, timeout=0, named=False, renew=False)
    return lock if lock.try_once() else None


def unclaim(lock):
    lock.release()


def claim_abandoned(conn, pool, machine, age, identity):
    """Whether the hold on ``machine`` in the registry ``pool``, of this ``age`` and with no holder marker, is
    abandoned. A wave that lists the machine names the create holding it: a wave is live while its process holds
    the pool's admission lock (its marker is there), or runs on this controller; one that cannot be read yet is
    taken to list it. While a live wave lists the machine it is not abandoned; when only dead ones do, it is at
    once; a claim that no wave lists (its dead wave cleaned already), or a lock killed before its holder named
    itself, after locks.MARKERLESS_SECONDS."""
    names = volumes.complete_listing(pool)
    prefix = keys.ADMISSION_HOLDER_PREFIX
    holders = [name[len(prefix):] for name in names if name.startswith(prefix)]
    waves = sorted({document[0] for document in map(keys.parse_document_volume, names)
                    if document and document[0].startswith(keys.WAVE_PREFIX)})
    registry = documents.Registry(conn, pool, identity)
    dead = False
    for key in waves:
        owner = keys.wave_owner(key)
        if owner is None:
            continue
        body = registry.get(key)
        if body is not None and machine not in (body.get("machines") or {}):
            continue
        gone = identity.is_dead(owner, "")
        if gone is None:  # another controller's: live while it holds the admission lock
            gone = not any(holder.startswith(owner + ".") for holder in holders)
        if not gone:
            return False
        dead = True
    return dead or age > locks.MARKERLESS_SECONDS
