# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compare-and-swap writes of registry documents (Registry.put with ``expect``): a change made from an older
generation never replaces a newer one, a dead writer's unreadable generation does not block the next write, and a
write without ``expect`` is unchanged. The pool is an in-memory stand-in for a dir storage pool; the admission lock
is taken as held (the lab tests take the real one)."""

from __future__ import annotations

import contextlib

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import storage


class Volume:
    def __init__(self, pool, name):
        self.pool = pool
        self._name = name

    def name(self):
        return self._name


class Pool:
    """A storage pool of named byte strings; creating a name that exists fails, as libvirt's does."""

    def __init__(self):
        self.data = {}

    def listVolumes(self):  # noqa: N802
        return list(self.data)

    def storageVolLookupByName(self, name):  # noqa: N802
        if name not in self.data:
            error = libvirt.libvirtError("Storage volume not found: no storage vol with matching name '%s'" % name)
            error.err = (libvirt.VIR_ERR_NO_STORAGE_VOL, 0, "", 0, "", None, None, 0, 0)
            raise error
        return Volume(self, name)

    def refresh(self, _flags=0):
        pass

    def isActive(self):  # noqa: N802
        return True


@pytest.fixture(name="pool")
def in_memory_pool(monkeypatch):
    pool = Pool()

    def create_volume(target, name, _size, _fmt, mode=None):
        if name in target.data:
            raise storage.VolumeExists(name)
        target.data[name] = b""
        return Volume(target, name)

    def upload_bytes(_conn, vol, data):
        vol.pool.data[vol.name()] = bytes(data)

    def download_bytes(_conn, vol, limit=None):
        return vol.pool.data.get(vol.name())

    def delete_volume(target, name, keep_if_busy=False):
        target.data.pop(name, None)
        return True

    monkeypatch.setattr(storage, "create_volume", create_volume)
    monkeypatch.setattr(storage, "upload_bytes", upload_bytes)
    monkeypatch.setattr(storage, "download_bytes", download_bytes)
    monkeypatch.setattr(storage, "delete_volume", delete_volume)
    monkeypatch.setattr(locks, "held", lambda conn, target, locked, identity: contextlib.nullcontext())
    # a registered pool's registry always holds its registration (a complete listing)
    pool.data["pool.1.json"] = documents.encode("pool", 1, {"name": "p"})
    return pool


def registry(pool):
    return documents.Registry(None, pool)


def generations(pool, key):
    return sorted(int(keys._DOCUMENT.match(name).group("generation")) for name in pool.data
                  if keys._DOCUMENT.match(name) and keys._DOCUMENT.match(name).group("key") == key)


def test_a_change_from_the_generation_read_is_written_and_read_back(pool):
    one = registry(pool)
    assert one.get("set-web") is None and one.read_generation("set-web") == 0
    one.put("set-web", {"replicas": 2}, expect=0)
    two = registry(pool)
    assert two.get("set-web") == {"replicas": 2} and two.read_generation("set-web") == 1
    two.put("set-web", {"replicas": 3}, expect=1)
    assert registry(pool).get("set-web") == {"replicas": 3}
    assert generations(pool, "set-web") == [2]


def test_a_change_from_an_older_generation_is_refused_and_writes_nothing(pool):
    registry(pool).put("set-web", {"replicas": 2})
    first, second = registry(pool), registry(pool)
    first.get("set-web")
    second.get("set-web")
    first.put("set-web", {"replicas": 3}, expect=first.read_generation("set-web"))
    with pytest.raises(documents.DocumentChanged) as refused:
        second.put("set-web", {"replicas": 5}, expect=second.read_generation("set-web"))
    assert refused.value.reason == "Conflict"
    assert "set-web" in refused.value.message and "read generation 1, another run wrote 2" in refused.value.message
    # the first run's change is there, whole; the second wrote no generation of its own
    assert registry(pool).get("set-web") == {"replicas": 3}
    assert generations(pool, "set-web") == [2]
    # read again, the second run's change goes over the new document
    assert second.get("set-web") == {"replicas": 3}
    second.put("set-web", {"replicas": 5}, expect=second.read_generation("set-web"))
    assert registry(pool).get("set-web") == {"replicas": 5}


def test_a_document_made_by_another_run_since_it_was_seen_absent_is_not_overwritten(pool):
    late = registry(pool)
    assert late.get("image-base") is None
    registry(pool).put("image-base", {"checksum": "sha256:a"}, expect=0)
    with pytest.raises(documents.DocumentChanged):
        late.put("image-base", {"checksum": "sha256:b"}, expect=late.read_generation("image-base"))
    assert registry(pool).get("image-base") == {"checksum": "sha256:a"}


def test_a_dead_writers_unreadable_generation_does_not_block_the_next_write(pool):
    registry(pool).put("backups-web-1", {"backups": ["a"]})
    pool.data["backups-web-1.2.json"] = b'{"key": "backups-web-1", "gener'  # cut off midway: its writer died
    reader = registry(pool)
    assert reader.get("backups-web-1") == {"backups": ["a"]} and reader.read_generation("backups-web-1") == 1
    reader.put("backups-web-1", {"backups": ["a", "b"]}, expect=1)
    assert registry(pool).get("backups-web-1") == {"backups": ["a", "b"]}
    assert generations(pool, "backups-web-1") == [3]


def test_without_expect_the_last_writer_wins_as_before(pool):
    first, second = registry(pool), registry(pool)
    first.get("class-small")
    second.get("class-small")
    first.put("class-small", {"cpu": 1})
    second.put("class-small", {"cpu": 2})
    assert registry(pool).get("class-small") == {"cpu": 2}


def test_read_generation_is_none_for_a_key_not_read_and_follows_own_writes(pool):
    one = registry(pool)
    assert one.read_generation("set-web") is None
    one.put("set-web", {"replicas": 1}, expect=0)
    assert one.read_generation("set-web") == 1
    one.put("set-web", {"replicas": 2}, expect=one.read_generation("set-web"))
    assert one.read_generation("set-web") == 2


def test_a_writer_paused_between_its_create_and_its_upload_reports_the_conflict_not_success(pool, monkeypatch):
    """Writer A creates generation 2 of the document and is paused past the admission lock's lease before its
    upload; writer B takes the lock over, finds generation 2 unreadable (a dead writer's, as far as it can tell),
    and writes 3 from generation 1. A, resumed, uploads: its write is not the current document, and it says so
    with DocumentChanged instead of returning as if its change were made."""
    registry(pool).put("set-web", {"replicas": 1})
    paused, other = registry(pool), registry(pool)
    paused.get("set-web")
    other.get("set-web")
    upload = storage.upload_bytes

    def upload_after_the_other_wrote(conn, vol, data):
        monkeypatch.setattr(storage, "upload_bytes", upload)  # the other run's own upload goes through
        other.put("set-web", {"replicas": 3}, expect=other.read_generation("set-web"))
        upload(conn, vol, data)
    monkeypatch.setattr(storage, "upload_bytes", upload_after_the_other_wrote)
    with pytest.raises(documents.DocumentChanged) as refused:
        paused.put("set-web", {"replicas": 5}, expect=paused.read_generation("set-web"))
    assert "read generation 1 and wrote 2" in refused.value.message and "wrote 3" in refused.value.message
    assert registry(pool).get("set-web") == {"replicas": 3}
