# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The primitive: what libvirt offers every URI, and how the protocol reads it (docs/concurrency.md).

Creating a storage volume of a name that does not exist yet is atomic: of two runs creating one name, exactly one
succeeds (``create_exclusive``). Every lock and document is built on it. libvirt refreshes a dir pool after every
upload into it, and a listing or lookup taken meanwhile misses volumes that are there: ``reread`` reads again
until what it reads is believable, and a registry's listing is believed when it holds the pool's registration,
which every registered pool's does.
"""

from __future__ import annotations

import random
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

EXPECTED_RETRY_SECONDS = 2.0
# a registered pool's document that is neither found nor confirmed absent in EXPECTED_RETRY_SECONDS (other runs
# write the registry all the while, and libvirt refuses a refresh while an upload runs): asked this much longer
CONTENDED_RETRY_SECONDS = 10.0
PRUNE_RETRY_SECONDS = 8.0
# libvirt's answers to a create of a name that exists (the last two while another create of it is under way)
_TAKEN = ("VIR_ERR_STORAGE_VOL_EXIST", "VIR_ERR_INTERNAL_ERROR", "VIR_ERR_OPERATION_FAILED")


def _taken(exc):
    """Whether a create failed because a volume of that name exists (or another create of it is under way)."""
    return exc.get_error_code() in [getattr(lv.libvirt, code) for code in _TAKEN]


def create_exclusive(pool, name, what):
    """Create the empty volume ``name`` in ``pool``: its handle, or None when it exists (another run made it).
    ``what`` names it in the error of any other failure."""
    try:
        return pool.createXML(storage.volume_xml(name, 1, "raw", mode="0600"), 0)
    except lv.libvirt.libvirtError as exc:
        if _taken(exc):
            return None
        raise LibvirtFailure("cannot take %s: %s" % (what, lv.describe(exc))) from None


def listing(pool):
    """The names of the pool's volumes, or none when libvirt cannot list them now (a refresh under way). A
    connection that died (its daemon restarted, its host gone) is no such moment: it fails, naming the pool's URI,
    instead of being listed again until a run's hold timeout."""
    try:
        return pool.listVolumes()
    except lv.libvirt.libvirtError as exc:
        conn = pool.connect()
        try:
            alive = conn.isAlive()
        except lv.libvirt.libvirtError:
            alive = False
        if not alive:
            raise LibvirtFailure("lost the connection to %s while reading its registry: %s"
                                 % (_uri(conn), lv.describe(exc))) from None
        return []


def _uri(conn):
    try:
        return conn.getURI()
    except lv.libvirt.libvirtError:
        return "the pool's daemon"


def holds_registration(names):
    """Whether a listing of a registry holds its pool's registration, as every complete one does."""
    return any(name.startswith(keys.POOL_KEY + ".") for name in names)


def complete_listing(pool):
    """The names of a registry ``pool``'s volumes, from a listing that holds its registration (``reread``)."""
    return reread(pool, lambda: listing(pool), holds_registration)


def reread(pool, read, believed, again=None, seconds=EXPECTED_RETRY_SECONDS):
    """``read()`` until ``believed`` of what it returns, refreshing the pool between reads (``again()`` reads after
    the first), for up to ``seconds``. The last reading when none is believed. ``pool``: a libvirt storage pool, or
    a store with its ``refresh(0)`` (DocumentStore)."""
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


def delete_when_read(pool, name, seconds=PRUNE_RETRY_SECONDS):
    """Delete the registry volume ``name``. While another run reads it (its download stream keeps the volume busy)
    libvirt refuses: a reader is done within milliseconds, so try again for ``seconds``, as a prune does, then fail
    naming the volume. Two runs creating one name at once, under load, failed that way on deleting their own
    journal, and the journal left behind stopped the host's later runs."""
    def settled():
        return storage.delete_volume(pool, name, keep_if_busy=True) or lv.lookup_volume(pool, name) is None
    if not reread(pool, settled, bool, seconds=seconds):
        storage.delete_volume(pool, name)  # still busy: the failure, naming the volume


def delete_quietly(pool, name):
    """Delete a lock volume, trying again for a moment while libvirt reports it busy."""
    for _attempt in range(20):
        try:
            storage.delete_volume(pool, name, checked=False)
            return
        except LibvirtFailure:
            time.sleep(0.05)


def delete_made(pool, volume, name):
    """Delete a lock volume this run made, by the handle its creation gave (no lookup); by its name when the
    handle fails (busy for a moment, say)."""
    try:
        volume.delete(0)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() != lv.libvirt.VIR_ERR_NO_STORAGE_VOL:
            delete_quietly(pool, name)


