"""The Resource protocol: apply goes through the kind's table, and a kind the table lacks is a bug named as such."""

import importlib

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, UnknownAction, converge, dispatch)


class Lamp(Resource):
    """A lamp that is switched on and off: two kinds of action, one method each."""

    def __init__(self, wanted, lit=False):
        self.wanted = wanted
        self.lit = lit
        self.applied = []

    def describe(self):
        return "the lamp"

    def holds(self, plan, observed):
        return ()

    def observe(self):
        return self.lit

    def plan(self, observed):
        if observed == self.wanted:
            return Plan()
        return Plan([Action("switch_on" if self.wanted else "switch_off", "lamp")])

    def _switch_on(self, action, _observed):
        self.applied.append(action.kind)
        self.lit = True

    def _switch_off(self, action, _observed):
        self.applied.append(action.kind)
        self.lit = False

    APPLY = {"switch_on": _switch_on, "switch_off": _switch_off}


class Unwired(Lamp):
    """Plans an action its table does not name."""

    def plan(self, observed):
        return Plan([Action("dim", "lamp")]) if observed != self.wanted else Plan()


def test_converge_applies_each_action_through_the_table():
    lamp = Lamp(wanted=True)
    plan, observed = converge(lamp)
    assert plan.kinds() == ["switch_on"] and observed is True and lamp.applied == ["switch_on"]
    lamp.wanted = False
    assert converge(lamp)[0].kinds() == ["switch_off"] and lamp.lit is False


def test_check_mode_plans_and_applies_nothing():
    lamp = Lamp(wanted=True)
    assert converge(lamp, check_mode=True)[0].kinds() == ["switch_on"] and lamp.applied == []


def test_a_kind_without_a_method_is_reported_as_a_bug():
    with pytest.raises(UnknownAction) as failure:
        converge(Unwired(wanted=True))
    assert "the lamp has no way to apply 'dim'" in str(failure.value)
    assert "switch_off, switch_on" in str(failure.value) and "bug" in str(failure.value)


def test_dispatch_names_the_table_it_looked_in():
    assert dispatch({"a": len}, "a", "x") is len
    with pytest.raises(UnknownAction, match="x has no way to apply 'b'"):
        dispatch({"a": len}, "b", "x")


def test_a_resource_must_observe_and_plan():
    class Half(Resource):
        def describe(self):
            return "half"

        def holds(self, plan, observed):
            return ()

    with pytest.raises(TypeError):
        Half()  # pylint: disable=abstract-class-instantiated


RESOURCES = [
    ("machines.attach", "VolumeAttachment"), ("machines.attach", "NicAttachment"),
    ("machines.backups", "BackupResource"), ("machines.named_images", "ImageResource"),
    ("pools.classes", "ClassResource"), ("pools.pool_registration", "PoolResource"),
    ("pools.security_groups", "SecurityGroupResource"), ("fleets.health_check", "HealthCheckResource"),
    ("fleets.machine_set", "MachineSetResource"), ("fleets.migrate", "MoveResource"),
    ("machines.volumes", "VolumeResource"), ("machines.snapshots", "SnapshotResource"),
]


@pytest.mark.parametrize("module, name", RESOURCES)
def test_every_resource_kind_declares_its_apply_table(module, name):
    found = getattr(importlib.import_module(
        "ansible_collections.machinery.compute.plugins.module_utils." + module), name)
    assert issubclass(found, Resource) and found.APPLY
    for kind, method in found.APPLY.items():
        assert callable(method) and method.__name__.startswith("_"), kind
        assert getattr(found, method.__name__) is method, "%s.APPLY[%r] is not a method of the class" % (name, kind)
