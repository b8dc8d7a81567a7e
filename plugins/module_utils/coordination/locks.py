# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock: generations of a volume, each taken by an exclusive create, and a holder marker naming the holder
of the newest (docs/concurrency.md, "Locks").

One class, ``VolumeLock``, makes every lock of the protocol: a pool's admission lock (``admission_lock``), an
image's upload lock (``image_upload_lock``), the hold on a machine or a set (holds.py) and a create's claim on
its machine (admission.py). The store decides who holds, never a reading of markers: a run holds generation g
of a lock when it created the volume of generation g (keys.lock_slot) while the one before was still there and
none after it was. Taking the lock afresh and taking it over from a holder whose lease ran out are both that
create, so of two runs doing either at once exactly one wins. A run about to make that create names itself first
(a marker with the generation it takes) and deletes the marker when it loses; a holder renews its own generation
only, and checks before each write that its generation is still the newest. A waiter only reads: it leaves
nothing in the pool, so waiters never disturb one another. Every lock
is a lease (leases.py): a waiter takes it over when its holder is known dead (liveness, where the holder's pid
can be seen) or when it has watched it unchanged for a whole lease on its own monotonic clock.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import socket
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes

# For the lab tests: a run whose environment names a lock volume here stops itself (SIGSTOP) in its first take-over
# of that lock, named already and right before the exclusive create that decides who wins. Two runs stopped there
# and continued together break one expired lock at the same moment (test_49). Unset, nothing stops.
STOP_BEFORE_TAKEOVER_ENV = "MACHINERY_STOP_BEFORE_TAKEOVER"