class PoolStore:
    """The storage calls a lock makes, on one libvirt storage pool: the only way ``locks.VolumeLock`` touches
    libvirt. The protocol's model (tests/unit/plugins/module_utils/test_protocol_model.py) drives the same lock
    class against an in-memory store with these five calls, pausing or killing a run between any two of them."""

    def __init__(self, pool, complete=None):
        self.pool = pool
        # a registry: a listing is believed once it holds the pool's registration (None: asked of the pool)
        self.complete = complete
        self._made = {}  # name -> the handle its create gave, so that deleting it needs no lookup

    def create(self, name):
        """Create the empty volume ``name``: True when this call made it, False when it was there."""
        volume = create_exclusive(self.pool, name, "lock volume %s" % name)
        if volume is not None:
            self._made[name] = volume
        return volume is not None

    def delete(self, name):
        """Delete ``name`` when it is there (busy for a moment: tried again)."""
        volume = self._made.pop(name, None)
        if volume is not None:
            delete_made(self.pool, volume, name)
        else:
            delete_quietly(self.pool, name)

    def capacity(self, name):
        """The size of ``name`` in bytes, or None when it is not there (its holder's renewals grow it)."""
        vol = lv.lookup_volume(self.pool, name)
        try:
            return vol.info()[1] if vol is not None else None
        except lv.libvirt.libvirtError:
            return None  # deleted since the lookup

    def resize(self, name, capacity):
        """Grow ``name`` to ``capacity`` bytes; False when it is not there or libvirt refused."""
        try:
            vol = lv.lookup_volume(self.pool, name)
            if vol is None:
                return False
            vol.resize(capacity, 0)
            return True
        except lv.libvirt.libvirtError:
            return False

    def refresh(self):
        """Have libvirt read the pool's directory again (an upload running there refreshes it when it ends)."""
        try:
            self.pool.refresh(0)
        except lv.libvirt.libvirtError:
            pass

    def names(self):
        """The pool's volume names; a registry's from a listing that holds its registration (``reread``)."""
        if self.complete is None:
            self.complete = self.pool.name() == keys.REGISTRY_POOL
        if self.complete:
            return complete_listing(self.pool)
        return listing(self.pool)

    def exists(self, name):
        """Whether a lookup finds ``name`` (one call; it can miss a volume during libvirt's refresh of the pool)."""
        return lv.lookup_volume(self.pool, name) is not None

    def present(self, name):
        """Whether ``name``, which should be there, is: looked up, and when missing again for a moment through
        libvirt's refresh of the pool (``reread``)."""
        return self.exists(name) or bool(reread(self.pool, lambda: self.exists(name), bool))


class DocumentStore(PoolStore):
    """The storage calls of a registry's documents (documents.Registry), on one libvirt storage pool: the only way
    the Registry touches libvirt. The document model (tests/unit/plugins/module_utils/test_document_model.py)
    drives the same Registry against an in-memory store with these calls, killing or pausing a writer between any
    two of them.

    A document's generation is committed in one call that libvirt makes whole on the host (``commit``: the volume
    of the generation is created as a copy of the writer's staged volume, and only if no volume of that name
    exists): a writer killed or paused at any point leaves either no generation or a complete one, never a
    generation another run could mistake for a live writer's."""

    def __init__(self, conn, pool):
        super().__init__(pool, complete=True)
        self.conn = conn

    def listing(self):
        """The names of the pool's volumes, as libvirt lists them now (``listing``)."""
        return listing(self.pool)

    def refresh(self, _flags=0):
        """Have libvirt read the pool's directory again; False when it refused (an upload running there)."""
        try:
            self.pool.refresh(0)
            return True
        except lv.libvirt.libvirtError:
            return False

    def read(self, name, limit):
        """The content of ``name``, or None when it is not there (pruned since it was listed). Raises
        storage.VolumeBeingWritten while libvirt still builds it (a commit under way) and storage.VolumeTooLarge
        beyond ``limit`` bytes."""
        vol = lv.lookup_volume(self.pool, name)
        if vol is None:
            return None
        try:
            return storage.download_bytes(self.conn, vol, limit=limit)
        except (storage.VolumeBeingWritten, storage.VolumeTooLarge):
            raise
        except LibvirtFailure:
            if lv.lookup_volume(self.pool, name) is not None:
                raise
            return None

    def stage(self, name, data):
        """Write ``data`` into a new volume ``name`` of the writer's own (its name is unique to the run)."""
        vol = storage.create_volume(self.pool, name, len(data), "raw", mode="0600", replace=True)
        self._made[name] = vol  # the commit copies it and the discard deletes it by this handle: no lookup
        storage.upload_bytes(self.conn, vol, data)

    def commit(self, name, staged, size):
        """Create ``name`` as a copy of the staged volume ``staged`` (``size`` bytes): True when this call made it,
        False when a volume of that name is there (another run committed that generation). libvirt copies on the
        host and makes the name exclusively (its own list, then the file's exclusive create), so of two runs
        committing one name exactly one succeeds, whole."""
        source = self._made.get(staged) or lv.lookup_volume(self.pool, staged)
        if source is None:
            raise LibvirtFailure("the staged document %s is gone before its commit as %s" % (staged, name))
        try:
            writer.write(self.pool, "createXMLFrom", storage.volume_xml(name, size, "raw", mode="0600"), source, 0)
            return True
        except lv.libvirt.libvirtError as exc:
            if _taken(exc) or "already" in lv.describe(exc):  # also a file libvirt's list does not know of yet
                return False
            raise LibvirtFailure("cannot commit document %s: %s" % (name, lv.describe(exc))) from None

    def discard(self, name):
        """Delete a volume of this run's own (its staged document, a generation it committed in vain)."""
        self.delete(name)

    def delete_when_read(self, name):
        delete_when_read(self.pool, name)

    def prune(self, name):
        """Delete a superseded generation the listing showed: True once deleted or gone, False while busy (a
        reader's download holds it)."""
        if storage.delete_volume(self.pool, name, keep_if_busy=True):
            return True
        if lv.lookup_volume(self.pool, name) is not None:
            return False
        names = listing(self.pool)
        return holds_registration(names) and name not in names
