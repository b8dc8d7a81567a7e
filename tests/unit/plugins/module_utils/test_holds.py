"""Holds on machines: converge takes them (and only for a plan that changes something), a holder names itself, a
run holding a machine takes it again for free, and a conflict names the other run."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination import leases
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks


class FakeHold:
    def __init__(self, key, log):
        self.key = key
        self.log = log

    def acquire(self):
        self.log.append(("acquire", self.key))
        return self

    def release(self):
        self.log.append(("release", self.key))

    def check(self, before):
        self.log.append(("check", before))


class Counter(Resource):
    """A counter that must reach ``wanted``; another run may bump it before this run's holds are taken."""

    def __init__(self, wanted, value=0, keys=(("uri2", "b"), ("uri1", "a"), ("uri1", "a")), bump=None, fail=False):
        self.wanted = wanted
        self.value = value
        self.keys = keys
        self.log = []
        self.bump = bump  # what another run sets the value to once the holds are asked for
        self.fail = fail

    def describe(self):
        return "the counter"

    def holds(self, plan, observed):
        if self.bump is not None:
            self.value, self.bump = self.bump, None
        return [FakeHold(key, self.log) for key in self.keys]

    def observe(self):
        self.log.append(("observe", self.value))
        return self.value

    def plan(self, observed):
        return Plan([Action("set", "counter", {"value": observed}, {"value": self.wanted})]) \
            if observed != self.wanted else Plan()

    def _set(self, action, _observed):
        if self.fail:
            raise ConflictError("refused")
        self.log.append(("set", self.wanted))
        self.value = self.wanted

    APPLY = {"set": _set}


def test_holds_are_taken_once_each_in_key_order_and_released_in_reverse():
    counter = Counter(3)
    converge(counter)
    assert counter.log == [("observe", 0), ("acquire", ("uri1", "a")), ("acquire", ("uri2", "b")),
                           ("observe", 0), ("check", "set"), ("check", "set"), ("set", 3), ("observe", 3),
                           ("release", ("uri2", "b")), ("release", ("uri1", "a"))]


def test_a_converged_object_and_check_mode_take_no_hold():
    counter = Counter(3, value=3)
    converge(counter)
    assert counter.log == [("observe", 3)]
    counter = Counter(5)
    converge(counter, check_mode=True)
    assert counter.log == [("observe", 0)]


def test_the_plan_is_made_again_under_the_holds():
    counter = Counter(3, bump=3)  # another run did it before this one held the counter
    plan, observed = converge(counter)
    assert not plan.actions and observed == 3
    assert ("set", 3) not in counter.log and counter.log[-1] == ("release", ("uri1", "a"))


def test_holds_are_released_when_the_apply_fails():
    counter = Counter(3, fail=True)
    with pytest.raises(ConflictError):
        converge(counter)
    assert counter.log[-2:] == [("release", ("uri2", "b")), ("release", ("uri1", "a"))]


def test_a_marker_names_its_holder():
    coordination = holds.Coordination("volume_attach", 60, host="ctl.example.org", clock=lambda: 1700000000)
    prefix = keys.hold_prefix("web-1")
    marker = locks.Identity().marker(prefix, 2, coordination.tag())
    assert marker.startswith(prefix) and "/" not in marker
    found = holds.holder(marker, prefix)
    assert found["controller"] == "ctl_example_org" and found["operation"] == "volume_attach"
    assert found["since"] == "2023-11-14T22:13:20+00:00" and isinstance(found["pid"], int)
    assert holds.holder(None, prefix)["operation"] == "create"  # a create's claim names no one
    assert holds.holder(prefix + "abc.12.34.5", prefix)["operation"] is None  # an older version's marker


class FakeLock:
    def __init__(self, log, refusal=None):
        self.log = log
        self.marker = "m"
        self.refusal = refusal

    def acquire(self):
        if self.refusal is not None:
            raise self.refusal
        self.log.append("taken")
        return self

    def release(self):
        self.log.append("released")


def test_a_run_takes_a_machine_it_holds_again_without_waiting(monkeypatch):
    log = []
    monkeypatch.setattr(holds, "machine_hold", lambda *args, **kwargs: FakeLock(log))
    coordination = holds.Coordination("machine_health_check")
    outer = coordination.machine(None, "web-1", "uri1").acquire()
    inner = coordination.machine(None, "web-1", "uri1").acquire()
    assert inner.marker == outer.marker == "m"
    inner.release()
    assert log == ["taken"]
    outer.release()
    assert log == ["taken", "released"] and coordination.held == {}


