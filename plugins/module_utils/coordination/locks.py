# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock: a volume whose creator holds it, and beside it a holder marker whose name says who (docs/concurrency.md).

One class, ``VolumeLock``, makes every lock of the protocol: a pool's admission lock (``admission_lock``), an
image's upload lock (``image_upload_lock``) and the hold on a machine or a set (holds.py, with a lease). A run
names itself first (its marker), then creates the lock volume; it deletes the lock before its marker, so a lock
always has its holder's marker beside it and a killed holder is known dead at once by the next run on its
controller. Every lock is a lease (leases.py): its holder renews it while it holds it, and a waiter breaks it when
its holder is dead (liveness first) or when it has watched it unchanged for a whole lease on its own monotonic
clock. No lock is ever judged by its file's time against this controller's clock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import socket
import tempfile
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes

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


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
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
    """Who this process is, as its holder markers and waves name it: this controller (a token of its host name and
    boot), the process (pid and start time). Read once per object, and again in a child forked from the process;
    a run's objects share the run's (``Coordination.identity``), an object built alone reads its own."""

    def __init__(self):
        self._pid = None
        self._controller = None
        self._start = None

    def _read(self):
        pid = os.getpid()
        if pid != self._pid:
            self._controller = hashlib.sha256(("%s/%s" % (socket.gethostname(), _boot_id())).encode()).hexdigest()[:12]
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

    def marker(self, prefix, tag=""):
        """The name of this thread's holder marker (threads of one run take a pool's lock in turn)."""
        self._read()
        return keys.holder_marker(prefix, self._controller, self._pid, self._start, threading.get_ident(), tag)

    def is_dead(self, marker, prefix):
        """True when the holder ``marker`` names ran on this controller and that process is gone; None when it
        cannot be told (another controller, or no marker)."""
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


