"""The protocol keeps no state in the process (docs/concurrency.md, "No state beside the run"): everything a run
keeps is a member of its Coordination, so two runs (or two tests) built in one process share nothing."""

import importlib
import inspect
import itertools
import pkgutil
import threading

from ansible_collections.machinery.compute.plugins.module_utils import coordination
from ansible_collections.machinery.compute.plugins.module_utils.coordination import admission
from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext

MUTABLE = (dict, list, set, itertools.count, type(threading.Lock()), threading.Condition, threading.Event)


def protocol_modules():
    for info in pkgutil.iter_modules(coordination.__path__):
        yield importlib.import_module("%s.%s" % (coordination.__name__, info.name))


def test_no_module_or_class_of_the_protocol_holds_state():
    kept = []
    for module in protocol_modules():
        for name, value in vars(module).items():
            if isinstance(value, MUTABLE) and not name.startswith("__"):
                kept.append("%s.%s" % (module.__name__, name))
            if inspect.isclass(value) and value.__module__ == module.__name__:
                kept.extend("%s.%s.%s" % (module.__name__, name, attribute)
                            for attribute, member in vars(value).items()
                            if isinstance(member, MUTABLE) and not attribute.startswith("__"))
    # the one exception: the run whose holds libvirt's writes check (writer.bind), bound once per process by the
    # module base, as a process is one run; a test that builds runs binds none
    assert kept == ["%s._process" % writer.__name__]


class FakeLock:
    """A lock volume that is always free: what one run takes never makes another wait."""

    taken = []

    def __init__(self, conn, pool=None, identity=None):
        self.conn = conn
        self.marker = "m"

    def acquire(self):
        FakeLock.taken.append(self.conn)
        return self

    def still_held(self):
        return True

    def release(self):
        pass


class Conn(str):
    def listAllDomains(self, _flags):  # noqa: N802 - libvirt's name
        return []


def test_two_runs_in_one_process_share_nothing(monkeypatch):
    monkeypatch.setattr(admission.locks, "admission_lock", FakeLock)
    monkeypatch.setattr(admission.lv, "lookup_storage_pool", lambda conn, name: "registry")
    monkeypatch.setattr(holds, "machine_hold", lambda conn, *args, **kwargs: FakeLock(conn))
    FakeLock.taken = []
    first, second = holds.Coordination("machine"), holds.Coordination("machine")
    for part in ("held", "identity", "admissions", "_uploads", "_guard"):
        assert getattr(first, part) is not getattr(second, part), part
    assert first.admissions.guard is not second.admissions.guard

    # a machine one run holds is not held by the other: the other takes its own hold (a run's nested hold is free)
    outer = first.machine(Conn("one"), "web-1", "uri1").acquire()
    first.machine(Conn("one"), "web-1", "uri1").acquire().release()
    second.machine(Conn("two"), "web-1", "uri1").acquire().release()
    assert FakeLock.taken == ["one", "two"] and list(second.held) == []
    outer.release()

    # an admission of one run onto a pool and a name: the other run's admission of the same is no share of it
    mine, theirs = PoolContext(Conn("conn-a"), "test:///x", first), PoolContext(Conn("conn-b"), "test:///x", second)
    with admission.Admission(mine, [], "web-2") as inside:
        assert first.admissions.names == {"web-2"} and first.admissions.inside == 1
        entered = []
        other = threading.Thread(target=lambda: entered.append(admission.Admission(theirs, [], "web-2").__enter__()))
        other.start()
        other.join(5)
        assert entered and not other.is_alive()  # neither the pool's turn nor the name's was the first run's
        assert second.admissions.names == {"web-2"} and second.admissions.holds["test:///x"].conn == "conn-b"
        assert first.admissions.holds["test:///x"].conn == "conn-a" and inside.epoch != entered[0].epoch
        entered[0].__exit__()
    assert first.admissions.inside == second.admissions.inside == 0
    assert first.upload_turn("pool", "sum") is not second.upload_turn("pool", "sum")
    assert first.upload_turn("pool", "sum") is first.upload_turn("pool", "sum")