# A live holder keeps the admission lock for seconds (it creates volumes and defines a domain, or writes a
# document), renewing its lease every third of ADMISSION_LEASE_SECONDS. A waiter takes a lock whose holder it
# cannot check (another controller) as abandoned once it has watched it unrenewed for that long, and gives up
# after LOCK_WAIT_SECONDS, so it always outlasts an abandoned lock.
ADMISSION_LEASE_SECONDS = 30
LOCK_WAIT_SECONDS = 90
# An image upload can take minutes: its holder renews a lease of leases.LEASE_SECONDS meanwhile, and a waiter
# gives up after UPLOAD_WAIT_SECONDS.
UPLOAD_WAIT_SECONDS = 960
# A lock a waiter has watched with no marker for this long was left by an older version or by hand, or by a run
# killed between its lock and its marker, and is broken without waiting for a lease.
MARKERLESS_SECONDS = 10
# A lock nobody is named in is between two calls of a run (taking it afresh, naming itself, letting it go:
# milliseconds), a create's claim (named by its wave), or was left by a run killed there. A clean-up that reads it
# so ORPHAN_LOOKS times, ORPHAN_SECONDS apart, and that no live wave claims, takes it over and lets it go: a live
# run it overtakes finds its generation taken over, and waits or stops like any other.
ORPHAN_LOOKS = 3
ORPHAN_SECONDS = 0.3


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _pid_namespace():
    """The PID namespace this process sees others in (its inode), or None where it cannot be read: a pid names a
    process only to a reader in the same namespace."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_start(pid):
    """The start time of process ``pid`` (clock ticks since boot), or None when there is no such process: with
    the pid it names one process, even after the pid is reused."""
    try:
        with open("/proc/%d/stat" % int(pid)) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


class Identity:
    """Who this process is, as its holder markers and waves name it: where its pid can be checked (a token of the
    host name, the boot and the PID namespace: two containers on one host are two controllers), the process (pid
    and start time; with the token, one run). Read once per object, and again in a child forked from the process;
    a run's objects share the run's (``Coordination.identity``), an object built alone reads its own."""

    def __init__(self):
        self._pid = None
        self._controller = None
        self._start = None

    def _read(self):
        pid = os.getpid()
        if pid != self._pid:
            where = "%s/%s/%s" % (socket.gethostname(), _boot_id(), _pid_namespace())
            self._controller = hashlib.sha256(where.encode()).hexdigest()[:12]
            self._start = process_start(pid)
            self._pid = pid

    @property
    def controller(self):
        self._read()
        return self._controller

    @property
    def pid(self):
        self._read()
        return self._pid

    @property
    def start(self):
        self._read()
        return self._start or "0"

    def marker(self, prefix, generation, tag=""):
        """The name of this thread's holder marker of ``generation`` (threads of one run take a pool's lock in
        turn)."""
        self._read()
        return keys.holder_marker(prefix, generation, self._controller, self._pid, self._start,
                                  threading.get_ident(), tag)

    @staticmethod
    def next_staging():
        """A number for a staged document of this thread (documents.Registry.put): drawn at random, as a thread
        may stage within another of its own stagings (a write made between another's commit and its check)."""
        return random.getrandbits(31)

    def is_dead(self, marker, prefix):
        """True when the holder ``marker`` names ran where this process can see its pid (this controller: the same
        host, boot and PID namespace) and that process is gone; None when it cannot be told (another controller,
        or no marker): such a holder is judged by its lease alone."""
        try:
            controller, pid, start = keys.marker_fields(marker, prefix)[:3]
        except (TypeError, ValueError):
            return None
        if controller != self.controller:
            return None
        return process_start(pid) != start

    def describe(self, marker, prefix):
        """A holder marker as a reader can use it: "pid 123 on this controller", or "on controller <token>"."""
        try:
            controller, pid, _start = keys.marker_fields(marker, prefix)[:3]
        except (TypeError, ValueError):
            return "unknown"
        return "pid %s on this controller" % pid if controller == self.controller else "on controller %s" % controller


def _naming(exc, marker):
    """``exc`` (a refusal to wait) with the holder ``marker`` it names (None: a holder that named nobody)."""
    exc.holder_marker = marker
    return exc


class View:
    """A waiter's reading of a lock: its newest generation (``top``), the markers naming that generation's
    holder (none: a create's claim, or a holder killed before it named itself), every generation there, and for
    how long the waiter has watched the lock unchanged (its own monotonic clock)."""

    __slots__ = ("top", "markers", "generations", "names", "age", "capacity", "taking")

    def __init__(self, top, markers, generations, names, age, capacity=1, taking=()):
        self.top = top
        self.markers = markers
        self.taking = list(taking)  # the markers of runs about to take the generation after the newest
        self.generations = generations
        self.names = names
        self.age = age
        self.capacity = capacity

    @property
    def orphan(self):
        """The anchor alone: no generation is held, nobody named."""
        return self.top == 1 and not self.markers

    @property
    def holder(self):
        return self.markers[0] if len(self.markers) == 1 else None


class VolumeLock:
    """A lock on one pool host made from libvirt alone (docs/concurrency.md, "Locks"). Works over any URI, across
    hosts, PID namespaces and processes.

    Its volumes, in ``pool`` (through ``store``, volumes.PoolStore; the protocol model passes a stand-in):
    the anchor ``name`` (generation 1), there while any generation is held; the generation a holder holds,
    ``<name>.<g>`` (g >= 2); the holder's marker ``<holder_prefix>g<g>.<controller>.<pid>.<start>.<thread><tag>``.
    """

    def __init__(self, conn, pool, timeout=LOCK_WAIT_SECONDS, name=keys.ADMISSION_LOCK,
                 holder_prefix=keys.ADMISSION_HOLDER_PREFIX, what="the admission lock of this pool", refuse=None,
                 field="uri", markerless=None, tag="", waiting=None, lease=ADMISSION_LEASE_SECONDS, identity=None,
                 store=None, clock=time.monotonic, sleep=time.sleep, named=True, renew=True):
        self.conn = conn
        self.pool = pool
        self.timeout = timeout
        self.name = name
        self.holder_prefix = holder_prefix
        self.what = what
        self.refuse = refuse  # refuse(holder marker): why not to wait for that holder, or None to wait
        self.field = field
        # markerless(age): whether a lock watched for ``age`` seconds with no holder marker is abandoned (a create's
        # claim on a machine is one, named by its wave: admission.claim_abandoned); None: after MARKERLESS_SECONDS
        self.markerless = markerless
        self.tag = tag  # appended to the holder marker (keys.holder_tag)
        self.lease = lease  # seconds a holder's lease lasts unless renewed (leases.py)
        self.clock = clock
        self.sleep = sleep
        self.watch = leases.Watch(lease, clock)
        # waiting(holder marker or None, seconds waited): called while the lock is held by another run
        self.waiting = waiting
        self.identity = identity if identity is not None else Identity()
        self.store = store if store is not None else volumes.PoolStore(pool)
        self.named = named  # False: a claim, named by its create's wave instead of a marker
        self.renew_in_thread = renew
        self.generation = None  # the generation this run holds
        self.marker = None
        self.renewer = None
        self.capacity = 0
        self.lost = False  # a renewal found the generation taken over

    def slot(self, generation):
        return keys.lock_slot(self.name, generation)

    def _generations(self, names):
        return sorted(found for found in (keys.slot_generation(name, self.name) for name in names) if found)

    def _markers(self, names, generation):
        """The holder markers among ``names`` that name ``generation``."""
        return sorted(name for name in names if name.startswith(self.holder_prefix)
                      and keys.marker_generation(name, self.holder_prefix) == generation)

    def is_dead(self, marker):
        return self.identity.is_dead(marker, self.holder_prefix)

    # what a waiter reads

    def observe(self):
        """The lock as it is now (a View), or None when no generation of it is there (it is free)."""
        names = self.store.names()
        generations = self._generations(names)
        if not generations:
            return None
        top = generations[-1]
        capacity = self.store.capacity(self.slot(top))
        if capacity is None:
            return None  # let go, or taken over, since the listing: read again
        markers = self._markers(names, top)
        self.watch.note((top, capacity), markers)
        return View(top, markers, generations, names, self.watch.unchanged_for(), capacity,
                    self._markers(names, top + 1))

    def abandoned(self, view):
        """Whether the lock as ``view`` shows it has no live holder: its holder is known dead (liveness first),
        it has had no holder marker for long enough, or its lease expired as this waiter watched it."""
        if not view.markers:
            if view.orphan and view.taking and all(self.is_dead(marker) for marker in view.taking):
                return True  # the anchor of a run killed as it took the lock afresh, its name beside it
            return self.markerless(view.age) if self.markerless is not None else view.age > MARKERLESS_SECONDS
        if all(self.is_dead(marker) for marker in view.markers):
            return True
        return self.watch.expired()  # never the host's file time against this controller's clock

    # what a holder does

    def take(self, view):
        """One try to take the lock as ``view`` shows it (None: free; else its newest generation, abandoned):
        the exclusive create of the next generation. True when this run holds it now."""
        if view is None:
            if not self.store.create(self.slot(1)):
                return False  # the anchor is there: held after all (a listing missed it), read it again
            generation = 2
        else:
            generation = view.top + 1
        # named before the create that decides, so a live holder's generation is never seen without its name (a
        # waiter, which takes nothing, names nothing)
        marker = self.identity.marker(self.holder_prefix, generation, self.tag) if self.named else None
        if marker is not None:
            self.store.create(marker)
        if view is not None and os.environ.get(STOP_BEFORE_TAKEOVER_ENV) == self.name:
            del os.environ[STOP_BEFORE_TAKEOVER_ENV]  # once
            os.kill(os.getpid(), signal.SIGSTOP)
        won = self.store.create(self.slot(generation))
        # confirmed: the generation taken over is still there (a run that made the anchor took none over), and no
        # generation after this one is listed. Without the listing, a run that made the anchor again after a
        # release deleted it while another run held a later generation (taken over from the anchor alone as the
        # release paused) would hold generation 2 beside it: the protocol model found that.
        if won and ((view is not None and not self.store.exists(self.slot(generation - 1)))
                    or any(found > generation for found in self._generations(self.store.names()))):
            self.store.delete(self.slot(generation))
            won = False
        if not won:
            if marker is not None:
                self.store.delete(marker)
            return False
        self.generation, self.lost, self.capacity, self.marker = generation, False, 1, marker
        if view is not None:
            # what the generations before this one left: their volumes (never the anchor) and markers
            for older in view.generations:
                if 1 < older < generation:
                    self.store.delete(self.slot(older))
            # every other marker it listed: the older generations' holders, and what runs killed while they named
            # themselves left (a live loser of this generation deletes its own again, which changes nothing)
            for other in view.names:
                if other.startswith(self.holder_prefix) and other != marker:
                    self.store.delete(other)
        return True

    def renew(self):
        """Renew this run's lease: grow its own generation by a block. Never touches another generation; when
        its own is gone or a newer one is there, the hold is lost (``still_held`` says so from then on)."""
        if self.generation is None or self.lost:
            return False
        if self.store.exists(self.slot(self.generation + 1)):
            self.lost = True
            return False
        if self.store.resize(self.slot(self.generation), self.capacity + leases.RENEWAL_BYTES):
            self.capacity += leases.RENEWAL_BYTES
            return True
        if not self.store.present(self.slot(self.generation)):
            self.lost = True
        return False

    def still_held(self):
        """Whether this run still holds the lock, read from one listing (one moment): its generation and its
        marker are in it and no later generation is. Lookups one after another would not do: between the look
        at its own generation and the look at the next, the lock can pass on twice (the protocol model found
        that). A volume of its own the listing misses is looked up again for a moment (libvirt's refresh). Read
        once at the start: another thread of the run may let the lock go meanwhile (a batch's thread checks
        every claim of the run while another gives its own back), and a lock let go fences nothing."""
        generation, marker = self.generation, self.marker
        if generation is None:
            return True
        if self.lost:
            return False
        names = self.store.names()
        own = [self.slot(generation)] + ([marker] if marker is not None else [])
        held = not any(found > generation for found in self._generations(names)) and \
            all(name in names or self.store.present(name) for name in own)
        if not held and self.generation is None:
            return True  # let go meanwhile (a release forgets its generation before it deletes it)
        if not held:
            self.lost = True
        return held

    def release(self):
        """Let the lock go: this run's generation first (a run taking it over now finds it gone and backs off),
        then, unless a listing shows another generation (a run took the lock over, and holds the anchor with it),
        the anchor."""
        if self.renewer is not None:
            self.renewer.stop()
            self.renewer = None
        if self.generation is None:
            return
        generation, marker = self.generation, self.marker
        self.generation, self.marker = None, None
        self.store.delete(self.slot(generation))
        # any other generation listed: a run took the lock over (the next one, or from the anchor alone had this
        # run paused between its two deletes), and holds the anchor with it
        taken_over = any(found > 1 for found in self._generations(self.store.names()))
        if marker is not None:
            self.store.delete(marker)
        if not taken_over:
            self.store.delete(self.slot(1))

    def acquire(self):
        began = self.clock()
        deadline = began + self.timeout
        view = None
        while True:
            if view is None or self.abandoned(view):
                if self.take(view):
                    if self.renew_in_thread:
                        self.renewer = leases.Renewer(self.renew, self.lease, "lease-%s" % self.name)
                    return self
            view = self.observe()
            if view is not None and not self.abandoned(view):
                holders = [marker for marker in view.markers if not self.is_dead(marker)]
                refusal = self.refuse(holders[0]) if self.refuse is not None and len(holders) == 1 else None
                if refusal:
                    raise _naming(ConflictError(refusal, self.field), holders[0])
            holder = view.holder if view is not None else None
            if self.clock() > deadline:
                who = " (%s)" % holder[len(self.holder_prefix):] if holder else ""
                raise _naming(ConflictError("%s has been held for over %ds by another run%s; a lock is taken as "
                                            "abandoned once its holder has not renewed it for %ds"
                                            % (self.what, self.timeout, who, self.lease), self.field), holder)
            if self.waiting is not None:
                self.waiting(holder, self.clock() - began)
            self.sleep(0.05 + random.random() * 0.1)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False

    def try_once(self):
        """Take the lock if it is free now, without waiting: True when this run holds it."""
        return self.take(None)

    # clean-up of what killed runs left

    def clear_if_abandoned(self, view=None):
        """Take the lock over and let it go when it has no live holder (as ``abandoned`` judges at a first look:
        a holder known dead, or a markerless lock ``markerless`` calls abandoned). Whether it did."""
        view = view if view is not None else self.observe()
        if view is None or not self.abandoned(view) or not self.take(view):
            return False
        self.release()
        return True

    def clear_unnamed(self, view):
        """Take over and let go the lock ``view`` shows with nobody named in it (``View.orphan``, or a generation
        without a marker that ``markerless`` calls abandoned once watched long enough: no live wave claims it),
        once it stays so for ORPHAN_LOOKS readings. Whether it did."""
        if view.markers or (not view.orphan and self.markerless is not None
                            and not self.markerless(MARKERLESS_SECONDS + 1)):
            return False
        for _look in range(ORPHAN_LOOKS):
            self.sleep(ORPHAN_SECONDS)
            again = self.observe()
            if again is None or again.markers or (again.top, again.capacity) != (view.top, view.capacity):
                return False
        if not self.take(view):
            return False
        self.release()
        return True

    def clear_abandoned(self):
        """Break the lock when its holder ran on this controller and is gone (a run killed while it held it), and
        delete the markers of dead runs and of generations no longer held, so a converged run that writes nothing
        does not leave them for the next writer to find. Returns the listing (a complete one, for a registry:
        a run's last upload starts a refresh in libvirt that hid a killed run's lock from this clean-up)."""
        self.store.refresh()  # a volume a killed run was making may be on disk but not in libvirt's list yet
        names = self.store.names()
        if any(keys.slot_generation(name, self.name) for name in names):
            view = self.observe()
            if view is not None and not (view.markers and self.clear_if_abandoned(view)):
                self.clear_unnamed(view)
        for marker in names:
            if marker.startswith(self.holder_prefix) and self.is_dead(marker):
                self.store.delete(marker)
        return names


class NoLock:
    """What a lock is where there is nothing to lock (a pool without a registry), or the caller holds it already."""

    marker = None
    generation = None

    def acquire(self):
        return self

    def still_held(self):
        return True

    def release(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def machine_lock(pool, machine, identity, **options):
    """The lock of the hold on ``machine`` in the registry ``pool`` (holds.machine_hold gives it its lease and
    waits; a create's claim, admission.claim, is one without a marker)."""
    return VolumeLock(None, pool, name=keys.hold_volume(machine), holder_prefix=keys.hold_prefix(machine),
                      what="the hold on machine %s" % machine, identity=identity, **options)


def admission_lock(conn, pool, identity=None):
    """The admission lock of a registry ``pool``: held for seconds by a create's checks and a document's write."""
    return VolumeLock(conn, pool, identity=identity)


def held(conn, pool, locked, identity=None):
    """The admission lock of ``pool``, or nothing when the caller holds it already (``locked``)."""
    return NoLock() if locked else admission_lock(conn, pool, identity)


def image_upload_lock(conn, pool, checksum, identity=None):
    """The lock a run holds while it uploads image ``checksum`` into the storage ``pool``: runs on several
    processes or controllers wanting one image upload it once, and never delete one another's upload."""
    return VolumeLock(conn, pool, UPLOAD_WAIT_SECONDS, keys.upload_lock(checksum),
                      keys.upload_holder_prefix(checksum), "the upload lock of image %s" % checksum[:12],
                      lease=leases.LEASE_SECONDS, identity=identity)
