# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pool registration and published classes, kept on the pool host in a dir storage pool of JSON documents.

Each object is stored as ``<key>.<generation>.json``; a write creates generation n+1 and only then removes the
older ones. Every document carries the checksum of its body, so a write cut off midway leaves a document that
fails verification and the reader falls back to the previous generation: an object is never unreadable.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import socket
import tempfile
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, LibvirtFailure

# The steps of a document write (put): read the document (outside the lock), then under the host's admission lock
# check that no newer complete generation was written since (with ``expect``), create generation n+1, upload its
# body, prune the older ones. tests/unit/plugins/module_utils/test_document_model.py explores every interleaving of
# writers taking exactly these steps, crashing anywhere; it fails when this list and the model's differ.
WRITE_STEPS = ("read", "check", "create", "upload", "prune")
REGISTRY_POOL = "machinery-registry"
EXPECTED_RETRY_SECONDS = 2.0
PRUNE_RETRY_SECONDS = 8.0
STORAGE_POOL = "machinery"
POOL_KEY = "pool"
# a key may hold dots (a class named t3.medium): the generation is the last number before ".json"
_DOC = re.compile(r"^(?P<key>[a-z0-9][-a-z0-9.]*)\.(?P<generation>[0-9]+)\.json$")


def registry_path(storage_path):
    storage_path = storage_path.rstrip("/") or "/"
    return os.path.join(os.path.dirname(storage_path), os.path.basename(storage_path) + "-registry")


def class_key(name):
    return "class-%s" % name


def move_key(machine):
    """The journal of a move of ``machine``, in the registries of both pools (fleets/migrate.py)."""
    return "move-%s" % machine


def pending_key(machine):
    """The journal of a machine being created or deleted: the volumes the run makes or removes. A run that dies
    midway leaves it, so the next run for that name knows exactly which volumes were left behind."""
    return "pending-%s" % machine