def test_a_conflict_names_the_holder(monkeypatch):
    prefix = keys.hold_prefix("web-1")
    other = holds.Coordination("machine_snapshot", host="ctl2", clock=lambda: 1700000000)
    refusal = ConflictError("the hold on machine web-1 has been held for over 5s by another run", "machine")
    refusal.holder_marker = locks.Identity().marker(prefix, 2, other.tag())
    monkeypatch.setattr(holds, "machine_hold", lambda *args, **kwargs: FakeLock([], refusal))
    with pytest.raises(ConflictError) as caught:
        holds.Coordination("volume_attach", 5).machine(None, "web-1", "uri1").acquire()
    assert caught.value.reason == "Conflict"
    assert caught.value.details["holder"] == {"controller": "ctl2", "operation": "machine_snapshot",
                                              "since": "2023-11-14T22:13:20+00:00"}
    assert "machine_snapshot on ctl2" in caught.value.message and "hold_timeout" in caught.value.message


def test_only_a_move_is_refused_at_once():
    prefix = keys.hold_prefix("web-1")
    move = locks.Identity().marker(prefix, 2, holds.Coordination(holds.MOVE, host="c").tag())
    snapshot = locks.Identity().marker(prefix, 2, holds.Coordination("machine_snapshot", host="c").tag())
    attach = holds.Coordination("volume_attach").machine(None, "web-1")
    assert "being moved" in attach._refuse(move)
    assert attach._refuse(snapshot) is None
    second_move = holds.Coordination("x").machine(None, "web-1", operation=holds.MOVE)
    assert second_move._refuse(move) is None  # a second move waits for the first


def test_every_kind_says_what_it_holds():
    import inspect
    import pkgutil
    import importlib
    from ansible_collections.machinery.compute.plugins import module_utils

    kinds = []
    for info in pkgutil.walk_packages(module_utils.__path__, module_utils.__name__ + "."):
        module = importlib.import_module(info.name)
        kinds.extend(obj for _name, obj in inspect.getmembers(module, inspect.isclass)
                     if issubclass(obj, Resource) and obj is not Resource and obj.__module__ == info.name)
    assert len(kinds) >= 12
    assert all("holds" not in getattr(kind, "__abstractmethods__", ()) for kind in kinds)


def held_as(markers, age=0.0):
    """A waiter's reading of a lock whose newest generation (2) has ``markers``."""
    return locks.View(2, markers, [1, 2], markers, age)


def test_a_waiter_judges_a_lease_on_its_own_clock_from_the_last_change(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(locks.Identity, "is_dead", lambda self, marker, prefix: None)  # another controller's: unknown
    lock = locks.VolumeLock(None, None, lease=6, clock=lambda: now[0])
    lock.watch.note((2, 1), ["hold-a.holder.x"])
    now[0] += 5
    assert not lock.abandoned(held_as(["hold-a.holder.x"], 10 ** 6))  # however old: the host's clock is not read
    lock.watch.note((2, 513), ["hold-a.holder.x"])  # renewed: the lease starts again from here
    now[0] += 5
    assert not lock.abandoned(held_as(["hold-a.holder.x"]))
    now[0] += 1.5
    assert lock.abandoned(held_as(["hold-a.holder.x"]))  # a whole lease without a change


def test_a_dead_holder_is_not_waited_for_even_within_its_lease(monkeypatch):
    monkeypatch.setattr(locks.Identity, "is_dead", lambda self, marker, prefix: True)
    lock = locks.VolumeLock(None, None, lease=600)
    lock.watch.note((2, 1), ["hold-a.holder.x"])
    assert lock.abandoned(held_as(["hold-a.holder.x"]))


def test_the_lease_setting():
    assert leases.lease_seconds("2") == 2.0 and leases.lease_seconds(None) == leases.LEASE_SECONDS
    assert leases.lease_seconds("0") == leases.LEASE_SECONDS and leases.lease_seconds("x") == leases.LEASE_SECONDS


def test_a_run_stops_itself_once_it_holds_what_a_test_names(monkeypatch):
    """convergence.STOP_HOLDING_ENV (race tests): the run stops itself after its holds are taken and before it
    observes again; another resource's run, or a run without the variable, never stops."""
    from ansible_collections.machinery.compute.plugins.module_utils.core import convergence
    stops = []
    monkeypatch.setattr(convergence.os, "kill", lambda pid, sig: stops.append((counter.log[:], sig)))
    counter = Counter(wanted=1)
    monkeypatch.setenv(convergence.STOP_HOLDING_ENV, "the counter")
    converge(counter)
    taken = [("observe", 0), ("acquire", ("uri1", "a")), ("acquire", ("uri2", "b"))]
    assert stops == [(taken, convergence.signal.SIGSTOP)]
    counter = Counter(wanted=1)
    monkeypatch.setenv(convergence.STOP_HOLDING_ENV, "another counter")
    converge(counter)
    monkeypatch.delenv(convergence.STOP_HOLDING_ENV)
    converge(Counter(wanted=1))
    assert len(stops) == 1


def test_a_run_without_ansible_names_its_holds_after_its_module(monkeypatch):
    """A module run by Ansible is named by it; run with python -m (the lab tests), AnsibleModule's placeholder
    name ("basic.py") must not become the operation its holds show ("py")."""
    import sys
    import types
    from ansible_collections.machinery.compute.plugins.module_utils.interface import module_base

    class Run(module_base.MachineryModule):
        def __init__(self, name):  # no AnsibleModule: only the name operation() reads
            self.module = types.SimpleNamespace(_name=name)

    Run.__module__ = "__main__"
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="ansible_collections.machinery.compute.plugins.modules.machine_set")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert Run("basic.py").operation() == "machine_set"
    assert Run("machinery.compute.machine_snapshot").operation() == "machine_snapshot"