class VolumeLock:
    """A lock on one pool host made from libvirt alone: whoever creates the volume ``name`` in ``pool`` holds it;
    beside it, a volume named ``<holder_prefix><controller>.<pid>.<start>.<thread><tag>`` names the holder. Works
    over any URI, across hosts and processes."""

    def __init__(self, conn, pool, timeout=LOCK_WAIT_SECONDS, name=keys.ADMISSION_LOCK,
                 holder_prefix=keys.ADMISSION_HOLDER_PREFIX, what="the admission lock of this pool", refuse=None,
                 field="uri", markerless=None, tag="", waiting=None, lease=ADMISSION_LEASE_SECONDS, identity=None):
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
        # lease: seconds a holder's lease lasts unless renewed (leases.py)
        self.lease = lease
        self.watch = leases.Watch(lease)
        self.renewer = None
        # waiting(holder marker or None, seconds waited): called while the lock is held by another run
        self.waiting = waiting
        self.identity = identity if identity is not None else Identity()
        self.volume = None
        self.marker = None
        self.marker_volume = None

    def is_dead(self, marker):
        return self.identity.is_dead(marker, self.holder_prefix)

    def _current(self):
        """(seconds this waiter has watched it unchanged, holder markers) of the lock as it is now, or None when it
        is free; the age is this process's monotonic clock, never the file's time. One marker is the
        holder's; none means its holder was killed before it named itself (or is naming itself right now); more
        than one, leftovers of dead holders beside the live one."""
        vol = lv.lookup_volume(self.pool, self.name)
        if vol is None:
            return None
        try:
            found = elements.read_volume(elements.parse(vol.XMLDesc(0)))
            markers = sorted(name for name in self.pool.listVolumes() if name.startswith(self.holder_prefix))
        except lv.libvirt.libvirtError:
            return None  # released meanwhile: try again
        self.watch.note(found["capacity"], markers)
        return self.watch.unchanged_for(), markers

    def _abandoned(self, age, markers):
        """Whether a lock watched unchanged for ``age`` seconds with these markers has no live holder: its one holder
        is known dead, it has had no holder for MARKERLESS_SECONDS, or its lease expired."""
        if not markers:
            return self.markerless(age) if self.markerless is not None else age > MARKERLESS_SECONDS
        if all(self.is_dead(marker) for marker in markers):
            return True  # liveness first: a holder known dead is not waited for
        return self.watch.expired()  # never the host's file time against this controller's clock

    def _break(self, markers):
        """Delete the lock when it still has ``markers``, and those markers. Waiters on this controller break one
        at a time (a file lock), so none deletes a lock another waiter has just taken."""
        path = os.path.join(tempfile.gettempdir(), keys.break_guard_file(self.pool.UUIDString()))
        with open(path, "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            current = self._current()
            if current is not None and current[1] == markers:
                volumes.delete_quietly(self.pool, self.name)
                for marker in markers:
                    volumes.delete_quietly(self.pool, marker)

    def break_abandoned(self, markers):
        """Break the lock when it still has ``markers`` (a listing's) and no live holder."""
        current = self._current()
        if current is not None and current[1] == markers and self._abandoned(*current):
            self._break(markers)

    def acquire(self):
        began = time.monotonic()
        deadline = began + self.timeout
        marker = self.identity.marker(self.holder_prefix, self.tag)
        while True:
            # named first: a run killed at any point leaves no lock without its (dead, so breakable) holder
            marker_volume = storage.create_volume(self.pool, marker, 1, "raw", mode="0600", replace=True)
            try:
                volume = volumes.create_exclusive(self.pool, self.name, self.what)
            except BaseException:
                volumes.delete_quietly(self.pool, marker)
                raise
            if volume is None:
                volumes.delete_quietly(self.pool, marker)  # a waiter leaves no marker to be taken for the holder's
            else:
                if lv.lookup_volume(self.pool, marker) is None:
                    # a waiter breaking the lock before us deleted every marker it listed, ours too: the lock
                    # is ours (we made it), so we name ourselves again (the protocol model found this)
                    marker_volume = storage.create_volume(self.pool, marker, 1, "raw", mode="0600", replace=True)
                self.volume, self.marker, self.marker_volume = volume, marker, marker_volume
                self.renewer = leases.Renewer(volume, self.lease, "lease-%s" % self.name)
                return self
            current = self._current()
            if current is None:
                try:
                    # refused, yet not listed: a lock a killed run was making is on disk but not in libvirt's list
                    self.pool.refresh(0)
                except lv.libvirt.libvirtError:
                    pass
                current = self._current()
            if current is not None:
                if self._abandoned(*current):
                    self._break(current[1])
                    continue
                holders = [marker for marker in current[1] if not self.is_dead(marker)]
                refusal = self.refuse(holders[0]) if self.refuse is not None and len(holders) == 1 else None
                if refusal:
                    raise _naming(ConflictError(refusal, self.field), holders[0])
            holder = current[1][0] if current is not None and len(current[1]) == 1 else None
            if time.monotonic() > deadline:
                who = " (%s)" % holder[len(self.holder_prefix):] if holder else ""
                raise _naming(ConflictError("%s has been held for over %ds by another run%s; a lock is taken as "
                                            "abandoned once its holder has not renewed it for %ds"
                                            % (self.what, self.timeout, who, self.lease), self.field), holder)
            if self.waiting is not None:
                self.waiting(holder, time.monotonic() - began)
            time.sleep(0.05 + random.random() * 0.1)

    def _complete_names(self):
        """The volume names of the pool, from a listing that is complete: a registry always holds its pool's
        registration, so a listing of the registry without one is taken again. Other pools' listings are taken
        as they come."""
        if self.pool.name() != keys.REGISTRY_POOL:
            return volumes.listing(self.pool)
        return volumes.complete_listing(self.pool)

    def clear_abandoned(self):
        """Break the lock when its holder ran on this controller and is gone (a run killed while it held it), and
        delete the markers of dead runs beside no lock or beside a live holder's, so a converged run that writes nothing does not leave them
        for the next writer to find. Whether there is a lock is read from a complete listing: a run's last upload
        (its journal cleared, a document written) starts a refresh in libvirt that hid a killed run's lock from
        this clean-up, and the lock outlived the run meant to clear it. Returns the listing."""
        try:
            # a lock or marker a killed run was making may be on disk but not in libvirt's list of the pool yet
            self.pool.refresh(0)
        except lv.libvirt.libvirtError:
            pass  # an upload is running there: its own refresh follows it
        names = self._complete_names()
        if self.name in names:
            for _attempt in range(3):
                current = self._current()
                if current is not None:
                    if current[1] and self._abandoned(*current):
                        self._break(current[1])
                    else:  # a live holder's lock: only the markers of dead runs beside it go
                        self._delete_dead(current[1])
                    return names
                self._complete_names()  # listed a moment ago, looked up in a refresh's window: again
            return names
        self._delete_dead(name for name in names if name.startswith(self.holder_prefix))
        return names

    def _delete_dead(self, markers):
        """Delete those of ``markers`` whose runs are known dead (ran on this controller and are gone)."""
        for marker in markers:
            if self.is_dead(marker):
                volumes.delete_quietly(self.pool, marker)

    def still_held(self):
        """Whether this run still holds the lock: its lock volume and its own marker are both there (a run that
        takes over a lease deletes the markers it found). Looked up, and again for a moment when missing: a
        lookup during libvirt's refresh of the pool can miss a volume that is there."""
        if self.marker is None:
            return True

        def both():
            return lv.lookup_volume(self.pool, self.name) is not None and \
                lv.lookup_volume(self.pool, self.marker) is not None
        return bool(volumes.reread(self.pool, both, bool))

    def release(self):
        # the lock before its marker: a run killed between the two leaves a dead marker, never a nameless lock
        if self.renewer is not None:
            self.renewer.stop()
            self.renewer = None
        if self.volume is not None and not self.still_held():
            self.volume = None  # taken over: the lock is the new holder's now; only this run's marker goes
        if self.volume is not None:
            volumes.delete_made(self.pool, self.volume, self.name)
            self.volume = None
        if self.marker is not None:
            volumes.delete_made(self.pool, self.marker_volume, self.marker)
            self.marker, self.marker_volume = None, None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False


class NoLock:
    """What a lock is where there is nothing to lock (a pool without a registry), or the caller holds it already."""

    marker = None

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