def encode(key, generation, body):
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    document = {"key": key, "generation": generation, "body": body,
                "sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    return json.dumps(document, sort_keys=True, indent=1).encode() + b"\n"


def decode(data, key):
    """The body of a stored document, or None when it is cut off, corrupt or belongs to another key."""
    try:
        document = json.loads(data.decode())
        body = document["body"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if document.get("key") != key or document.get("sha256") != hashlib.sha256(canonical.encode()).hexdigest():
        return None
    return body


def listing(pool):
    """The names of the pool's volumes, or none when libvirt cannot list them now."""
    try:
        return pool.listVolumes()
    except lv.libvirt.libvirtError:
        return []


def holds_registration(names):
    """Whether a listing of a registry holds its pool's registration, as every complete one does."""
    return any(name.startswith(POOL_KEY + ".") for name in names)


def reread(pool, read, believed, again=None, seconds=EXPECTED_RETRY_SECONDS):
    """``read()`` until ``believed`` of what it returns, refreshing the pool between reads (``again()`` reads after
    the first), for up to ``seconds``: libvirt refreshes a dir pool after every upload into it, and a listing or
    lookup taken meanwhile misses volumes that are there. The last reading when none is believed."""
    found = read()
    deadline = time.monotonic() + seconds
    while not believed(found) and time.monotonic() < deadline:
        time.sleep(0.05 + random.random() * 0.1)
        try:
            pool.refresh(0)
        except lv.libvirt.libvirtError:
            pass  # an upload is running there: its own refresh follows it
        found = (again or read)()
    return found


class DocumentChanged(ConflictError):
    """A compare-and-swap write (``Registry.put(expect=...)``) found a newer document than the one expected."""


class Registry:
    """The documents of one pool host. ``pool`` is the libvirt storage pool, or None when it does not exist."""

    def __init__(self, conn, pool):
        self.conn = conn
        self.pool = pool
        self._index = None
        self._listed_in = None  # the admission lock epoch the index was listed under (see put)
        self._bodies = {}
        self._read_from = {}  # key: the volume its body was read from (the newest readable generation)
        # the threads of one run (a batch, a set) share a pool's registry: one of them at a time in its caches
        self._guard = threading.RLock()

    @classmethod
    def open(cls, conn):
        pool = lv.lookup_storage_pool(conn, REGISTRY_POOL)
        if pool is not None and not pool.isActive():
            pool.create(0)
        return cls(conn, pool)

    def _generations(self):
        """{key: [(generation, volume name)] newest first}."""
        if self._index is None:
            self._index = {}
            if self.pool is not None:
                for name in self.pool.listVolumes():
                    match = _DOC.match(name)
                    if match:
                        self._index.setdefault(match.group("key"), []).append(
                            (int(match.group("generation")), name))
                for versions in self._index.values():
                    versions.sort(reverse=True)
        return self._index

    def keys(self, prefix="", epoch=None):
        """The keys starting with ``prefix``; with ``epoch`` (the caller holds the admission lock, see put), as
        listed under it."""
        with self._guard:
            if epoch is not None:
                self._relist(epoch)
            return sorted(key for key in self._generations() if key.startswith(prefix))

    def get(self, key, expected=False):
        """The body of ``key``, or None. With ``expected`` (a document that is normally there: the pool's
        registration, a class a machine names), absence is confirmed before it is believed: libvirt refreshes a
        dir pool's volume list after every upload into it (another run writing a document), and a listing taken
        meanwhile can miss volumes that are there. The pool is refreshed and listed again, for up to
        EXPECTED_RETRY_SECONDS, unless the listing holds the pool's registration and not ``key``: such a listing
        is complete (``_complete_listing``), so a key that is not there yet (a class a manifest is about to
        publish) costs nothing."""
        with self._guard:
            if key not in self._bodies:
                if expected and self.pool is not None:
                    self._bodies[key] = self._confirmed(lambda: self._read(key),
                                                        lambda found: found is not None or self._absent(key))
                else:
                    self._bodies[key] = self._read(key)
            return self._bodies[key]

    def _absent(self, key):
        """Whether the index is a complete listing without ``key``: it holds the registration (which every
        listing of a registered pool does) and no generation of ``key``. A listing taken while libvirt refreshed
        the pool misses the registration too, and is not believed."""
        index = self._generations()
        return key != POOL_KEY and POOL_KEY in index and key not in index

    def _read(self, key, relisted=False):
        vanished = False
        for _generation, name in self._generations().get(key, []):
            vol = lv.lookup_volume(self.pool, name)
            try:
                data = storage.download_bytes(self.conn, vol, limit=1024 * 1024) if vol is not None else None
            except storage.VolumeBeingWritten:
                continue  # another run is still writing it: not there yet, an older generation is the current one
            except storage.VolumeTooLarge:
                continue  # no document is that large: not one of ours
            except LibvirtFailure:
                if lv.lookup_volume(self.pool, name) is not None:
                    raise
                data = None  # pruned between the lookup and the download
            if data is None:
                vanished = True
                continue
            body = decode(data, key)
            if body is not None:
                self._read_from[key] = name
                return body
        if vanished and not relisted:
            # a concurrent put wrote a newer generation and pruned the ones listed here: list again, once
            self._index = None
            return self._read(key, relisted=True)
        return None

    def _complete_listing(self, key):
        """The index, confirmed when it looks short. Once a pool is registered its registry always holds its
        registration: a listing without it (or without any document) was taken while libvirt refreshed the pool
        after another run's upload, and may miss the current generation of ``key`` too. The pool is refreshed
        and listed again, for up to EXPECTED_RETRY_SECONDS, as ``get(expected=True)`` does. (A listing that holds
        the registration but misses ``key`` cannot be told from a new key; the write then collides on the volume
        name, and ``put`` lists again.)"""
        if key == POOL_KEY:
            return self._generations()
        return self._confirmed(self._generations, lambda index: POOL_KEY in index or key in index)

    def _confirmed(self, read, believed):
        """``read()`` until ``believed`` of what it returns, forgetting the index between reads (reread)."""
        def forget_and_read():
            self._index = None
            return read()
        return reread(self.pool, read, believed, forget_and_read)

    def _relist(self, epoch):
        """Forget the index unless it was listed while this process held the admission lock in ``epoch`` (the
        admission's hold on it, unbroken since): then no other run has written since, and this process's own
        writes are in the index already."""
        if epoch is None or epoch != self._listed_in:
            self._index = None
            self._listed_in = epoch

    def forget(self, key):
        """Drop what this object read of ``key`` (and its listing), so that the next ``get`` reads it afresh."""
        with self._guard:
            self._index = None
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)

    def read_generation(self, key):
        """The generation of ``key`` this object read (``get``): 0 when it read no document, None when it has not
        read the key."""
        with self._guard:
            if key not in self._bodies:
                return None
            name = self._read_from.get(key)
            return int(_DOC.match(name).group("generation")) if name and self._bodies[key] is not None else 0

    def _changed_since(self, key, versions, read):
        """The newest generation of ``key`` in ``versions`` newer than the one read (``read``) that holds a
        complete document, or None. Under the admission lock no writer is live, so a newer generation that
        cannot be read is a dead writer's (prune_superseded) and changes nothing."""
        for generation, name in versions:
            if generation <= read:
                break
            vol = lv.lookup_volume(self.pool, name)
            try:
                data = storage.download_bytes(self.conn, vol, limit=1024 * 1024) if vol is not None else None
            except (storage.VolumeBeingWritten, storage.VolumeTooLarge):
                continue
            if data is not None and decode(data, key) is not None:
                return generation
        return None

    def put(self, key, body, locked=False, epoch=None, expect=None):
        """Write ``key``. Under the host's admission lock (``locked`` when the caller holds it already), listed
        afresh: two runs writing the same document at once (both registering a pool, say) then take distinct
        generations instead of colliding on one volume name. ``epoch`` (admission.Admission.epoch) spares the
        listing when this process has held the lock since it last listed.

        ``expect``: compare and swap. The generation of ``key`` the caller's change was made from
        (``read_generation`` when it observed; 0 for no document). The write is made only if no newer complete
        generation has been written since; otherwise it fails with DocumentChanged and writes nothing, so a change
        made from an older document never replaces a newer one (docs/concurrency.md)."""
        # the host's lock first, then this object's guard: a thread holding the lock may need the guard
        with _held(self.conn, self.pool, locked), self._guard:
            self._relist(epoch if locked else None)
            for attempt in range(3):
                versions = self._complete_listing(key).get(key, [])
                if expect is not None:
                    newer = self._changed_since(key, versions, expect)
                    if newer is not None:
                        self.forget(key)
                        raise DocumentChanged(
                            "registry document %s changed while this run worked (it read generation %d, another "
                            "run wrote %d): nothing was written over it; run again to apply this change to the "
                            "new document" % (key, expect, newer))
                generation = versions[0][0] + 1 if versions else 1
                name = "%s.%d.json" % (key, generation)
                data = encode(key, generation, body)
                try:
                    vol = storage.create_volume(self.pool, name, len(data), "raw", mode="0600")
                    break
                except storage.VolumeExists:
                    if attempt == 2:
                        raise
                    # the listing missed that generation: list again, refreshed
                    self._index = None
                    try:
                        self.pool.refresh(0)
                    except lv.libvirt.libvirtError:
                        pass
            storage.upload_bytes(self.conn, vol, data)
            # superseded generations are pruned; one that another run is opening for a read stays until the
            # next put (readers take the newest valid generation, so it is never read again)
            for _old, old_name in versions:
                self._prune(old_name)
            self._index[key] = [(generation, name)]
            self._bodies[key] = body
            self._read_from[key] = name

    def _prune(self, name):
        """Delete a superseded generation that the listing showed. Right after an upload, libvirt refreshes the
        pool, and a lookup then may not find a volume that is there; a generation left that way beside the new one
        was seen after a re-registration. So a miss is tried again (reread) until the volume is deleted or a
        complete listing shows it gone. A busy one (a download stream has it open) is tried again too: a live
        reader is done within milliseconds, and a reader killed midway keeps its stream open in libvirtd only until
        the daemon sees its connection close (a killed run's re-run left two generations that way, under load).
        One still busy when the time is up is left to the next put."""
        def settled():
            if storage.delete_volume(self.pool, name, keep_if_busy=True):
                return True
            if lv.lookup_volume(self.pool, name) is not None:
                return False  # busy: again
            names = listing(self.pool)
            return holds_registration(names) and name not in names
        # a volume known to be there: waiting longer costs nothing unless libvirt hides it (a loaded host's
        # refresh took more than the 2 s other readings wait)
        reread(self.pool, settled, bool, seconds=PRUNE_RETRY_SECONDS)

    def superseded(self, key):
        """The generations of ``key`` listed beside the one its body was read from (``get`` first): an older one a
        prune could not delete, or a newer one a writer killed midway left unreadable. Another run's put between
        its upload and its prune shows here for a moment too; ``prune_superseded`` tells them apart."""
        with self._guard:
            current = self._read_from.get(key)
            if current is None:
                return []
            return [name for _generation, name in self._generations().get(key, []) if name != current]

    def prune_superseded(self, key):
        """Under the host's admission lock, which every writer holds from its volume's creation to its prune: read
        ``key`` afresh and delete every other generation of it. A newer one that cannot be read then is a dead
        writer's, never a live one's. Returns the names deleted."""
        with _held(self.conn, self.pool, False), self._guard:
            self._index = None
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)
            body = self._read(key)
            doomed = self.superseded(key) if body is not None else []
            for name in doomed:
                self._prune(name)
            self._index = None
            if body is not None:
                self._bodies[key] = body
            return doomed

    def delete(self, key, locked=False, epoch=None, expected=False):
        """Delete every generation of ``key``; whether there was one. With ``expected`` (a journal this run wrote
        or found), a listing without the key is not believed at once: libvirt's refresh after another thread's
        upload can hide volumes that are there, and a journal left behind that way made the next run's clean-up
        look like a bug. The pool is refreshed and listed again, as ``get(expected=True)`` does."""
        with _held(self.conn, self.pool, locked), self._guard:
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)
            self._relist(epoch if locked else None)
            if expected and self.pool is not None:
                self._confirmed(self._generations, lambda index: key in index)
            versions = self._generations().pop(key, [])
            for _generation, name in versions:
                _delete_when_read(self.pool, name)
        return bool(versions)

    def pool_registration(self):
        return self.get(POOL_KEY, expected=True)

    def machine_class(self, name):
        return self.get(class_key(name), expected=True)

    def machine_classes(self):
        classes = {}
        for key in self.keys("class-"):
            body = self.get(key)
            if body is not None:
                classes[body["name"]] = body
        return classes


