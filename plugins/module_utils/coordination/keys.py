# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every name the protocol gives a volume, written once (docs/concurrency.md, "The artifacts").

The registry of a pool is the storage pool REGISTRY_POOL; everything in it is named here: the documents
(``<key>.<generation>.json``, their keys below), the locks (the anchor ``<name>.lock`` and the generations
``<name>.lock.<g>``) and their holder markers
(``<prefix>g<g>.<controller>.<pid>.<start>.<thread>[.<operation>.<since>.<host>]``). A marker is read from its
name alone (a listing), never from its content, so every field of one is a word without dots. Nothing here reads
or writes libvirt.
"""

from __future__ import annotations

import hashlib
import re

REGISTRY_POOL = "machinery-registry"

# documents: <key>.<generation>.json. A key may hold dots (a class named t3.medium): the generation is the last
# number before ".json".
_DOCUMENT = re.compile(r"^(?P<key>[a-z0-9][-a-z0-9.]*)\.(?P<generation>[0-9]+)\.json$")


def document_volume(key, generation):
    return "%s.%d.json" % (key, generation)


def parse_document_volume(name):
    """(key, generation) of a document's volume name, or None for any other volume."""
    match = _DOCUMENT.match(name)
    return (match.group("key"), int(match.group("generation"))) if match else None


# the keys of the documents
POOL_KEY = "pool"  # the pool's registration (pools/pool_registration.py)
CLASS_PREFIX = "class-"
SET_PREFIX = "set-"
IMAGE_PREFIX = "image-"
BACKUPS_PREFIX = "backups-"
VOLUME_PREFIX = "volume-"
MOVE_PREFIX = "move-"
PENDING_PREFIX = "pending-"
WAVE_PREFIX = "wave-"


def class_key(name):
    """A published machine class (pools/classes.py)."""
    return CLASS_PREFIX + name


def set_key(name):
    """A machine set's definition and members (fleets/machine_set.py, fleets/health_check.py)."""
    return SET_PREFIX + name


def image_key(name):
    """A named image (machines/named_images.py)."""
    return IMAGE_PREFIX + name


def backups_key(machine):
    """The backups of a machine (machines/backups.py)."""
    return BACKUPS_PREFIX + machine


def volume_key(name):
    """A standalone volume's labels (machines/volumes.py): named by a digest, as a volume's name may hold
    characters a key may not."""
    return VOLUME_PREFIX + hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]


def move_key(machine):
    """The journal of a move of ``machine``, in the registries of both pools (fleets/migrate.py)."""
    return MOVE_PREFIX + machine


def pending_key(machine):
    """The journal of one machine being created or deleted: the volumes the run makes or removes."""
    return PENDING_PREFIX + machine


def wave_process_prefix(controller, pid, start):
    """The start of every wave a process writes (journals.py): its controller, pid and start time."""
    return "%s%s-%d-%s-" % (WAVE_PREFIX, controller, pid, start)


def wave_key(controller, pid, start, epoch):
    """The journal of a process's creates on a pool in one hold of its admission lock (``epoch``)."""
    return "%s%d" % (wave_process_prefix(controller, pid, start), epoch)


def wave_owner(key):
    """"controller.pid.start" of the process that wrote the wave ``key``, or None."""
    parts = key[len(WAVE_PREFIX):].split("-")
    return ".".join(parts[:3]) if key.startswith(WAVE_PREFIX) and len(parts) == 4 else None


# locks: <name>.lock, with the holder markers <prefix>...
ADMISSION_LOCK = "admission.lock"
ADMISSION_HOLDER_PREFIX = "admission.holder."
HOLD_PREFIX = "hold-"
_HOLDER = ".holder."
SET_HOLD = "set."  # a set's hold is named apart from every machine's (a machine name has no dot)


def hold_volume(machine):
    """The lock of the hold on ``machine`` (a set's: ``set_hold(name)``)."""
    return "%s%s.lock" % (HOLD_PREFIX, machine)


