# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Journals: what a run writes before it makes or moves anything, so the next run finishes or removes what a run
killed midway left (docs/concurrency.md). The journal of a move (``move-<machine>``) is fleets/migrate.py's; this
file reads and cleans the journals of creates and deletions.

The journal of the creates on a pool: the volumes they make, written before any of them is made, so the next run
removes exactly what a run killed midway left.

A process admits the creates of a run onto a pool under one hold of the pool's admission lock at a time (an epoch,
admission.Admission). Its journal is one document per pool and epoch (a wave), listing every create of the run
planned for the pool, not one document per machine: writing and deleting a document is a volume create, an upload
and a delete, and a batch paid them for each machine. The wave is written under the lock before the epoch's first
create and deleted before the lock goes back, so a wave that a holder of the lock finds, other than its own, was
left by a run that died. A wave names its process; a controller tells at once when one of its own processes that
wrote a wave is gone.

A deletion, which takes no admission lock, and a fence of a machine set still journal one machine at a time
(keys.pending_key); so did creates of earlier versions. Both kinds are read here."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes


def _own_prefix(identity):
    return keys.wave_process_prefix(identity.controller, identity.pid, identity.start)


def wave_key(identity, epoch):
    """The wave of this process (``identity``, locks.Identity) in its hold ``epoch`` (admission.Admission.epoch) of
    a pool's lock: this controller, this process (pid and start time), the epoch."""
    return keys.wave_key(identity.controller, identity.pid, identity.start, epoch)


def others_waves(registry, identity=None):
    """The waves in ``registry`` that other processes wrote. This process's own are no dead run's: its creates
    list themselves there before they begin, and the machines they are about to make read as not journaled."""
    own = _own_prefix(identity if identity is not None else locks.Identity())
    return [key for key in registry.keys(keys.WAVE_PREFIX) if not key.startswith(own)]


def wave_is_dead(key, identity):
    """True when the wave ``key`` was written by a process of this controller that is gone; None when it cannot be
    told (another controller, or not a wave)."""
    owner = keys.wave_owner(key)
    return identity.is_dead(owner, "") if owner is not None else None


def journal_of(registry, name):
    """The journal a run creating or deleting machine ``name`` left in ``registry`` ({machine, volumes}, with
    ``wave`` when a wave lists it), or None."""
    key = keys.pending_key(name)
    found = registry.get(key)
    if found is None and key in registry.keys(key):
        # listed, not readable: a run killed while it wrote the journal, before it made anything (its volumes are
        # made after the journal is written); the clean-up, under the lock, deletes it
        return {"machine": name, "volumes": [], "unreadable": True}
    if found is not None:
        return found
    for wave in others_waves(registry, registry.identity):
        made = ((registry.get(wave) or {}).get("machines") or {}).get(name)
        if made is not None:
            return {"machine": name, "volumes": made, "wave": wave}
    return None


def journaled(registry):
    """The names of the machines that a journal in ``registry`` lists."""
    prefix = keys.PENDING_PREFIX
    names = {key[len(prefix):] for key in registry.keys(prefix)}
    for wave in others_waves(registry, registry.identity):
        names.update(((registry.get(wave) or {}).get("machines") or {}))
    return names


def remove_orphans(ctx, journal, skip_defined=False):
    """Delete the volumes a dead run listed in ``journal``, and the passphrase secret an encrypted one got (defined
    before its volume, so it may be there without it), unless a domain uses them. With ``skip_defined``, nothing
    of a machine whose domain is defined (its create ended; the volumes are its own) is looked at."""
    if not journal or not journal.get("volumes"):
        return
    if skip_defined and lv.lookup_domain(ctx.conn, journal["machine"]) is not None:
        return
    pool = ctx.storage
    storage.refresh(pool)
    for volume_name in journal["volumes"]:
        vol = lv.lookup_volume(pool, volume_name)
        path = vol.path() if vol is not None else ctx.storage_file(volume_name)
        if storage.users_of(ctx.conn, path, None):
            continue
        if vol is not None:
            storage.delete_volume(pool, volume_name)
        storage.delete_volume_secret(ctx.conn, path)


def clean_waves(ctx, waves, epoch, claimed, identity):
    """Under the pool's admission lock: remove what the dead ``waves`` list, the holds their creates had on
    the machines (admission.claim), then the waves. The machines this process holds that way (``claimed``) are
    left alone; a machine another run holds with a marker (a move of it, say) keeps its volumes."""
    if not waves:
        return
    registry = ctx.registry
    names = set(volumes.listing(registry.pool))
    for key in waves:
        body = registry.get(key) or {}
        for name, made in sorted((body.get("machines") or {}).items()):
            if name in claimed:
                continue
            prefix = keys.hold_prefix(name)
            markers = [volume for volume in names if volume.startswith(prefix)]
            if not all(identity.is_dead(marker, prefix) for marker in markers):
                continue  # held by a live run (or one that cannot be told), which owns what is there of the name
            remove_orphans(ctx, {"machine": name, "volumes": made}, skip_defined=True)
            if keys.hold_volume(name) in names and not markers:  # the dead create's claim: taken over, let go
                locks.machine_lock(registry.pool, name, identity, timeout=0, named=False, renew=False,
                                   markerless=lambda _age: True).clear_if_abandoned()
        registry.remove(key, locked=True, epoch=epoch, expected=True)


class Wave:
    """A process's journal of its creates on one pool in one hold of the pool's lock (admission._PoolHold.wave)."""

    def __init__(self, registry, key):
        self.registry = registry
        self.key = key
        self.machines = {}  # name -> volumes, as written

    def lists(self, name, volumes):
        return self.machines.get(name) == volumes

    def write(self, machines, epoch):
        """Write the wave listing ``machines`` ({name: volumes}) under the lock, held unbroken since ``epoch``."""
        self.registry.put(self.key, {"machines": machines}, locked=True, epoch=epoch)
        self.machines = machines

    def delete(self, epoch):
        """Delete the wave, before its lock goes back; every create it listed has ended."""
        self.registry.remove(self.key, locked=True, epoch=epoch, expected=True)
