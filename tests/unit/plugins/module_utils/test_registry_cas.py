# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compare-and-swap writes of registry documents (Registry.put with ``expect``): a change made from an older
generation never replaces a newer one, a dead writer's unreadable generation does not block the next write, and a
write without ``expect`` is the newest once it returns. The store is the in-memory stand-in of the document model
(protocol_world.Documents); the lab tests write real registries."""

from __future__ import annotations

import pytest
import protocol_world as pw

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys


@pytest.fixture(name="pool")
def in_memory_pool():
    pool = pw.Documents()
    # a registered pool's registry always holds its registration (a complete listing)
    pool.volumes["pool.1.json"] = documents.encode("pool", 1, {"name": "p"})
    pool.data = pool.volumes
    return pool


def registry(pool):
    return documents.Registry(None, pool, store=pool)


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


def test_a_writer_paused_between_its_read_and_its_commit_while_two_others_wrote_reports_the_conflict(pool):
    """Writer A reads generation 1 and is paused before its commit; B writes 2 from 1 and prunes 1, C writes 3
    from 2 and prunes 2. A, resumed, commits generation 2, a name free again: its check after the commit finds 3,
    not made from its write, so it deletes its generation again and reports DocumentChanged, not success."""
    registry(pool).put("set-web", {"replicas": 1})
    paused = registry(pool)
    paused.get("set-web")
    commit = pool.commit

    def others_write_first(name, staged, size):
        pool.commit = commit
        for replicas in (3, 4):
            other = registry(pool)
            other.get("set-web")
            other.put("set-web", {"replicas": replicas}, expect=other.read_generation("set-web"))
        assert generations(pool, "set-web") == [3]
        return commit(name, staged, size)
    pool.commit = others_write_first
    with pytest.raises(documents.DocumentChanged) as refused:
        paused.put("set-web", {"replicas": 5}, expect=paused.read_generation("set-web"))
    assert "read generation 1, another run wrote 3" in refused.value.message
    assert registry(pool).get("set-web") == {"replicas": 4}
    assert generations(pool, "set-web") == [3]
    assert not [name for name in pool.volumes if name.startswith(keys.STAGE_PREFIX)]


def test_a_write_made_from_this_one_between_its_commit_and_its_check_is_no_conflict(pool):
    """A newer generation made from this write's own (its ``base``) is its change carried on: the write stands."""
    registry(pool).put("set-web", {"replicas": 1})
    first = registry(pool)
    first.get("set-web")
    stale = first._stale

    def another_writes_from_this_one(key, versions, generation, staged):
        other = registry(pool)
        other.get(key)
        other.put(key, {"replicas": 7}, expect=other.read_generation(key))
        return stale(key, pool.listing() and registry(pool)._generations().get(key, []), generation, staged)
    first._stale = another_writes_from_this_one
    first.put("set-web", {"replicas": 2}, expect=1)
    assert registry(pool).get("set-web") == {"replicas": 7}


def test_a_killed_writers_staged_volume_is_no_document(pool):
    registry(pool).put("set-web", {"replicas": 1})
    pool.volumes[keys.STAGE_PREFIX + "g1.other.1.1.1"] = documents.encode("set-web", 2, {"replicas": 9})
    reader = registry(pool)
    assert reader.get("set-web") == {"replicas": 1} and reader.read_generation("set-web") == 1
