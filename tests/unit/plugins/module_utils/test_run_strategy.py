"""Run strategies as pure functions: what a task's state and strategy derive, how the domain carries them, and
what a plan does about autostart, starts and stops (no libvirt daemon)."""

import os

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import plan_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import run_strategy

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
RUNNING = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_BOOTED)
SHUT_DOWN = (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN)
CRASHED = (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_CRASHED)
MIB = 2 ** 20


def observed(strategy, state=SHUT_DOWN, autostart=False, saved=False):
    """web-1 as libvirt shows it, its record saying ``strategy`` and its on_crash written to match."""
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = dx.parse(handle.read())
    record = dx.read_record(tree)
    if strategy is not None:
        dx.write_run_strategy(tree, record, strategy)
    dx.write_record(tree, record)
    return Observed("web-1", dom=object(), tree=tree, record=record, state=state, autostart=autostart,
                    saved=saved)


def spec(state, strategy):
    return {"name": "web-1", "state": state, "cpu": 1, "memory": 128 * MIB, "machine_class": "small",
            "labels": {"app": "web"}, "boot_config": "abc", "firmware": "bios", "run_strategy": strategy,
            "image": {"source": "/images/test.qcow2", "checksum": "0" * 64}, "root_size": None, "volumes": [],
            "network_interfaces": []}


@pytest.mark.parametrize("given, state, recorded, existing, expected", [
    (None, "running", None, False, "always"),
    (None, "stopped", None, False, "halted"),
    (None, "present", None, False, "manual"),
    (None, "present", None, True, None),           # made before strategies: present leaves it alone
    (None, "running", None, True, "always"),       # ... a state that implies one converges it
    (None, "running", "manual", True, "manual"),   # left out: kept
    (None, "running", "on_failure", True, "on_failure"),
    (None, "stopped", "always", True, "halted"),   # KubeVirt's stop
    (None, "running", "halted", True, "always"),   # and start
    (None, "stopped", "manual", True, "manual"),
    ("on_failure", "running", "always", True, "on_failure"),
    ("manual", "stopped", None, False, "manual"),
])
def test_the_strategy_a_task_gets(given, state, recorded, existing, expected):
    assert run_strategy(given, state, recorded, existing) == expected


@pytest.mark.parametrize("given, state", [("always", "stopped"), ("halted", "running")])
def test_a_strategy_the_state_contradicts_is_refused_naming_the_field(given, state):
    with pytest.raises(ValidationError) as info:
        run_strategy(given, state, None, False)
    assert info.value.field == "run_strategy"


def test_the_domain_carries_the_crash_action_and_a_hand_edit_is_converged_again():
    tree = observed("always").tree
    assert tree.findtext("on_crash") == "restart"
    assert dx.read_run_strategy(tree, dx.read_record(tree)) == "always"
    tree.find("on_crash").text = "destroy"
    assert dx.read_run_strategy(tree, dx.read_record(tree)) is None
    assert observed("manual").tree.findtext("on_crash") == "destroy"


def test_a_new_always_machine_is_created_started_and_autostarted():
    plan = plan_machine(spec("running", "always"), Observed("web-1"))
    # the autostart is part of the create, not an action of its own
    assert plan.summaries() == ["create", "start"]
    assert plan.actions[0].after["state"] == "running" and plan.actions[0].data["autostart"] is True
    assert plan.actions[0].steps[-1] == {"action": "set_autostart", "target": "web-1", "autostart": True}


def test_a_new_manual_machine_gets_no_autostart():
    plan = plan_machine(spec("running", "manual"), Observed("web-1"))
    assert plan.summaries() == ["create", "start"] and "autostart" not in plan.actions[0].data


def test_a_machine_made_before_strategies_converges_in_place_with_a_diff():
    plan = plan_machine(spec("running", "always"), observed(None, RUNNING))
    assert plan.summaries() == ["update run_strategy"]
    assert plan.diff() == ({"run_strategy": None, "autostart": False}, {"run_strategy": "always", "autostart": True})


def test_converged_strategies_plan_nothing():
    assert plan_machine(spec("running", "always"), observed("always", RUNNING, True)).actions == []
    assert plan_machine(spec("present", "manual"), observed("manual")).actions == []
    assert plan_machine(spec("present", "halted"), observed("halted")).actions == []
    assert plan_machine(spec("present", "on_failure"), observed("on_failure", RUNNING, True)).actions == []


def test_present_always_starts_a_machine_found_off():
    assert plan_machine(spec("present", "always"), observed("always", SHUT_DOWN, True)).summaries() == ["start"]


def test_on_failure_starts_a_crashed_machine_not_a_shut_down_one():
    assert plan_machine(spec("present", "on_failure"), observed("on_failure", CRASHED, True)).summaries() == \
        ["start"]
    # shut down cleanly: it stays off, and its host's next boot does not start it either
    plan = plan_machine(spec("present", "on_failure"), observed("on_failure", SHUT_DOWN, True))
    assert plan.summaries() == ["update autostart"] and plan.diff()[1] == {"autostart": False}


def test_on_failure_is_autostarted_while_it_runs():
    plan = plan_machine(spec("running", "on_failure"), observed("on_failure", SHUT_DOWN, False))
    assert plan.summaries() == ["start"] and plan.diff() == ({"autostart": False}, {"autostart": True})
    plan = plan_machine(spec("stopped", "on_failure"), observed("on_failure", RUNNING, True))
    assert plan.summaries() == ["stop"] and plan.diff() == ({"autostart": True}, {"autostart": False})


