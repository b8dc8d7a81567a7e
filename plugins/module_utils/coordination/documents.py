# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documents: what the registry of a pool host keeps, as JSON in a dir storage pool (docs/concurrency.md).

Each object is stored as ``<key>.<generation>.json`` (keys.py names them); a write creates generation n+1 and only
then removes the older ones. Every document carries the checksum of its body, so a write cut off midway leaves a
document that fails verification and the reader falls back to the previous generation: an object is never
unreadable. A write that names the generation its change was made from (``put(expect=...)``) is a compare and
swap: it fails with DocumentChanged, writing nothing, when another run wrote a newer one since.
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


# The steps of a document write (put): read the document (outside the lock), then under the host's admission lock
# check that no newer complete generation was written since (with ``expect``), create generation n+1, upload its
# body, prune the older ones. tests/unit/plugins/module_utils/test_document_model.py explores every interleaving of
# writers taking exactly these steps, crashing anywhere; it fails when this list and the model's differ.
WRITE_STEPS = ("read", "check", "create", "upload", "prune")


def registry_path(storage_path):
    storage_path = storage_path.rstrip("/") or "/"
    return os.path.join(os.path.dirname(storage_path), os.path.basename(storage_path) + "-registry")


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
    """The documents of one pool host. ``pool`` is the libvirt storage pool, or None when it does not exist."""

    def __init__(self, conn, pool, identity=None):
        self.conn = conn
        self.pool = pool
        self.identity = identity  # whose admission lock a write takes (locks.Identity; None: its own)
        self._index = None
        self._listed_in = None  # the admission lock epoch the index was listed under (see put)
        self._refreshed = None  # the index listed right after this object refreshed the pool (_absent_from)
        self._bodies = {}
        self._read_from = {}  # key: the volume its body was read from (the newest readable generation)
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
                for name in self.pool.listVolumes():
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
            try:
                self.pool.refresh(0)
            except lv.libvirt.libvirtError:
                return False  # an upload is running there: its own refresh follows it; read again
            index = self._generations()
            if keys.POOL_KEY not in index or key in index:
                return False
        self._refreshed = index  # later keys absent from it cost nothing more
        return True

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
        and listed again, for up to EXPECTED_RETRY_SECONDS, as ``get(expected=True)`` does. A listing that holds
        the registration but not ``key`` is listed again after a refresh before the key is taken for new: a short
        list would otherwise have the write start again at generation 1 beside a newer one, and be lost."""
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
        found = volumes.reread(self.pool, read, judged, forget_and_read)
        if not verdict[0] and keys.POOL_KEY in self._generations():
            found = volumes.reread(self.pool, read, judged, forget_and_read, seconds=volumes.CONTENDED_RETRY_SECONDS)
        return found

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
            return keys.parse_document_volume(name)[1] if name and self._bodies[key] is not None else 0

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
        with locks.held(self.conn, self.pool, locked, self.identity), self._guard:
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
                name = keys.document_volume(key, generation)
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
            try:
                storage.upload_bytes(self.conn, vol, data)
            except LibvirtFailure:
                if expect is None or lv.lookup_volume(self.pool, name) is not None:
                    raise
                # pruned before its upload: a run that took the admission lock over wrote a newer one
                self._superseded_while_written(key, generation, expect)
                raise
            if expect is not None:
                self._superseded_while_written(key, generation, expect)
            # superseded generations are pruned; one that another run is opening for a read stays until the
            # next put (readers take the newest valid generation, so it is never read again)
            for _old, old_name in versions:
                self._prune(old_name)
            self._index[key] = [(generation, name)]
            self._bodies[key] = body
            self._read_from[key] = name

    def _superseded_while_written(self, key, generation, expect):
        """After a compare-and-swap write: fail with DocumentChanged when a generation newer than the one just
        written is there. Only a run that took the admission lock over from this one (paused past the lock's lease
        between its create and its upload) can have written it, from the document this one read: the newer one
        stands, and this run reports that its change was not made, instead of success (one listing)."""
        self._index = None
        later = [found for found, _name in self._complete_listing(key).get(key, []) if found > generation]
        if later:
            self.forget(key)
            raise DocumentChanged(
                "registry document %s changed while this run wrote it (it read generation %d and wrote %d; another "
                "run, which took the pool's admission lock over while this one was paused, wrote %d): the newer one "
                "stands; run again to apply this change to it" % (key, expect, generation, max(later)))

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
            names = volumes.listing(self.pool)
            return volumes.holds_registration(names) and name not in names
        # a volume known to be there: waiting longer costs nothing unless libvirt hides it (a loaded host's
        # refresh took more than the 2 s other readings wait)
        volumes.reread(self.pool, settled, bool, seconds=volumes.PRUNE_RETRY_SECONDS)

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
        with locks.held(self.conn, self.pool, False, self.identity), self._guard:
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

    def remove(self, key, locked=False, epoch=None, expected=False):
        """Delete every generation of ``key``; whether there was one. With ``expected`` (a journal this run wrote
        or found), a listing without the key is not believed at once: libvirt's refresh after another thread's
        upload can hide volumes that are there, and a journal left behind that way made the next run's clean-up
        look like a bug. The pool is refreshed and listed again, as ``get(expected=True)`` does."""
        with locks.held(self.conn, self.pool, locked, self.identity), self._guard:
            self._bodies.pop(key, None)
            self._read_from.pop(key, None)
            self._relist(epoch if locked else None)
            if expected and self.pool is not None:
                self._confirmed(self._generations, lambda index: key in index)
            versions = self._generations().pop(key, [])
            for _generation, name in versions:
                volumes.delete_when_read(self.pool, name)
        return bool(versions)
