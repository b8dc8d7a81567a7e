# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documents: what the registry of a pool host keeps, as JSON in a dir storage pool (docs/concurrency.md).

Each object is stored as ``<key>.<generation>.json`` (keys.py names them). A write stages its body in a volume of
its own, then commits it as generation n+1 in one call that libvirt makes whole and exclusive (the generation's
volume created as a copy of the staged one, only if no volume of that name exists: volumes.DocumentStore.commit),
and only then removes the older generations. So a generation is never half written by a writer killed or paused
midway, and of two runs committing one generation exactly one succeeds: the store is the fence, no lock is taken.
Every document carries the checksum of its body; one that fails verification (corrupt, or left by an older
version's writer) is passed over and the reader takes the previous generation: an object is never unreadable.

A write that names the generation its change was made from (``put(expect=...)``) is a compare and swap: it commits
generation ``expect + 1``, and fails with DocumentChanged, leaving the document as it was, when that generation or
a newer one is there (complete, or still being copied by libvirt). After its commit it lists the key once more: a
newer generation there that was not made from this one (its ``base``) means this write reused the name of a
generation pruned since (it was paused while two other writes were made): it is deleted again and the write
fails the same way. Every read-modify-write caller runs its change again on a conflict (interface/module_base.py,
Kubernetes' RetryOnConflict). docs/concurrency.md, "Documents".
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes


# The store calls of a document write (put), in order: read the document (get), stage its body in a volume of the
# writer's own, commit it as the next generation (exclusive and whole), check by one more listing that no newer
# generation that was not made from it is there, prune the staged volume and the older generations.
# tests/unit/plugins/module_utils/test_document_model.py drives Registry itself through these calls against an
# in-memory store, killing or pausing writers between any two of them.
WRITE_STEPS = ("read", "stage", "commit", "check", "prune")
COMMIT_ATTEMPTS = 3  # a write without ``expect`` whose generation was taken, or found stale, tries the next one
MAX_DOCUMENT = 1024 * 1024
READ_RELISTS = 20  # a read whose listed generations were all pruned before it read them lists again, this often


def registry_path(storage_path):
    storage_path = storage_path.rstrip("/") or "/"
    return os.path.join(os.path.dirname(storage_path), os.path.basename(storage_path) + "-registry")


def encode(key, generation, body, writer=None, base=None):
    """A stored document: ``writer`` names the write that made it (its staged volume, unique to the write) and
    ``base`` the write that made the document it was changed from (None for a write that read none, or wrote
    blind)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    document = {"key": key, "generation": generation, "body": body,
                "sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    if writer is not None:
        document["writer"] = writer
        document["base"] = base
    return json.dumps(document, sort_keys=True, indent=1).encode() + b"\n"


def decode(data, key, envelope=False):
    """The body of a stored document, or None when it is cut off, corrupt or belongs to another key; with
    ``envelope``, (body, writer, base)."""
    try:
        document = json.loads(data.decode())
        body = document["body"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return (None, None, None) if envelope else None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if document.get("key") != key or document.get("sha256") != hashlib.sha256(canonical.encode()).hexdigest():
        return (None, None, None) if envelope else None
    return (body, document.get("writer"), document.get("base")) if envelope else body


# How many listings, each right after a refresh of this process's own, must agree that a key is absent before it
# is believed (_absent_from). libvirt refreshes a dir pool after every upload into it, and such a refresh that
# fails midway (a volume deleted while it scans) leaves the list short until the next one: a listing taken right
# after a good refresh of ours can still be short when another run's upload ended in between (2 of 404 reads of
# the registry race under load 7 with one confirmation). Each round costs one refresh and one listing, once per
# registry object: later absent keys of the same listing cost nothing.
ABSENCE_CONFIRMATIONS = 3


class DocumentChanged(ConflictError):
    """A compare-and-swap write (``Registry.put(expect=...)``) found a newer document than the one expected."""


class Registry:
    """The documents of one pool host. ``pool`` is the libvirt storage pool, or None when it does not exist;
    ``store`` the storage calls made on it (volumes.DocumentStore of ``pool`` unless the document model gives its
    own)."""

    def __init__(self, conn, pool, identity=None, store=None):
        self.conn = conn
        self.pool = pool
        self.identity = identity  # who names this object's staged volumes (locks.Identity; None: its own)
        self.store = store if store is not None else (volumes.DocumentStore(conn, pool) if pool is not None else None)
        self._index = None
        self._listed_in = None  # the admission lock epoch the index was listed under (see put)
        self._refreshed = None  # the index listed right after this object refreshed the pool (_absent_from)
        self._bodies = {}
        self._read_from = {}  # key: the volume its body was read from (the newest readable generation)
        self._writers = {}  # key: the write that made the document read (its envelope's ``writer``)
        # the threads of one run (a batch, a set) share a pool's registry: one of them at a time in its caches
        self._guard = threading.RLock()

    @classmethod
    def open(cls, conn, identity=None):
        pool = lv.lookup_storage_pool(conn, keys.REGISTRY_POOL)
        if pool is not None and not pool.isActive():
            pool.create(0)
        return cls(conn, pool, identity)

    def _generations(self):
        """{key: [(generation, volume name)] newest first}."""
        if self._index is None:
            self._index = {}
            if self.pool is not None:
                for name in self.store.listing():
                    document = keys.parse_document_volume(name)
                    if document:
                        self._index.setdefault(document[0], []).append((document[1], name))
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
        return key != keys.POOL_KEY and self._absent_from(index, key)

    def _absent_from(self, index, key):
        """A listing that holds the registration and not ``key`` is believed only after the pool was refreshed
        and listed again: libvirt's refresh after an upload, racing a volume being created or deleted, can leave
        the pool's list short by some volumes until the next refresh (in the registry race of the hardening
        tests, 44 of 2,187 reads saw the registration and missed the class for 2.5 s on a loaded machine)."""
        if keys.POOL_KEY not in index or key in index:
            return False
        if index is self._refreshed:
            return True
        for _round in range(ABSENCE_CONFIRMATIONS):
            self._index = None
            if not self.store.refresh(0):
                return False  # an upload is running there: its own refresh follows it; read again
            index = self._generations()
            if keys.POOL_KEY not in index or key in index:
                return False
        self._refreshed = index  # later keys absent from it cost nothing more
        return True

    def _read(self, key, relisted=0):
        vanished = False
        for _generation, name in self._generations().get(key, []):
            try:
                data = self.store.read(name, MAX_DOCUMENT)
            except storage.VolumeBeingWritten:
                continue  # libvirt still copies a commit into it: not there yet, an older generation is current
            except storage.VolumeTooLarge:
                continue  # no document is that large: not one of ours
            if data is None:
                vanished = True  # pruned between the listing and the read
                continue
            body, writer, _base = decode(data, key, envelope=True)
            if body is not None:
                self._read_from[key] = name
                self._writers[key] = writer
                return body
        if vanished:
            # concurrent puts committed newer generations and pruned the ones listed here: list again (each time a
            # listing's generations all vanish, another write was made)
            if relisted >= READ_RELISTS:
                raise LibvirtFailure("registry document %s changed %d times while this run read it; run again"
                                     % (key, READ_RELISTS))
            self._index = None
            return self._read(key, relisted + 1)
        return None

    def _complete_listing(self, key):
        """The index, confirmed when it looks short. Once a pool is registered its registry always holds its
        registration: a listing without it (or without any document) was taken while libvirt refreshed the pool
        after another run's upload, and may miss the current generation of ``key`` too. The pool is refreshed
        and listed again, for up to EXPECTED_RETRY_SECONDS, as ``get(expected=True)`` does. A listing that holds
        the registration but not ``key`` is listed again after a refresh before the key is taken for new: a short
        list would otherwise have the write start again at generation 1 beside a newer one."""
        if key == keys.POOL_KEY:
            return self._generations()
        return self._confirmed(self._generations, lambda index: key in index or self._absent_from(index, key))

    def _confirmed(self, read, believed):
        """``read()`` until ``believed`` of what it returns, forgetting the index between reads (reread). A
        registered pool where nothing was believed in EXPECTED_RETRY_SECONDS had other runs writing its registry
        all along (libvirt refused each refresh while their uploads ran): their writes end, so it is asked
        CONTENDED_RETRY_SECONDS longer before the last reading is taken."""
        verdict = [False]

        def judged(found):
            verdict[0] = believed(found)  # asked once a reading: a confirmation refreshes the pool
            return verdict[0]

        def forget_and_read():
            self._index = None
            return read()
        found = volumes.reread(self.store, read, judged, forget_and_read)
        if not verdict[0] and keys.POOL_KEY in self._generations():
            found = volumes.reread(self.store, read, judged, forget_and_read, seconds=volumes.CONTENDED_RETRY_SECONDS)
        return found

    def _relist(self, epoch):
        """Forget the index unless it was listed while this process held the admission lock in ``epoch`` (the
        admission's hold on it, unbroken since) and is used for the keys only admissions write (waves, a create's
        pending journal): no other run writes those meanwhile, and this process's own writes are in the index."""
        if epoch is None or epoch != self._listed_in:
            self._index = None
            self._listed_in = epoch

    def forget(self, key):
        """Drop what this object read of ``key`` (and its listing), so that the next ``get`` reads it afresh."""
        with self._guard:
            self._index = None
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)
            self._writers.pop(key, None)

    def read_generation(self, key):
        """The generation of ``key`` this object read (``get``): 0 when it read no document, None when it has not
        read the key."""
        with self._guard:
            if key not in self._bodies:
                return None
            name = self._read_from.get(key)
            return keys.parse_document_volume(name)[1] if name and self._bodies[key] is not None else 0

    def _stage_name(self):
        identity = self.identity if self.identity is not None else locks.Identity()
        return identity.marker(keys.STAGE_PREFIX, identity.next_staging())

    def _newer(self, key, versions, than):
        """Of ``versions``, those newer than generation ``than`` that hold a document or are being committed
        (libvirt still copies them): [(generation, writer, base)], newest first. One that reads as no document of
        ``key`` (an older version's writer killed between its create and its upload, or a corrupt volume) is
        passed over, as readers pass it over."""
        found = []
        for generation, name in versions:
            if generation <= than:
                break
            try:
                data = self.store.read(name, MAX_DOCUMENT)
            except storage.VolumeBeingWritten:
                found.append((generation, None, None))
                continue
            except storage.VolumeTooLarge:
                continue
            if data is None:
                continue  # pruned since it was listed: a newer one is there
            body, writer, base = decode(data, key, envelope=True)
            if body is not None:
                found.append((generation, writer, base))
        return found

    def put(self, key, body, locked=False, epoch=None, expect=None):
        """Write ``key``: stage, commit the next generation, check, prune (WRITE_STEPS). No lock is taken: the
        commit's exclusive create decides between writers. ``locked`` and ``epoch`` (admission.Admission.epoch):
        the caller holds the pool's admission lock and ``key`` is one only admissions write, so the listing made
        under that hold can be used again.

        ``expect``: compare and swap. The generation of ``key`` the caller's change was made from
        (``read_generation`` when it observed; 0 for no document). The write commits generation ``expect + 1``
        only if no newer generation holds a document; otherwise it fails with DocumentChanged and the document
        stays as the other run wrote it (docs/concurrency.md). Without ``expect`` the write is the newest
        generation once it returns (the last writer wins)."""
        with self._guard:
            self._relist(epoch if locked else None)
            base = self._writers.get(key) if expect is not None and expect == self.read_generation(key) else None
            staged = self._stage_name()
            try:
                self._commit(key, body, expect, staged, base)
            finally:
                self.store.discard(staged)

    def _commit(self, key, body, expect, staged, base):
        for attempt in range(COMMIT_ATTEMPTS):
            versions = self._complete_listing(key).get(key, [])
            if expect is not None:
                newer = self._newer(key, versions, expect)
                if newer:
                    raise self._changed(key, expect, newer[0][0])
                generation = max([found[0] for found in versions if found[0] > expect] or [expect]) + 1
            else:
                generation = versions[0][0] + 1 if versions else 1
            name = keys.document_volume(key, generation)
            data = encode(key, generation, body, staged, base)
            self.store.stage(staged, data)
            if not self.store.commit(name, staged, len(data)):
                self._index = None
                if expect is not None:
                    raise self._changed(key, expect, generation)
                self.store.refresh(0)
                continue  # a blind write: the listing missed that generation; the next one
            self._index = None
            later = self._complete_listing(key).get(key, [])
            newer = self._stale(key, later, generation, staged)
            if newer:
                self.store.discard(name)
                self._index = None
                if expect is not None:
                    raise self._changed(key, expect, newer[0][0])
                continue
            for old, old_name in later:
                if old < generation:
                    self._prune(old_name)
            self._index = None
            self._bodies[key] = body
            self._read_from[key] = name
            self._writers[key] = staged
            return
        raise LibvirtFailure("cannot write registry document %s: another run took each of %d generations tried"
                             % (key, COMMIT_ATTEMPTS))

    def _stale(self, key, versions, generation, staged):
        """The check after a commit of ``generation``: the generations in ``versions`` (listed after it) newer than
        it, when none of them was made from this write (``staged``): this write then took the name of a generation
        pruned since it read (it was paused while two other writes were made), and the document it changed is not
        the current one. Empty when the commit stands (nothing newer, or a newer write made from this one)."""
        newer = self._newer(key, versions, generation)
        return newer if newer and not any(found[2] == staged for found in newer) else []

    def _changed(self, key, expect, newer):
        self.forget(key)
        return DocumentChanged(
            "registry document %s changed while this run worked (it read generation %d, another run wrote %d): "
            "nothing was written over it; run again to apply this change to the new document" % (key, expect, newer))

    def _prune(self, name):
        """Delete a superseded generation that the listing showed. Right after an upload, libvirt refreshes the
        pool, and a lookup then may not find a volume that is there; a generation left that way beside the new one
        was seen after a re-registration. So a miss is tried again (reread) until the volume is deleted or a
        complete listing shows it gone. A busy one (a download stream has it open) is tried again too: a live
        reader is done within milliseconds, and a reader killed midway keeps its stream open in libvirtd only until
        the daemon sees its connection close (a killed run's re-run left two generations that way, under load).
        One still busy when the time is up is left to the next put."""
        # a volume known to be there: waiting longer costs nothing unless libvirt hides it (a loaded host's
        # refresh took more than the 2 s other readings wait)
        volumes.reread(self.store, lambda: self.store.prune(name), bool, seconds=volumes.PRUNE_RETRY_SECONDS)

    def superseded(self, key):
        """The generations of ``key`` listed beside the one its body was read from (``get`` first): an older one a
        prune could not delete, or a newer one that holds no document (an older version's writer killed midway).
        Another run's put between its commit and its prune shows here for a moment too; ``prune_superseded``
        tells them apart."""
        with self._guard:
            current = self._read_from.get(key)
            if current is None:
                return []
            return [name for _generation, name in self._generations().get(key, []) if name != current]

    def prune_superseded(self, key):
        """Read ``key`` afresh and delete the generations older than the one read, and the newer ones that hold no
        document and are not being committed (passed over by every reader and writer). Returns the names
        deleted."""
        with self._guard:
            self.forget(key)
            body = self._read(key)
            doomed = []
            if body is not None:
                current = keys.parse_document_volume(self._read_from[key])[1]
                versions = self._generations().get(key, [])
                live = {found[0] for found in self._newer(key, versions, current)}
                doomed = [name for generation, name in versions
                          if generation < current or (generation > current and generation not in live)]
            for name in doomed:
                self._prune(name)
            self._index = None
            if body is not None:
                self._bodies[key] = body
            return doomed

    def remove(self, key, locked=False, epoch=None, expected=False):
        """Delete every generation of ``key``; whether there was one. With ``expected`` (a journal this run wrote
        or found), a listing without the key is not believed at once: libvirt's refresh after another thread's
        upload can hide volumes that are there, and a journal left behind that way made the next run's clean-up
        look like a bug. The pool is refreshed and listed again, as ``get(expected=True)`` does. A document is
        removed by the run that holds what it describes (its machine, its set), or by the run that wrote it."""
        with self._guard:
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)
            self._writers.pop(key, None)
            self._relist(epoch if locked else None)
            if expected and self.pool is not None:
                self._confirmed(self._generations, lambda index: key in index)
            versions = self._generations().pop(key, [])
            for _generation, name in versions:
                self.store.delete_when_read(name)
        return bool(versions)
