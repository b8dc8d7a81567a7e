"""allow_move: the pool a resize that does not fit moves to is picked for the new size (pure, no libvirt)."""

import pytest

from conftest import GIB, pool_snapshot, refused

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.fleets import resize_move
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import pick_target
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import resize_refusal

UNIX = "qemu+unix:///system?socket=/lab/%s/run/libvirt-sock"
BIG = {"small": {"cpu": 1, "memory": GIB}, "big": {"cpu": 4, "memory": 8 * GIB}}


def refusal(**spec):
    wanted = dict({"name": "web-1", "machine_class": "big", "cpu": 4, "memory": 8 * GIB, "tolerations": []}, **spec)
    return resize_refusal({"machine_class": wanted["machine_class"], "allow_move": True}, wanted, ["cpu", "memory"],
                          "a", "pool a is full")


def snapshot(name, **given):
    return pool_snapshot(name, UNIX % name, **dict({"classes": BIG}, **given))


def test_the_new_size_picks_the_pool():
    request = resize_move.placement_request(refusal().resize)
    assert request["size"] == {"cpu": 4, "memory": 8 * GIB} and request["machine_class"] == "big"
    # b has room for the old size only; c for the new one; d does not publish the class
    pools = [snapshot("a", used_cpu=7), snapshot("b", used_memory=12 * GIB), snapshot("c"),
             snapshot("d", classes={"small": BIG["small"]})]
    chosen, _reason = pick_target(request, pools, UNIX % "a")
    assert chosen["name"] == "c"


def test_no_pool_that_fits_keeps_the_refusal_with_the_reasons(monkeypatch):
    pools = [snapshot("b", used_memory=12 * GIB), snapshot("d", classes={"small": BIG["small"]})]
    monkeypatch.setattr(resize_move, "read_snapshots", lambda entries: pools)
    with pytest.raises(PoolFull) as raised:
        resize_move.target_for(refusal(), UNIX % "a", [{"name": "b", "uri": UNIX % "b"}])
    assert raised.value.field == "machine_class"
    assert "nothing was changed" in raised.value.message and "insufficient memory" in raised.value.message
    assert "class big not published" in raised.value.message


def test_a_move_needs_pools():
    with pytest.raises(PoolFull) as raised:
        resize_move.resize_elsewhere(None, {"name": "web-1"}, refusal(), [])
    assert raised.value.field == "pools"


def test_tolerations_go_with_the_machine():
    taint = [{"key": "gpu", "value": "", "effect": "NoSchedule"}]
    pools = [snapshot("a"), snapshot("gpu", taints=taint)]
    plain = resize_move.placement_request(refusal().resize)
    with pytest.raises(Exception, match="taint not tolerated"):
        pick_target(plain, pools, UNIX % "a")
    tolerant = resize_move.placement_request(refusal(tolerations=[{"key": "gpu", "operator": "Exists",
                                                                   "effect": "NoSchedule"}]).resize)
    assert pick_target(tolerant, pools, UNIX % "a")[0]["name"] == "gpu"


def test_the_pools_allow_move_may_use_are_checked_when_no_move_is_needed():
    """A wrong pools entry is refused on the run that gives it, not at the first resize that needs a move."""
    assert resize_move.move_pools(None, True) == [] and resize_move.move_pools([], False) == []
    assert "allow_move has no pool" in refused("pools", resize_move.move_pools, [], True)
    refused("pools[0].uri", resize_move.move_pools, ["qemu+unix:///nope"], True)
    refused("pools[1].uri", resize_move.move_pools, [UNIX % "a", {"uri": "qemu+unix:///nope"}], False)
    assert "needs a uri" in refused("pools[0]", resize_move.move_pools, [{"name": "x"}], True)
    assert resize_move.move_pools([UNIX % "a", {"name": "b", "uri": UNIX % "b"}], True) == [
        {"name": None, "uri": UNIX % "a"}, {"name": "b", "uri": UNIX % "b"}]
