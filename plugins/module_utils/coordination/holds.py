# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Holds on machines: how a run keeps every other run off a machine while it changes it (docs/concurrency.md).

``convergence.converge`` takes the holds a resource's plan needs (``Resource.holds``) before the first action and
gives them back after the last; nothing else decides whether a change is held. A hold is the machine's lock
volume in its pool's registry (``machine_hold``, a leased locks.VolumeLock) with a holder marker whose name says
who holds it: the controller, the process, the operation and since when. A run that finds the machine held waits
for up to ``hold_timeout`` seconds (the action group's common option), saying so in its progress, then fails
with ``reason: Conflict`` and ``holder`` {controller, operation, since}. A machine held by a move is refused at
once: when the move is done the machine is no longer on the pool this run was asked to change it on.

``Coordination`` is the run: everything the protocol keeps in memory is one of its members.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import progress
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, HoldLost, MachineryError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import admission
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes

DEFAULT_HOLD_TIMEOUT = 900
MOVE = "machine_migrate"  # the operation of a move's holds (the module, the drain role, a resize that moves)
PROGRESS_EVERY = 5.0  # seconds between two progress lines of a waiting run


class Coordination:
    """What the holds of one run need to know: the ``operation`` they are taken for (the module's name), how long
    a run waits for a held machine (``hold_timeout``), and the file its progress goes to (core/progress.py).
    Built once per run by the module base, and by a test that wants a run: everything the protocol keeps in a
    process is kept here (the holds taken, the shares of the pools' admission locks, who this process is), so
    nothing is kept between runs or beside them."""

    def __init__(self, operation="machinery", hold_timeout=DEFAULT_HOLD_TIMEOUT, progress_path=None,
                 host=None, clock=time.time, lease=None):
        self.operation = operation
        self.hold_timeout = DEFAULT_HOLD_TIMEOUT if hold_timeout is None else hold_timeout
        self.progress_path = progress_path if progress_path is not None else os.environ.get(progress.ENV)
        self.host = host or socket.gethostname()
        self.clock = clock
        self.lease = lease if lease is not None else leases.lease_seconds(os.environ.get(leases.LEASE_ENV))
        # {key: [hold, depth]} of the holds this run has taken: an operation that holds a machine and then has
        # the machine module act on it (a health check's restart) takes it once
        self.held = {}
        self._guard = threading.Lock()
        self.identity = locks.Identity()  # who names the markers and waves of this run
        self.admissions = admission.Admissions(self.identity)  # this run's shares of the pools' admission locks
        self._uploads = {}  # (storage pool UUID, checksum) -> threading.Lock: upload_turn

    def tag(self, operation=None):
        """The end of a holder marker: ``.<operation>.<since>.<host>``, read back by ``holder``."""
        return keys.holder_tag(operation or self.operation, self.clock(), self.host)

    def machine(self, conn, machine, uri="", registry=None, field="machine", operation=None, timeout=None):
        """The hold on ``machine`` on the pool at ``uri`` behind ``conn`` (not taken yet: ``acquire`` or
        ``with``). ``registry`` (the run's Registry of that pool, opened already) spares a lookup."""
        return MachineHold(self, conn, machine, uri, registry, field, operation, timeout)

    def of(self, ctx, machine, field="machine"):
        """The hold on ``machine`` of the pool a PoolContext ``ctx`` reaches."""
        registry = ctx.registry if ctx.registration else None
        return self.machine(ctx.conn, machine, ctx.uri, registry, field)

    def set_of(self, ctx, name):
        """The hold on machine set ``name`` in the registry of the pool ``ctx`` reaches: one run at a time
        decides the set's members and writes its document there (machine_set, and machine_health_check when it
        records). A set's holds come before any machine's in a run's order (``key``): a set run holds its set,
        then each member it changes."""
        registry = ctx.registry if ctx.registration else None
        hold = MachineHold(self, ctx.conn, keys.set_hold(name), ctx.uri, registry, "name")
        hold.key = (0,) + hold.key[1:]
        return hold

    def upload_turn(self, pool_uuid, checksum):
        """The lock the run's threads take in turn before the upload lock of image ``checksum`` on a storage
        pool (locks.image_upload_lock): one of them uploads it, the others find it there, none polls."""
        with self._guard:
            return self._uploads.setdefault((pool_uuid, checksum), threading.Lock())

    def check_holds(self, before):
        """Raise HoldLost when a hold this run took was taken over by another run, before the write ``before``
        (writer.write). The holds checked are those the calling thread took (a set's worker its member's), or,
        for a thread that took none (a move's copy, the main thread of a run whose workers hold), every hold of
        the run: one listing of the store per hold. A create's claim on its machine (admission.claim) is a hold
        too: a create paused until its claim was judged abandoned and taken defines nothing."""
        thread = threading.get_ident()
        with self._guard:
            taken = [entry[0] for entry in self.held.values()]
        claims = self.admissions.claims()
        mine = [hold for hold in taken if hold.thread == thread]
        mine_claimed = [claim for claim in claims if claim[3] == thread]
        if mine or mine_claimed:
            taken, claims = mine, mine_claimed
        check_held(taken, before)
        for _uri, name, lock, _thread in claims:
            confirm_held(lock, lambda: "another run", "claim on machine %s for its create" % name,
                         locks.ADMISSION_LEASE_SECONDS, before, "name")

    def covers(self, machine):
        """Whether this run may change ``machine`` (writer.write): it holds it on some pool (a move holds it on
        both), or claimed it for its create (admission.claim)."""
        with self._guard:
            if any(key[0] == 1 and key[2] == machine for key in self.held):
                return True
        return self.admissions.creating(machine)

    def report_wait(self, message):
        """One line of progress for a waiting run, where an action plugin shows it (core/progress.py)."""
        if not self.progress_path:
            return
        partial = self.progress_path + ".part"
        try:
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
                handle.write('{"message": %s}' % _json_string(message))
            os.replace(partial, self.progress_path)
        except OSError:
            self.progress_path = None


def confirm_held(lock, holder_now, what, lease, before, field):
    """Raise HoldLost naming ``what`` ("hold on machine web-1") unless ``lock`` is still this run's: taken over
    (``holder_now()`` says by whom), or not to be confirmed (the daemon closed a connection paused too long)."""
    try:
        if lock.still_held():
            return
        why = "was taken over by %s" % holder_now()
    except (MachineryError, lv.libvirt.libvirtError) as exc:
        why = "cannot be confirmed (%s)" % (exc.message if isinstance(exc, MachineryError) else lv.describe(exc))
    raise HoldLost("this run's %s %s: this run was paused for longer than its lease (%ss) and stopped before %s; "
                   "the run holding the machine now finishes or rolls back what this one did"
                   % (what, why, lease, before), field)


def check_held(holds, before):
    """Raise HoldLost when any of ``holds`` (taken, MachineHold) was taken over by another run: called before
    each step that changes something (``before`` names it for the message)."""
    for hold in holds:
        hold.check(before)


def _json_string(text):
    return json.dumps(text)


def holder(marker, prefix):
    """{controller, operation, since, pid} of a holder marker; a hold without a marker is a create's claim (its
    wave names it, admission.claim)."""
    if not marker:
        return {"controller": None, "operation": "create", "since": None, "pid": None}
    fields = keys.marker_fields(marker, prefix)
    pid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    if len(fields) < 7:  # a marker of an older version: who, not what
        return {"controller": fields[0] if fields else None, "operation": None, "since": None, "pid": pid}
    since = None
    if fields[5].isdigit():
        since = datetime.datetime.fromtimestamp(int(fields[5]), datetime.timezone.utc).isoformat()
    return {"controller": fields[6], "operation": fields[4], "since": since, "pid": pid}


def describe_holder(found):
    what = found["operation"] or "another run"
    where = " on %s" % found["controller"] if found["controller"] else ""
    pid = " (pid %s)" % found["pid"] if found["pid"] else ""
    since = " since %s" % found["since"] if found["since"] else ""
    return "%s%s%s%s" % (what, where, pid, since)


def move_refusal(conn, machine, marker):
    """The Conflict of a run on ``machine`` while the move ``marker`` names holds it, naming the move (its pools
    from its journal, read afresh: a run's registry may have cached the key before the move wrote it)."""
    found = holder(marker, keys.hold_prefix(machine))
    journal = documents.Registry.open(conn).get(keys.move_key(machine)) if conn is not None else None
    where = ""
    if journal and journal.get("source") and journal.get("target"):
        where = " from %s to %s" % (journal["source"]["pool"], journal["target"]["pool"])
    exc = ConflictError("machine %s is being moved%s by another run (%s): nothing was changed; run again once the "
                        "move is done, on the pool the machine is then on" % (machine, where, describe_holder(found)),
                        "machine")
    exc.details = {"holder": {key: found[key] for key in ("controller", "operation", "since")}}
    return exc


def missing_machine(ctx, machine, exc):
    """``exc``, a run's finding that ``machine`` is not on the pool of PoolContext ``ctx``; or, while a move of
    the machine still holds it there (the move has undefined it there and not let go yet), the Conflict naming
    that move, as a run at any earlier point of the move is answered."""
    if exc.field != "machine" or not ctx.registration:
        return exc
    marker = moving(volumes.listing(ctx.registry.pool), machine, ctx.coordination.identity)
    return move_refusal(ctx.conn, machine, marker) if marker is not None else exc


def moving(names, machine, identity):
    """The marker of a live move's hold on ``machine`` among ``names`` (a listing of the registry the run made
    anyway), or None. A converged machine's run takes no hold, yet must not report a state a move is about to
    change (a cold move's stopped guest is started again on the target). ``identity``: the run's
    (Coordination.identity)."""
    prefix = keys.hold_prefix(machine)
    if keys.hold_volume(machine) not in names:
        return None
    for name in names:
        if name.startswith(prefix) and holder(name, prefix)["operation"] == MOVE \
                and not identity.is_dead(name, prefix):
            return name
    return None


class MachineHold:
    """One run's hold on one machine of one pool. ``key`` orders the holds of a run: taken in that order, runs
    holding several machines never wait for each other in a circle."""

    def __init__(self, coordination, conn, machine, uri="", registry=None, field="machine", operation=None,
                 timeout=None):
        self.coordination = coordination
        self.conn = conn
        self.machine = machine
        self.registry = registry
        self.field = field
        self.operation = operation or coordination.operation
        self.timeout = coordination.hold_timeout if timeout is None else timeout
        self.key = (1, uri or "", machine)
        self.lock = None
        self.thread = None
        self.waited = 0.0
        self._reported = None

    @property
    def label(self):
        """"machine web-1", or "machine set web" for a set's hold."""
        if self.key[0] == 0:
            return "machine set %s" % keys.held_set(self.machine)
        return "machine %s" % self.machine

    @property
    def marker(self):
        return self.lock.marker if self.lock is not None else None

    def _refuse(self, marker):
        found = holder(marker, keys.hold_prefix(self.machine))
        if found["operation"] != MOVE or self.operation == MOVE:
            return None
        return move_refusal(self.conn, self.machine, marker).message

    def _waiting(self, marker, seconds):
        self.waited = seconds
        if self._reported is not None and seconds - self._reported < PROGRESS_EVERY:
            return
        self._reported = seconds
        found = holder(marker, keys.hold_prefix(self.machine))
        self.coordination.report_wait("waiting for %s, held by %s: %ds of hold_timeout %ds"
                                      % (self.label, describe_holder(found), seconds, self.timeout))

    def acquire(self):
        with self.coordination._guard:
            outer = self.coordination.held.get(self.key)
            if outer is not None:  # this run holds it already: an operation inside another one
                outer[1] += 1
                self.lock = _Inner(outer)
                return self
        self._take()
        self.thread = threading.get_ident()  # whose writes check it first (Coordination.check_holds)
        with self.coordination._guard:
            self.coordination.held[self.key] = [self, 1]
        return self

    def _take(self):
        self.lock = machine_hold(self.conn, self.machine, self.timeout, refuse=self._refuse, field=self.field,
                                 registry=self.registry, tag=self.coordination.tag(self.operation),
                                 waiting=self._waiting, lease=self.coordination.lease,
                                 identity=self.coordination.identity)
        try:
            self.lock.acquire()
        except ConflictError as exc:
            self.lock = None
            marker = getattr(exc, "holder_marker", None)
            found = holder(marker, keys.hold_prefix(self.machine))
            exc.details = {"holder": {key: found[key] for key in ("controller", "operation", "since")}}
            if "held for over" in exc.message:
                exc.message = ("%s is held by %s; waited %ds (hold_timeout) and changed nothing: run again once "
                               "that run is done" % (self.label, describe_holder(found), self.timeout))
            raise

    def check(self, before):
        """Raise HoldLost when this run's hold was taken over (it was paused past its lease): it must stop
        before ``before``, the next step that changes anything."""
        if self.lock is not None:
            confirm_held(self.lock, self.holder_now, "hold on %s" % self.label, self.coordination.lease, before,
                         self.field)

    def holder_now(self):
        """Who holds the machine now that this run's hold passed on (describe_holder), read from the store."""
        lock = self.lock.outer[0].lock if isinstance(self.lock, _Inner) else self.lock
        view = lock.observe() if lock is not None and hasattr(lock, "observe") else None
        if view is None:
            return "another run, which has let it go since"
        return describe_holder(holder(view.markers[0], keys.hold_prefix(self.machine))) if view.markers else \
            "another run's create"

    def release(self):
        if self.lock is None:
            return
        if not isinstance(self.lock, _Inner):
            with self.coordination._guard:
                self.coordination.held.pop(self.key, None)
        self.lock.release()
        self.lock = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False


class _Inner:
    """A hold taken inside another hold of the same run on the same machine: released with its depth."""

    def __init__(self, outer):
        self.outer = outer
        self.marker = outer[0].marker

    def still_held(self):
        """The outer hold's answer: a hold taken again inside an operation is lost when the outer one is."""
        lock = self.outer[0].lock
        return lock.still_held() if lock is not None else True

    def release(self):
        self.outer[1] -= 1


def machine_hold(conn, machine, timeout, refuse=None, field="name", registry=None, tag="", waiting=None,
                 lease=None, identity=None):
    """The lock of the hold on ``machine`` in the registry of the pool behind ``conn`` (nothing when the pool has
    no registry): one run at a time changes the machine there. ``refuse(marker)`` says why not to wait for the
    run holding it (a move, for the machine module), or None to wait up to ``timeout``. ``registry`` (the run's
    Registry of that pool, opened already) spares looking the storage pool up again. A hold with no holder marker
    is a create's claim (admission.claim): it is waited for while a live wave lists the machine. Every hold is a
    lease (``lease`` seconds, by default leases.lease_seconds of LEASE_ENV): a waiter breaks it once it has seen
    no renewal for that long, never by the age of its file."""
    if registry is not None:
        pool = registry.pool
    else:
        pool = lv.lookup_storage_pool(conn, keys.REGISTRY_POOL)
        if pool is not None and not pool.isActive():
            pool.create(0)
    if pool is None:
        return locks.NoLock()
    identity = identity if identity is not None else locks.Identity()
    lease = lease if lease is not None else leases.lease_seconds(os.environ.get(leases.LEASE_ENV))
    return locks.machine_lock(pool, machine, identity, timeout=timeout, refuse=refuse, field=field,
                              markerless=lambda age: admission.claim_abandoned(conn, pool, machine, age, identity),
                              tag=tag, waiting=waiting, lease=lease)


def clear_dead_holds(conn, pool, names, identity):
    """Break the holds on machines (machine_hold, admission.claim) in the registry ``pool`` that runs killed while
    they held them left, as ``names`` (a listing of it) shows them, and delete dead runs' markers beside no lock:
    a machine that no run changes again would keep them. Only a hold whose every marker names a gone process of
    this controller, or a create's claim that admission.claim_abandoned calls abandoned, is touched. A document
    staged by a writer of this controller that is gone (documents.Registry.put) goes too."""
    held, markers = set(), {}
    for name in names:
        if name.startswith(keys.STAGE_PREFIX) and identity.is_dead(name, keys.STAGE_PREFIX):
            volumes.delete_quietly(pool, name)  # a document a writer killed before its commit staged
            continue
        found = keys.held_name(name)
        if found is None:
            continue
        if found[1] == "lock":
            held.add(found[0])
        else:
            markers.setdefault(found[0], []).append(name)
    for machine in sorted(held | set(markers)):
        found = sorted(markers.get(machine, []))
        prefix = keys.hold_prefix(machine)
        dead = [marker for marker in found if identity.is_dead(marker, prefix)]
        if len(dead) < len(found):
            # a live holder, or one that cannot be told: only the markers of dead runs beside it go (a run killed
            # between naming itself and taking the lock left one, and a later holder never lists it)
            for marker in dead:
                volumes.delete_quietly(pool, marker)
            continue
        if machine not in held:
            for marker in found:
                volumes.delete_quietly(pool, marker)
            continue
        lock = machine_hold(conn, machine, 0, registry=documents.Registry(conn, pool, identity), identity=identity)
        view = lock.observe()
        if view is not None and not view.markers:
            lock.clear_unnamed(view)
        elif view is not None:
            lock.clear_if_abandoned(view)
