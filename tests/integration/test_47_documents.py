"""Registry documents written by compare and swap (issues #38 and #49, docs/concurrency.md), on a real pool's
registry: writers that read one generation and write at once, through their own libvirt connections, with no lock:
the commit's exclusive create decides. With ``expect`` exactly one write of each round lands and the others are refused and try again,
so every writer's change is in the document; the same writes without it lose all but one. A module's write
of a class goes over nothing a run that read it earlier then writes. And the document model's in-memory store
answers a schedule as libvirt does."""

import os
import sys
import threading

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import volumes
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


class Recorded:
    """A document store (volumes.DocumentStore, or the model's stand-in protocol_world.Documents) that logs each
    call on KEY's volumes and what it gave, with the staged volumes' names (random) and other volumes left out."""

    def __init__(self, store, log):
        self.store = store
        self.log = log

    @staticmethod
    def _name(name):
        return "stage" if name.startswith(keys.STAGE_PREFIX) else name

    def listing(self):
        names = self.store.listing()
        self.log.append(("list", tuple(sorted(name for name in names if name.startswith(KEY + ".")))))
        return names

    def refresh(self, flags=0):
        return self.store.refresh(flags)

    def read(self, name, limit):
        data = self.store.read(name, limit)
        self.log.append(("read", name, documents.decode(data, KEY) if data is not None else None))
        return data

    def stage(self, name, data):
        self.store.stage(name, data)
        self.log.append(("stage", self._name(name)))

    def commit(self, name, staged, size):
        made = self.store.commit(name, staged, size)
        self.log.append(("commit", name, made))
        return made

    def discard(self, name):
        self.store.discard(name)
        self.log.append(("delete", self._name(name)))

    def delete_when_read(self, name):
        self.store.delete_when_read(name)
        self.log.append(("delete", name))

    def prune(self, name):
        done = self.store.prune(name)
        self.log.append(("delete", name))
        return done


def paused_writer(open_registry):
    """The model's hardest schedule, in one thread: A reads, B and C each write a generation (B's prunes the one A
    read), then A commits the generation name B's write freed and finds C's above it. Returns what A was told."""
    open_registry().put(KEY, {"names": []})
    paused = open_registry()
    paused.get(KEY)
    commit = paused.store.commit

    def others_first(name, staged, size):
        paused.store.commit = commit
        for name_added in ("b", "c"):
            other = open_registry()
            other.put(KEY, {"names": (other.get(KEY) or {}).get("names", []) + [name_added]},
                      expect=other.read_generation(KEY))
        return commit(name, staged, size)
    paused.store.commit = others_first
    try:
        paused.put(KEY, {"names": ["a"]}, expect=paused.read_generation(KEY))
        return "done"
    except documents.DocumentChanged as exc:
        return exc.message


def test_the_models_store_makes_the_calls_libvirt_makes_with_their_results(pool):
    """The document model (tests/unit/.../test_document_model.py) runs Registry against an in-memory store: the
    same schedule, replayed on this real registry and on that store, makes the same calls with the same
    results, call by call (what was listed, read, committed or refused, deleted)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "unit", "plugins", "module_utils"))
    import protocol_world as pw  # pylint: disable=import-outside-toplevel  # the unit tests' stand-in

    delete_document(pool)
    conn = libvirt.open(pool.uri)
    try:
        real_log, model_log = [], []
        real_pool = documents.Registry.open(conn).pool
        real = volumes.DocumentStore(conn, real_pool)
        told_real = paused_writer(lambda: documents.Registry(conn, real_pool, store=Recorded(real, real_log)))
        model = pw.Documents({"pool.1.json": documents.encode(keys.POOL_KEY, 1, {"name": "p"})})
        told_model = paused_writer(lambda: documents.Registry(None, real_pool, store=Recorded(model, model_log)))
        assert told_real == told_model and "read generation 1, another run wrote 3" in told_real
        assert real_log == model_log
        assert ("commit", KEY + ".2.json", True) in real_log  # the freed name taken, then found stale
        assert documents.Registry.open(conn).get(KEY) == {"names": ["b", "c"]}
    finally:
        conn.close()