def test_the_strategy_a_state_implies_changes_with_the_stop_or_start():
    # state stopped on an always machine: halted, its autostart off, in the stop itself
    plan = plan_machine(spec("stopped", "halted"), observed("always", RUNNING, True))
    assert plan.summaries() == ["stop"]
    assert plan.diff() == ({"run_strategy": "always", "autostart": True},
                           {"run_strategy": "halted", "autostart": False})
    assert [s["action"] for s in plan.actions[0].steps] == ["define", "shutdown", "set_autostart"]
    assert plan.actions[0].data["strategy"] is True
    # and back: state running on a halted machine
    plan = plan_machine(spec("running", "always"), observed("halted", SHUT_DOWN, False))
    assert plan.summaries() == ["start"]
    assert plan.diff() == ({"run_strategy": "halted", "autostart": False},
                           {"run_strategy": "always", "autostart": True})
    # a strategy changed with nothing else: one action, the autostart with it
    plan = plan_machine(spec("running", "manual"), observed("always", RUNNING, True))
    assert plan.summaries() == ["update run_strategy"]
    assert plan.diff() == ({"run_strategy": "always", "autostart": True},
                           {"run_strategy": "manual", "autostart": False})
    assert plan.actions[0].data["autostart"] is False
    # a change of size beside a stop keeps its own update, without the strategy
    plan = plan_machine(dict(spec("stopped", "halted"), cpu=2), observed("always", RUNNING, True))
    assert plan.summaries() == ["update cpu", "stop"]


def test_halted_under_present_stops_a_running_machine():
    assert plan_machine(spec("present", "halted"), observed("halted", RUNNING)).summaries() == ["stop"]


def test_manual_leaves_the_power_alone():
    assert plan_machine(spec("present", "manual"), observed("manual", RUNNING)).actions == []
    assert plan_machine(spec("present", "manual"), observed("manual", CRASHED)).actions == []


# --- power actions ----------------------------------------------------------------------------------------------

PAUSED = (libvirt.VIR_DOMAIN_PAUSED, libvirt.VIR_DOMAIN_PAUSED_USER)


def powered(state, strategy="always", **extra):
    return dict(spec(state, strategy), **extra)


def test_restarted_restarts_once_per_run():
    plan = plan_machine(powered("restarted", restart="soft"), observed("always", RUNNING, True))
    assert plan.summaries() == ["restart"] and plan.actions[0].handler == "power_restart"
    assert [s["action"] for s in plan.actions[0].steps] == ["shutdown", "start"]
    assert plan.diff() == ({"power": "running"}, {"power": "running"})
    hard = plan_machine(powered("restarted", restart="hard"), observed("always", RUNNING, True))
    assert [s["action"] for s in hard.actions[0].steps] == ["destroy", "start"]
    # the plan after this run restarted it has nothing left (convergence verifies it)
    assert plan_machine(powered("restarted", restart="soft"), observed("always", RUNNING, True),
                        restarted=True).actions == []


def test_paused_and_resumed():
    plan = plan_machine(powered("paused"), observed("always", RUNNING, True))
    assert plan.summaries() == ["pause"] and plan.diff() == ({"power": "running"}, {"power": "paused"})
    assert plan_machine(powered("paused"), observed("always", PAUSED, True)).actions == []
    plan = plan_machine(powered("paused"), observed("always", SHUT_DOWN, True))
    assert plan.actions[0].handler == "start_paused"
    assert plan_machine(powered("running"), observed("always", PAUSED, True)).summaries() == ["resume"]


def test_suspended_and_resumed():
    plan = plan_machine(powered("suspended"), observed("always", RUNNING, True))
    assert plan.summaries() == ["suspend"] and plan.diff()[1] == {"power": "suspended"}
    saved = observed("always", SHUT_DOWN, True, saved=True)
    assert plan_machine(powered("suspended"), saved).actions == []
    plan = plan_machine(powered("running"), saved)
    assert plan.summaries() == ["resume"] and plan.actions[0].steps[0]["action"] == "restore"


def test_a_machine_that_is_off_cannot_be_suspended():
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
    with pytest.raises(ConflictError) as info:
        plan_machine(powered("suspended", "manual"), observed("manual", SHUT_DOWN))
    assert info.value.field == "state"


def test_halted_contradicts_every_running_state():
    for state in ("restarted", "paused"):
        with pytest.raises(ValidationError):
            run_strategy("halted", state, None, False)


def test_set_members_take_the_strategy_their_template_state_implies():
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import member_strategy
    running = {"state": "running"}
    assert member_strategy({"member": running, "unreachable_timeout": None}) == "always"
    assert member_strategy({"member": running}) == "always"
    assert member_strategy({"member": running, "unreachable_timeout": 60}) == "manual"
    # a template's state says what its members do, as a machine's does: present leaves them off, stopped halts
    # them (always would contradict it and refuse a run_strategy the user never wrote)
    for state, strategy in (("running", "always"), ("present", "manual"), ("stopped", "halted")):
        assert member_strategy({"member": {"state": state}}) == strategy
        assert member_strategy({"member": {"state": state}, "unreachable_timeout": 60}) == \
            ("halted" if state == "stopped" else "manual")