LOCK_VOLUME = "admission.lock"
HOLDER_PREFIX = "admission.holder."
# A live holder keeps the lock for seconds (it creates volumes and defines a domain, or writes a document). A
# lock older than LOCK_STALE_SECONDS whose holder cannot be checked (another controller) is taken as abandoned,
# and a waiter gives up after LOCK_WAIT_SECONDS, so it always outlasts an abandoned lock. A holder on this
# controller that is no longer running is known dead at once and its lock is broken without waiting.
LOCK_STALE_SECONDS = 60
LOCK_WAIT_SECONDS = 90
# A run names itself (its marker) before it tries to create the lock, and deletes the lock before its marker, so a
# lock always has its holder's marker beside it; one with no marker for this long was left by an older version or
# by hand, and is broken without waiting for it to go stale.
MARKERLESS_SECONDS = 10


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _process_start(pid):
    """The start time of process ``pid`` (clock ticks since boot), or None when there is no such process: with
    the pid it names one process, even after the pid is reused."""
    try:
        with open("/proc/%d/stat" % int(pid)) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


# {pid: (controller token, process start)}: read once by a process (and again by a child forked from it), not for
# every marker named or checked; a batch of 300 creates named and checked a few thousand (80 us each)
_IDENTITY = {}


def _identity():
    pid = os.getpid()
    found = _IDENTITY.get(pid)
    if found is None:
        token = hashlib.sha256(("%s/%s" % (socket.gethostname(), _boot_id())).encode()).hexdigest()[:12]
        found = _IDENTITY[pid] = (token, _process_start(pid))
    return found


