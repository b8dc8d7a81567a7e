"""Registry documents written by compare and swap (issue #38, docs/concurrency.md), on a real pool's registry:
writers that read one generation and write at once, through their own libvirt connections and the host's real
admission lock. With ``expect`` exactly one write of each round lands and the others are refused and try again,
so every writer's change is in the document; the same writes without it lose all but one. And a module's write
of a class goes over nothing a run that read it earlier then writes."""

import threading

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import published_class

from conftest import first_pool, run_module

KEY = "test-cas-doc"
WRITERS = 3


def delete_document(pool):
    conn = libvirt.open(pool.uri)
    try:
        documents.Registry.open(conn).remove(KEY)
    finally:
        conn.close()


@pytest.fixture(name="pool", scope="module")
def registered_pool():
    with first_pool(clean=delete_document) as pool:
        yield pool


def race(pool, compare):
    """WRITERS threads, each on its own connection, add their name to the document: each reads it, all meet at a
    barrier (so every write is made from the same generation), then write; a refused write reads again and
    retries. Returns (the document read afterwards, refusals per round)."""
    barrier = threading.Barrier(WRITERS, timeout=120)
    refusals = [0] * WRITERS
    errors = []

    def writer(index):
        conn = libvirt.open(pool.uri)
        try:
            for attempt in range(WRITERS):
                registry = documents.Registry.open(conn)
                names = list((registry.get(KEY) or {}).get("names") or [])
                generation = registry.read_generation(KEY)
                if attempt == 0:
                    barrier.wait()
                try:
                    registry.put(KEY, {"names": names + ["w%d" % index]},
                                 expect=generation if compare else None)
                    return
                except documents.DocumentChanged:
                    refusals[attempt] += 1
            errors.append("w%d never wrote" % index)
        except Exception as exc:  # pylint: disable=broad-except
            errors.append("w%d: %r" % (index, exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    conn = libvirt.open(pool.uri)
    try:
        return documents.Registry.open(conn).get(KEY), refusals
    finally:
        conn.close()


def test_writes_from_one_generation_at_once_lose_no_change(pool):
    delete_document(pool)
    document, refusals = race(pool, compare=True)
    assert sorted(document["names"]) == ["w%d" % index for index in range(WRITERS)]
    # they overlapped: all read the same (absent) document, one write of the first round landed, the rest were
    # refused and read again (the retries meet no barrier: they may or may not overlap)
    assert refusals[0] == WRITERS - 1


def test_the_same_writes_without_compare_and_swap_lose_changes(pool):
    """What the check prevents: every writer read the same generation, and the last one's body is all that is
    left."""
    delete_document(pool)
    document, refusals = race(pool, compare=False)
    assert refusals == [0] * WRITERS
    assert len(document["names"]) == 1


def test_a_class_changed_by_a_module_is_not_overwritten_by_an_earlier_reader(pool):
    result = run_module("machine_class", uri=pool.uri, name="cas-class", cpu=1, memory="128Mi")
    assert result["changed"], result
    conn = libvirt.open(pool.uri)
    try:
        earlier = documents.Registry.open(conn)
        assert published_class(earlier, "cas-class")["cpu"] == 1
        read = earlier.read_generation(keys.class_key("cas-class"))
        assert read >= 1
        result = run_module("machine_class", uri=pool.uri, name="cas-class", cpu=2, memory="128Mi")
        assert result["changed"], result
        with pytest.raises(documents.DocumentChanged) as refused:
            earlier.put(keys.class_key("cas-class"), dict(published_class(earlier, "cas-class"), cpu=4), expect=read)
        assert "class-cas-class" in refused.value.message
        assert published_class(documents.Registry.open(conn), "cas-class")["cpu"] == 2
        found = run_module("machine_class", uri=pool.uri, name="cas-class", cpu=2, memory="128Mi")
        assert not found["changed"], found
    finally:
        conn.close()
        run_module("machine_class", uri=pool.uri, name="cas-class", state="absent")