def hold_prefix(machine):
    """The start of the holder markers of the hold on ``machine``."""
    return "%s%s%s" % (HOLD_PREFIX, machine, _HOLDER)


def held_name(volume):
    """(what is held, "lock" | "marker") of a volume of a hold (its lock's slots: ``lock_slot``), or None for any
    other volume."""
    if not volume.startswith(HOLD_PREFIX):
        return None
    if _HOLDER in volume:
        return volume[len(HOLD_PREFIX):volume.index(_HOLDER)], "marker"
    base = volume
    head, _dot, tail = volume.rpartition(".")
    if tail.isdigit():
        base = head
    if base.endswith(".lock"):
        return base[len(HOLD_PREFIX):-len(".lock")], "lock"
    return None


def set_hold(name):
    """What the hold on machine set ``name`` holds, as a machine's hold names its machine."""
    return SET_HOLD + name


def held_set(held):
    """The machine set a hold's name (``set_hold``) names, or None for a machine's."""
    return held[len(SET_HOLD):] if held.startswith(SET_HOLD) else None


# the volume a writer stages a document's body in before it commits it as a generation (documents.py): named as
# a holder marker is (``holder_marker(STAGE_PREFIX, <n-th staging of the writer>, ...)``), so that one a killed
# writer left is told from a live one's (locks.Identity.is_dead)
STAGE_PREFIX = "stage."


def upload_lock(checksum):
    """The lock of an image upload, in the storage pool beside the image cache (names of the cache itself start
    with "image-")."""
    return "upload-%s.lock" % checksum[:32]


def upload_holder_prefix(checksum):
    return "upload-%s%s" % (checksum[:32], _HOLDER)


_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def word(text):
    """``text`` as one field of a marker name (fields are split on dots)."""
    return _UNSAFE.sub("_", str(text))[:40] or "_"


def lock_slot(name, generation):
    """The volume of generation ``generation`` of the lock ``name``. Generation 1 is the lock's anchor, ``name``
    itself: there while any generation is held, so that a run finding no anchor may take the lock afresh. A
    holder holds a generation of 2 or more, ``<name>.<generation>``: taking the lock, and taking it over from a
    holder whose lease ran out, are both the exclusive create of the next generation (locks.VolumeLock)."""
    return name if generation == 1 else "%s.%d" % (name, generation)


def slot_generation(volume, name):
    """The generation of the lock ``name`` that ``volume`` is (``lock_slot``), or None for any other volume."""
    if volume == name:
        return 1
    if volume.startswith(name + "."):
        tail = volume[len(name) + 1:]
        if tail.isdigit() and int(tail) > 1:
            return int(tail)
    return None


def holder_marker(prefix, generation, controller, pid, start, thread, tag=""):
    """The name of a holder marker: the generation held, who holds it (controller, process, thread), then
    ``tag``."""
    return "%sg%d.%s.%d.%s.%d%s" % (prefix, generation, controller, pid, start, thread % 10 ** 9, tag)


def holder_tag(operation, since, host):
    """The end of a holder marker: what the holder tells its waiters (``marker_fields`` reads it back)."""
    return ".%s.%d.%s" % (word(operation), int(since), word(host))


def _split_marker(marker, prefix):
    fields = marker[len(prefix):].split(".")
    if fields and len(fields[0]) > 1 and fields[0][0] == "g" and fields[0][1:].isdigit():
        return int(fields[0][1:]), fields[1:]
    return 1, fields  # a marker of an older version, which held the anchor alone


def marker_fields(marker, prefix):
    """The fields of a holder marker after its generation: controller, pid, start, thread[, operation, since,
    host]."""
    return _split_marker(marker, prefix)[1]


def marker_generation(marker, prefix):
    """The generation of the lock a holder marker names."""
    return _split_marker(marker, prefix)[0]