def controller_identity():
    """(this controller's token, this process's start time), as holder markers and waves (journal.py) name them."""
    controller, start = _identity()
    return controller, start or "0"


def _controller():
    """This controller, as a short stable token: its host name and boot."""
    return _identity()[0]


def holder_marker(prefix=HOLDER_PREFIX, tag=""):
    """The name of the volume that says who holds the lock: this controller, this process (pid and start time)
    and its thread (threads of one run take a pool's lock in turn), then ``tag`` (what the holder tells its
    waiters: coordination/holds.py). A name, not content: it is read with a listing, never with a stream that
    would keep the lock busy."""
    controller, start = _identity()
    return "%s%s.%d.%s.%d%s" % (prefix, controller, os.getpid(), start, threading.get_ident() % 10 ** 9, tag)


def holder_is_dead(marker, prefix=HOLDER_PREFIX):
    """True when the holder ``marker`` names ran on this controller and that process is gone; None when it
    cannot be told (another controller, or no marker)."""
    try:
        controller, pid, start = marker[len(prefix):].split(".")[:3]
    except (TypeError, ValueError):
        return None
    if controller != _controller():
        return None
    return _process_start(pid) != start


# An image upload can take minutes: its lock (one per image, in the storage pool beside the cache) is taken as
# abandoned only after UPLOAD_STALE_SECONDS without a live holder this controller can check, and a waiter gives
# up after UPLOAD_WAIT_SECONDS. Its names do not start with "image-", which marks the caches themselves.
UPLOAD_STALE_SECONDS = 900
UPLOAD_WAIT_SECONDS = 960