class FakeListing:
    def __init__(self, names):
        self.names = names

    def listVolumes(self):
        return list(self.names)


class FakeContext:
    """A PoolContext as holds.missing_machine reads it: the registration, the registry's listing, no conn."""

    def __init__(self, names, registered=True):
        self.registration = {"name": "pool-1"} if registered else {}
        self.registry = type("FakeRegistry", (), {"pool": FakeListing(names)})()
        self.conn = None
        self.coordination = holds.Coordination()


class Vanished(Counter):
    """A machine resource that finds its machine (or something else it names: ``field``) missing."""

    def __init__(self, ctx, field="machine"):
        super().__init__(1)
        self.ctx, self.machine, self.field = ctx, "web-1", field

    def observe(self):
        from ansible_collections.machinery.compute.plugins.module_utils.core.errors import NotFoundError
        raise NotFoundError("no machine web-1 on pool pool-1", self.field)

    def missing(self, exc):
        return holds.missing_machine(self.ctx, self.machine, exc)


def test_a_machine_missing_while_a_move_still_holds_it_there_is_refused_naming_the_move():
    """Once a move has undefined the machine on its source and before it lets go, a run there finds no machine:
    it answers as a run at any earlier point of the move, with the Conflict naming the move. Without a live
    move's hold, or for something else missing (a snapshot's name), the NotFound stands."""
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import NotFoundError
    mover = "%sothercontroller.4242.99.1.machine_migrate.1795851258.ctl-b" % keys.hold_prefix("web-1")
    held = FakeContext([keys.hold_volume("web-1"), mover])
    with pytest.raises(ConflictError, match="web-1 is being moved by another run .machine_migrate on ctl-b") as exc:
        converge(Vanished(held))
    assert exc.value.details["holder"]["operation"] == "machine_migrate"
    assert isinstance(exc.value.__cause__, NotFoundError)
    lock_alone = FakeContext([keys.hold_volume("web-1")])
    unregistered = FakeContext([keys.hold_volume("web-1"), mover], registered=False)
    for ctx, field in ((held, "name"), (FakeContext([]), "machine"), (lock_alone, "machine"),
                       (unregistered, "machine")):
        with pytest.raises(NotFoundError):
            converge(Vanished(ctx, field))


def test_a_conflict_before_any_change_is_run_again_and_one_after_a_change_is_reported():
    """RetryOnConflict: a run whose compare-and-swap write met a newer document before it changed anything
    converges again from it (each retry said in a warning), up to CONFLICT_ATTEMPTS runs; a conflict after a
    change, or in the last run, is the run's failure."""
    from ansible_collections.machinery.compute.plugins.module_utils.coordination.documents import DocumentChanged
    from ansible_collections.machinery.compute.plugins.module_utils.interface import module_base

    class Run(module_base.MachineryModule):
        def __init__(self, conflicts, done=()):
            self.conflicts, self.done, self.runs = conflicts, list(done), 0

        def run_once(self):
            self.runs += 1
            if self.runs <= self.conflicts:
                exc = DocumentChanged("registry document set-web changed while this run worked")
                exc.done = self.done
                raise exc
            return {"changed": True}

    result, retried = Run(conflicts=2).run_retrying_conflicts()
    assert result == {"changed": True} and len(retried) == 2 and "attempt 3 of 3" in retried[-1]
    with pytest.raises(DocumentChanged):
        Run(conflicts=3).run_retrying_conflicts()
    failing = Run(conflicts=1, done=["web-1: create"])
    with pytest.raises(DocumentChanged):
        failing.run_retrying_conflicts()
    assert failing.runs == 1
