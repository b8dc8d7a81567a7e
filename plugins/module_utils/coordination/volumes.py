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

EXPECTED_RETRY_SECONDS = 2.0
PRUNE_RETRY_SECONDS = 8.0
# libvirt's answers to a create of a name that exists (the last two while another create of it is under way)
_TAKEN = ("VIR_ERR_STORAGE_VOL_EXIST", "VIR_ERR_INTERNAL_ERROR", "VIR_ERR_OPERATION_FAILED")


def create_exclusive(pool, name, what):
    """Create the empty volume ``name`` in ``pool``: its handle, or None when it exists (another run made it).
    ``what`` names it in the error of any other failure."""
    try:
        return pool.createXML(storage.volume_xml(name, 1, "raw", mode="0600"), 0)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() in [getattr(lv.libvirt, code) for code in _TAKEN]:
            return None
        raise LibvirtFailure("cannot take %s: %s" % (what, lv.describe(exc))) from None


def listing(pool):
    """The names of the pool's volumes, or none when libvirt cannot list them now."""
    try:
        return pool.listVolumes()
    except lv.libvirt.libvirtError:
        return []


def holds_registration(names):
    """Whether a listing of a registry holds its pool's registration, as every complete one does."""
    return any(name.startswith(keys.POOL_KEY + ".") for name in names)


def complete_listing(pool):
    """The names of a registry ``pool``'s volumes, from a listing that holds its registration (``reread``)."""
    return reread(pool, lambda: listing(pool), holds_registration)


def reread(pool, read, believed, again=None, seconds=EXPECTED_RETRY_SECONDS):
    """``read()`` until ``believed`` of what it returns, refreshing the pool between reads (``again()`` reads after
    the first), for up to ``seconds``. The last reading when none is believed."""
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
            storage.delete_volume(pool, name)
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