def image_upload_lock(conn, pool, checksum):
    """The lock a run holds while it uploads image ``checksum`` into the storage ``pool``: runs on several
    processes or controllers wanting one image upload it once, and never delete one another's upload."""
    return AdmissionLock(conn, pool, UPLOAD_WAIT_SECONDS, "upload-%s.lock" % checksum[:32],
                         "upload-%s.holder." % checksum[:32], UPLOAD_STALE_SECONDS,
                         "the upload lock of image %s" % checksum[:12])


def _delete_when_read(pool, name, seconds=PRUNE_RETRY_SECONDS):
    """Delete the registry volume ``name``. While another run reads it (its download stream keeps the volume busy)
    libvirt refuses: a reader is done within milliseconds, so try again for ``seconds``, as a prune does, then fail
    naming the volume. Two runs creating one name at once, under load, failed that way on deleting their own
    journal, and the journal left behind stopped the host's later runs."""
    def settled():
        return storage.delete_volume(pool, name, keep_if_busy=True) or lv.lookup_volume(pool, name) is None
    if not reread(pool, settled, bool, seconds=seconds):
        storage.delete_volume(pool, name)  # still busy: the failure, naming the volume


def _delete_quietly(pool, name):
    """Delete a lock volume, trying again for a moment while libvirt reports it busy."""
    for _attempt in range(20):
        try:
            storage.delete_volume(pool, name)
            return
        except LibvirtFailure:
            time.sleep(0.05)


def _delete_made(pool, volume, name):
    """Delete a lock volume this run made, by the handle its creation gave (no lookup); by its name when the
    handle fails (busy for a moment, say)."""
    try:
        volume.delete(0)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_STORAGE_VOL:
            _delete_quietly(pool, name)


def _naming(exc, marker):
    """``exc`` (a refusal to wait) with the holder ``marker`` it names (None: a holder that named nobody)."""
    exc.holder_marker = marker
    return exc


