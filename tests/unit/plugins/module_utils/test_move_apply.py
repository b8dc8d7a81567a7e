"""The executor of a move's steps: every step a plan takes has a method, and a move that fails before the source
is deleted is rolled back, after that only ever finished."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import UnknownAction, step
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_apply, move_plan
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_apply import MoveExecutor, Report, Run

GI = 2 ** 30


def facts(active=True):
    files = [{"volume": "web-1-root.qcow2", "kind": "disk", "device": "vda", "format": "qcow2", "capacity": GI,
              "backing": "/pool/image-1.qcow2"},
             {"volume": "web-1-cidata.iso", "kind": "readonly", "device": "sda", "format": "raw", "capacity": 1},
             {"volume": "web-1-console.log", "kind": "log", "format": "raw", "capacity": 1}]
    return {"machine": "web-1", "active": active, "source": {"pool": "a"}, "target": {"pool": "b"},
            "files": files, "missing_images": [{"volume": "image-1.qcow2", "checksum": "ab" * 32}]}


def journal():
    return move_plan.journal_body("web-1", "u-1", "cold", True, {"pool": "a", "uri": "a"}, {"pool": "b", "uri": "b"},
                                  ["web-1-root.qcow2"], ["image-1.qcow2"])


def every_step_kind():
    kinds = set()
    for mode in ("cold", "live"):
        kinds.update(item["action"] for item in move_plan.move_steps(facts(), mode, True, 30))
    seen = {"exists": True, "active": False, "uuid": "u-1"}
    present = {"source": ["web-1-root.qcow2"], "target": ["web-1-root.qcow2"], "images": ["image-1.qcow2"]}
    for kind in ("finish", "discard", "discard_copy"):
        kinds.update(item["action"] for item in move_plan.recovery_steps(kind, journal(), seen, seen, present))
    return kinds


def test_every_step_a_plan_takes_has_a_method():
    methods = MoveExecutor("web-1", Report()).methods
    assert every_step_kind() - set(methods) == set()
    assert methods["delete_image"] == methods["delete_volume"]  # an image cache is a volume like any other


class FakeSide:
    def __init__(self, pool):
        self.pool = pool


@pytest.fixture
def executor(monkeypatch):
    done = []
    monkeypatch.setattr(move_apply.Rollback, "undo", lambda self, run: done.append(("undo", run.made)))
    monkeypatch.setattr(move_apply.RemovalSteps, "delete_volume",
                        lambda self, entry, side, run: done.append(("delete_volume", side.pool)))
    monkeypatch.setattr(move_apply.JournalSteps, "write", lambda self, entry, side, run: done.append(("journal",)))
    return MoveExecutor("web-1", Report()), done


def test_a_step_without_a_method_is_a_bug_and_the_move_is_rolled_back(executor):
    moves, done = executor
    run = Run(FakeSide("a"), FakeSide("b"), journal())
    with pytest.raises(UnknownAction, match="the move of machine web-1 has no way to apply 'teleport'"):
        moves.move([step("write_journal", "web-1"), step("teleport", "web-1", pool="b")], run)
    assert done == [("journal",), ("undo", [])]


def test_a_move_that_fails_once_the_source_is_being_deleted_is_not_rolled_back(executor):
    moves, done = executor
    run = Run(FakeSide("a"), FakeSide("b"), journal())
    with pytest.raises(UnknownAction):
        moves.move([step("delete_volume", "web-1-root.qcow2", pool="a"), step("teleport", "web-1")], run)
    assert done == [("delete_volume", "a")] and run.deleting


def test_a_move_stops_itself_before_the_first_step_of_the_kind_a_test_names(executor, monkeypatch):
    """convergence.STOP_BEFORE_STEP_ENV (race tests): the move stops (SIGSTOP) before the first step of that kind
    only, and checks its holds after; unset, or naming a kind the move does not take, nothing stops."""
    from ansible_collections.machinery.compute.plugins.module_utils.core import convergence
    moves, done = executor
    stops = []
    monkeypatch.setattr(convergence.os, "kill", lambda pid, sig: stops.append((done[:], sig)))
    moves.fence = lambda before: done.append(("fence", before.split()[0]))
    steps = [step("write_journal", "web-1"), step("delete_volume", "web-1-root.qcow2", pool="a"),
             step("delete_volume", "web-1-cidata.iso", pool="a")]
    monkeypatch.setenv(convergence.STOP_BEFORE_STEP_ENV, "delete_volume")
    moves.execute(steps, Run(FakeSide("a"), FakeSide("b"), journal()))
    assert stops == [([("fence", "write_journal"), ("journal",)], convergence.signal.SIGSTOP)]
    assert done[2] == ("fence", "delete_volume")  # let go, it checks it still holds the machine
    monkeypatch.setenv(convergence.STOP_BEFORE_STEP_ENV, "teleport")
    moves.execute(steps, Run(FakeSide("a"), FakeSide("b"), journal()))
    monkeypatch.delenv(convergence.STOP_BEFORE_STEP_ENV)
    moves.execute(steps, Run(FakeSide("a"), FakeSide("b"), journal()))
    assert len(stops) == 1