class AdmissionLock:
    """A lock on one pool host made from libvirt alone: creating a storage volume is atomic, so whoever creates
    ``admission.lock`` in the registry pool holds it; beside it, the volume ``admission.holder.<controller>.<pid>.
    <start>`` names the holder. A lock whose holder on this controller is gone is broken at once by the next
    run; one older than LOCK_STALE_SECONDS is broken by anyone. Works over any URI, across hosts and processes."""

    def __init__(self, conn, pool, timeout=LOCK_WAIT_SECONDS, name=LOCK_VOLUME, holder_prefix=HOLDER_PREFIX,
                 stale=LOCK_STALE_SECONDS, what="the admission lock of this pool", refuse=None, field="uri",
                 markerless=None, tag="", waiting=None, lease=None):
        self.conn = conn
        self.pool = pool
        self.timeout = timeout
        self.name = name  # another lock of the same kind: image_upload_lock
        self.holder_prefix = holder_prefix
        self.stale = stale
        self.what = what
        self.refuse = refuse  # refuse(holder marker): why not to wait for that holder, or None to wait
        self.field = field
        # markerless(age): whether a lock of this age with no holder marker is abandoned (machine_hold: a create
        # holds its machine that way, named by its wave); None: once it has had no marker for MARKERLESS_SECONDS
        self.markerless = markerless
        self.tag = tag  # appended to the holder marker (holder_marker)
        # lease: seconds a holder's lease lasts unless renewed (a renewer thread grows the lock volume by a block
        # every third of it); a waiter takes it as expired when it has seen no change for that long on its own
        # monotonic clock. None: a lock judged by the age of its file (the admission and upload locks).
        self.lease = lease
        self._seen = None  # (capacity, markers) of the lock as this waiter last saw it change, and when
        self._seen_at = None
        self._renewer = None
        self._stop = None
        self.renewals = 0
        # waiting(holder marker or None, seconds waited): called while the lock is held by another run
        self.waiting = waiting
        self.volume = None
        self.marker = None
        self.marker_volume = None

    def _current(self):
        """(age in seconds, holder markers) of the lock as it is now, or None when it is free. One marker is the
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
        self._note(found["capacity"], markers)
        mtime = found["mtime"]
        return max(0.0, time.time() - mtime) if mtime else 0.0, markers

    def _note(self, capacity, markers):
        """Remember when (this process's monotonic clock) the lock last looked different: a renewal grows it."""
        seen = (capacity, tuple(markers))
        if seen != self._seen:
            self._seen, self._seen_at = seen, time.monotonic()

    def _expired(self):
        """A leased lock whose holder has not renewed it for a whole lease, as this waiter has watched it."""
        return self._seen_at is not None and time.monotonic() - self._seen_at > self.lease

    def _abandoned(self, age, markers):
        """Whether a lock of this age and these markers has no live holder: its one holder is known dead, it has
        had no holder for MARKERLESS_SECONDS, or it is older than the stale limit."""
        if not markers:
            return self.markerless(age) if self.markerless is not None else age > MARKERLESS_SECONDS
        if all(holder_is_dead(marker, self.holder_prefix) for marker in markers):
            return True  # liveness first: a holder known dead is not waited for
        if self.lease is not None:
            return self._expired()  # never the host's file time against this controller's clock
        return age > self.stale

    def _break(self, markers):
        """Delete the lock when it still has ``markers``, and those markers. Waiters on this controller break one
        at a time (a file lock), so none deletes a lock another waiter has just taken."""
        path = os.path.join(tempfile.gettempdir(), "machinery-compute-%s.lock" % self.pool.UUIDString())
        with open(path, "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            current = self._current()
            if current is not None and current[1] == markers:
                _delete_quietly(self.pool, self.name)
                for marker in markers:
                    _delete_quietly(self.pool, marker)

    def break_abandoned(self, markers):
        """Break the lock when it still has ``markers`` (a listing's) and no live holder."""
        current = self._current()
        if current is not None and current[1] == markers and self._abandoned(*current):
            self._break(markers)

    def acquire(self):
        began = time.monotonic()
        deadline = began + self.timeout
        marker = holder_marker(self.holder_prefix, self.tag)
        while True:
            # named first: a run killed at any point leaves no lock without its (dead, so breakable) holder
            marker_volume = storage.create_volume(self.pool, marker, 1, "raw", mode="0600", replace=True)
            try:
                volume = self.pool.createXML(storage.volume_xml(self.name, 1, "raw", mode="0600"), 0)
            except lv.libvirt.libvirtError as exc:
                _delete_quietly(self.pool, marker)  # a waiter leaves no marker to be taken for the holder's
                if exc.get_error_code() not in (lv.libvirt.VIR_ERR_STORAGE_VOL_EXIST, lv.libvirt.VIR_ERR_INTERNAL_ERROR,
                                                lv.libvirt.VIR_ERR_OPERATION_FAILED):
                    raise LibvirtFailure("cannot take %s: %s" % (self.what, lv.describe(exc))) from None
            except BaseException:
                _delete_quietly(self.pool, marker)
                raise
            else:
                if self.lease is not None and lv.lookup_volume(self.pool, marker) is None:
                    # a waiter breaking the lock before us deleted every marker it listed, ours too: the lock
                    # is ours (we made it), so we name ourselves again (the protocol model found this)
                    marker_volume = storage.create_volume(self.pool, marker, 1, "raw", mode="0600", replace=True)
                self.volume, self.marker, self.marker_volume = volume, marker, marker_volume
                if self.lease is not None:
                    self._start_renewing()
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
                holders = [marker for marker in current[1] if not holder_is_dead(marker, self.holder_prefix)]
                refusal = self.refuse(holders[0]) if self.refuse is not None and len(holders) == 1 else None
                if refusal:
                    raise _naming(ConflictError(refusal, self.field), holders[0])
            holder = current[1][0] if current is not None and len(current[1]) == 1 else None
            if time.monotonic() > deadline:
                who = " (%s)" % holder[len(self.holder_prefix):] if holder else ""
                raise _naming(ConflictError("%s has been held for over %ds by another run%s; a lock is taken as "
                                            "abandoned after %ds" % (self.what, self.timeout, who, self.stale),
                                            self.field), holder)
            if self.waiting is not None:
                self.waiting(holder, time.monotonic() - began)
            time.sleep(0.05 + random.random() * 0.1)

    def _complete_names(self):
        """The volume names of the pool, from a listing that is complete: a registry always holds its pool's
        registration, so a listing of the registry without one is taken again (reread). Other pools' listings are
        taken as they come."""
        if self.pool.name() != REGISTRY_POOL:
            return listing(self.pool)
        return reread(self.pool, lambda: listing(self.pool), holds_registration)

    def clear_abandoned(self):
        """Break the lock when its holder ran on this controller and is gone (a run killed while it held it), and
        delete the markers of dead runs beside no lock, so a converged run that writes nothing does not leave them
        for the next writer to find. Whether there is a lock is read from a complete listing: a run's last upload
        (its journal cleared, a document written) starts a refresh in libvirt that hid a killed run's lock from
        this clean-up, and the lock outlived the run meant to clear it."""
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
                    return names
                self._complete_names()  # listed a moment ago, looked up in a refresh's window: again
            return names
        for marker in names:
            if marker.startswith(self.holder_prefix) and holder_is_dead(marker, self.holder_prefix):
                _delete_quietly(self.pool, marker)
        return names

    def _start_renewing(self):
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, args=(self._stop, self.volume), daemon=True,
                                         name="lease-%s" % self.name)
        self._renewer.start()

    def _renew(self, stop, volume):
        """Grow the lock volume by a block every third of the lease while this run holds it: waiters see it
        change. A renewal that fails is tried again at the next; check() tells the holder whether it still
        holds the lock."""
        capacity = 1
        while not stop.wait(self.lease / 3.0):
            capacity += 512
            try:
                volume.resize(capacity, 0)
                self.renewals += 1
            except lv.libvirt.libvirtError:
                pass

    def _stop_renewing(self):
        if self._renewer is not None:
            self._stop.set()
            self._renewer.join()
            self._renewer = None

    def still_held(self):
        """Whether this run still holds the lock: its lock volume and its own marker are both there (a run that
        takes over a lease deletes the markers it found). Looked up, and again for a moment when missing: a
        lookup during libvirt's refresh of the pool can miss a volume that is there."""
        if self.marker is None or self.lease is None:
            return True

        def both():
            return lv.lookup_volume(self.pool, self.name) is not None and \
                lv.lookup_volume(self.pool, self.marker) is not None
        return bool(reread(self.pool, both, bool))

    def release(self):
        # the lock before its marker: a run killed between the two leaves a dead marker, never a nameless lock
        self._stop_renewing()
        if self.volume is not None and self.lease is not None and not self.still_held():
            self.volume = None  # taken over: the lock is the new holder's now; only this run's marker goes
        if self.volume is not None:
            _delete_made(self.pool, self.volume, self.name)
            self.volume = None
        if self.marker is not None:
            _delete_made(self.pool, self.marker_volume, self.marker)
            self.marker, self.marker_volume = None, None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False


# A run that changes a machine holds it on its pool (``machine_hold``; coordination/holds.py takes it for every
# operation and makes it a lease, which its waiters judge on their own clocks; docs/concurrency.md). Without a
# lease (a create's claim, judged by its wave; a dead run's hold broken by clear_dead_holds) it is taken as
# abandoned after MOVE_STALE_SECONDS when its holder cannot be checked.
MOVE_STALE_SECONDS = UPLOAD_STALE_SECONDS


HOLD_PREFIX = "hold-"  # the holds on machines in a registry: hold-<machine>.lock and its holder markers


def hold_prefix(machine):
    return "%s%s.holder." % (HOLD_PREFIX, machine)


def holder_description(marker, prefix):
    """A holder marker as a reader can use it: "pid 123 on this controller", or "on another controller"."""
    try:
        controller, pid, _start = marker[len(prefix):].split(".")[:3]
    except (TypeError, ValueError):
        return "unknown"
    return "pid %s on this controller" % pid if controller == _controller() else "on controller %s" % controller


def machine_hold(conn, machine, timeout, refuse=None, field="name", registry=None, tag="", waiting=None,
                 lease=None):
    """The hold on ``machine`` in the registry of the pool behind ``conn`` (nothing when the pool has no
    registry): one run at a time changes the machine there. ``refuse(marker)`` says why not to wait for the
    run holding it (a move, for the machine module), or None to wait up to ``timeout``. ``registry`` (the run's
    Registry of that pool, opened and started already) spares looking the storage pool up again. A hold with no
    holder marker is a create's claim (``claim``): it is waited for while a live wave lists the machine."""
    if registry is not None:
        pool = registry.pool
    else:
        pool = lv.lookup_storage_pool(conn, REGISTRY_POOL)
        if pool is not None and not pool.isActive():
            pool.create(0)
    if pool is None:
        return _Held()
    return AdmissionLock(conn, pool, timeout, hold_volume(machine), hold_prefix(machine), MOVE_STALE_SECONDS,
                         "the hold on machine %s" % machine, refuse, field,
                         lambda age: claim_abandoned(conn, pool, machine, age), tag, waiting, lease)


# A create holds its machine too, but more cheaply than a change does (a marker and a lock volume, made and deleted,
# for each machine of a batch). Under the pool's admission lock, once the wave of its process (journal.py) lists
# the machine, the create makes the hold's lock volume alone: the wave names its holder. It deletes it before its
# process's hold of the admission lock ends, and the wave goes only then, so a claim without a live wave listing it
# is a dead run's. A run that finds the machine held otherwise (a move of it, an update, a deletion) lets the
# admission lock go and waits for that hold as any change does (machine_hold).
WAVE_PREFIX = "wave-"


def hold_volume(machine):
    return "%s%s.lock" % (HOLD_PREFIX, machine)


def claim(pool, machine):
    """Hold ``machine`` for a create, with no holder marker (see above): the lock volume's handle, or None when
    the machine is held already."""
    try:
        return pool.createXML(storage.volume_xml(hold_volume(machine), 1, "raw", mode="0600"), 0)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() in (lv.libvirt.VIR_ERR_STORAGE_VOL_EXIST, lv.libvirt.VIR_ERR_INTERNAL_ERROR,
                                    lv.libvirt.VIR_ERR_OPERATION_FAILED):
            return None
        raise LibvirtFailure("cannot hold machine %s: %s" % (machine, lv.describe(exc))) from None


def unclaim(pool, volume, machine):
    _delete_made(pool, volume, hold_volume(machine))


def wave_owner(key):
    """"controller.pid.start" of the process that wrote the wave ``key``, or None."""
    parts = key[len(WAVE_PREFIX):].split("-")
    return ".".join(parts[:3]) if key.startswith(WAVE_PREFIX) and len(parts) == 4 else None


def claim_abandoned(conn, pool, machine, age):
    """Whether the hold on ``machine`` in the registry ``pool``, of this ``age`` and with no holder marker, is
    abandoned. A wave that lists the machine names the create holding it: a wave is live while its process holds
    the pool's admission lock (its marker is there), or runs on this controller; one that cannot be read yet is
    taken to list it. While a live wave lists the machine it is not abandoned; when only dead ones do, it is at
    once; a claim that no wave lists (its dead wave cleaned already), or a lock killed before its holder named
    itself, after MARKERLESS_SECONDS."""
    names = reread(pool, lambda: listing(pool), holds_registration)
    holders = [name[len(HOLDER_PREFIX):] for name in names if name.startswith(HOLDER_PREFIX)]
    waves = sorted({match.group("key") for match in map(_DOC.match, names)
                    if match and match.group("key").startswith(WAVE_PREFIX)})
    registry = Registry(conn, pool)
    dead = False
    for key in waves:
        owner = wave_owner(key)
        if owner is None:
            continue
        body = registry.get(key)
        if body is not None and machine not in (body.get("machines") or {}):
            continue
        gone = holder_is_dead(owner, "")
        if gone is None:  # another controller's: live while it holds the admission lock
            gone = not any(holder.startswith(owner + ".") for holder in holders)
        if not gone:
            return False
        dead = True
    return dead or age > MARKERLESS_SECONDS


def clear_dead_holds(conn, pool, names):
    """Break the holds on machines (machine_hold, claim) in the registry ``pool`` that runs killed while they held
    them left, as ``names`` (a listing of it) shows them, and delete dead runs' markers beside no lock: a machine
    that no run changes again would keep them. Only a hold whose every marker names a gone process of this
    controller, or a create's claim that claim_abandoned calls abandoned, is touched."""
    locks, markers = set(), {}
    for name in names:
        if not name.startswith(HOLD_PREFIX):
            continue
        if name.endswith(".lock"):
            locks.add(name[len(HOLD_PREFIX):-len(".lock")])
        elif ".holder." in name:
            markers.setdefault(name[len(HOLD_PREFIX):name.index(".holder.")], []).append(name)
    for machine in sorted(locks | set(markers)):
        held = sorted(markers.get(machine, []))
        prefix = hold_prefix(machine)
        if held and not all(holder_is_dead(marker, prefix) for marker in held):
            continue  # a live holder, or one that cannot be told
        if machine not in locks:
            for marker in held:
                _delete_quietly(pool, marker)
            continue
        machine_hold(conn, machine, 0, registry=Registry(conn, pool)).break_abandoned(held)


class _Held:
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


def _held(conn, pool, locked):
    """The admission lock, or nothing when the caller holds it already."""
    return _Held() if locked else AdmissionLock(conn, pool)
