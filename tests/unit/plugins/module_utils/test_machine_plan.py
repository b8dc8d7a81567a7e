"""plan_machine as a pure function: parsed golden XML and a spec in, actions out (no libvirt daemon)."""

import copy
import os

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import (
    adoption_record, plan_machine, resize_field, resize_refusal, restarts_to_resize)

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
RUNNING = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_BOOTED)
SHUTOFF = (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN)
MIB = 2 ** 20


def tree():
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        return dx.parse(handle.read())


def observed(state=SHUTOFF, live_max=None, record=True):
    parsed = tree()
    return Observed("web-1", dom=object(), tree=parsed, record=dx.read_record(parsed) if record else None,
                    state=state, live_max_memory=live_max, saved=False)


def spec(**changes):
    base = {"name": "web-1", "state": "present", "cpu": 1, "memory": 128 * MIB, "machine_class": "small",
            "labels": {"app": "web"}, "boot_config": "abc", "firmware": "bios",
            "image": {"source": "/images/test.qcow2", "checksum": "0" * 64}, "root_size": None, "volumes": [],
            "network_interfaces": []}
    base.update(changes)
    return base


def test_nothing_to_do():
    plan = plan_machine(spec(), observed())
    assert plan.actions == [] and not plan.changed and plan.diff() == ({}, {})


def test_absent_machine_is_created_then_started():
    data = {"name": "data", "volume": "web-1-data.qcow2", "source": "empty", "size": 64 * MIB, "device": "vdb",
            "bus": "virtio"}
    new = spec(state="running", volumes=[data], ignition_data=b"{}")
    plan = plan_machine(new, Observed("web-1"))
    assert plan.summaries() == ["create", "start"]
    create = plan.as_list()[0]
    assert [(s["action"], s["target"]) for s in create["steps"]] == [
        ("cache_image", "/images/test.qcow2"), ("create_volume", "web-1-root.qcow2"),
        ("create_volume", "web-1-data.qcow2"), ("write_volume", "web-1-ignition.json"), ("define", "web-1")]
    before, after = plan.diff()
    assert before == {} and after["memory"] == "128Mi" and after["state"] == "running"


def test_absent_stays_absent():
    assert plan_machine(spec(state="absent"), Observed("web-1")).actions == []


def test_delete_lists_every_volume_of_the_machine():
    plan = plan_machine(spec(state="absent"), observed(RUNNING))
    delete = plan.as_list()[0]
    assert delete["action"] == "delete"
    assert [s["action"] for s in delete["steps"]][:2] == ["shutdown", "undefine"]
    assert ("delete_volume", "web-1-root.qcow2") in [(s["action"], s["target"]) for s in delete["steps"]]


def test_update_on_a_stopped_machine():
    plan = plan_machine(spec(cpu=2, memory=256 * MIB, labels={"app": "db"}), observed())
    assert plan.summaries() == ["update cpu, memory, labels"]
    assert plan.diff() == ({"cpu": 1, "memory": "128Mi", "labels": {"app": "web"}},
                           {"cpu": 2, "memory": "256Mi", "labels": {"app": "db"}})
    assert plan.facts["restart_required"] is False and plan.warnings == []
    assert plan.actions[0].data["grows"] == ["cpu", "memory"]


def test_live_update_knows_what_waits_for_a_restart():
    within = plan_machine(spec(memory=96 * MIB, labels={"x": "y"}), observed(RUNNING, live_max=128 * MIB))
    assert within.facts["restart_required"] is False and within.summaries() == ["update memory, labels"]
    # a machine told to stop takes its new size at its next start: no restart, the stop does it
    beyond = plan_machine(spec(memory=512 * MIB, state="stopped"), observed(RUNNING, live_max=128 * MIB))
    assert beyond.summaries() == ["update memory", "stop"]
    assert beyond.facts["restart_required"] is True and "next restart" in beyond.warnings[0]


@pytest.mark.parametrize("wanted,state,expected", [
    ("running", SHUTOFF, ["start"]), ("running", RUNNING, []),
    ("stopped", RUNNING, ["stop"]), ("stopped", SHUTOFF, []), ("present", RUNNING, []), ("present", SHUTOFF, []),
])
def test_power(wanted, state, expected):
    assert plan_machine(spec(state=wanted), observed(state)).summaries() == expected


def test_new_boot_configuration_needs_the_device_it_had():
    record = dx.read_record(tree())
    record["spec"]["files"] = {}
    with pytest.raises(ConflictError) as raised:
        plan_machine(spec(boot_config="new", ignition_data=b"{}"), observed(), record)
    assert raised.value.field == "ignition"


def test_device_changes_are_warned_not_applied():
    plan = plan_machine(spec(requested_volumes=[{"name": "extra"}]), observed())
    assert plan.actions == [] and "volume_attach" in plan.warnings[0]


def test_adopting_a_foreign_domain():
    foreign = observed(record=False)
    record = adoption_record(foreign, None, "2026-01-01T00:00:00+00:00")
    assert record["adopted"] and record["spec"]["cpu"] == 1 and record["spec"]["memory"] == 128 * MIB
    adopted = spec(machine_class=None, labels={}, boot_config=None)
    plan = plan_machine(adopted, foreign, record)
    assert plan.summaries() == ["adopt"]
    assert plan_machine(dict(adopted, labels={"a": "b"}), foreign, record).summaries() == ["adopt", "update labels"]


def test_plan_does_not_touch_its_inputs():
    seen = observed()
    wanted = spec(cpu=4)
    before = (copy.deepcopy(dx.read_record(seen.tree)), copy.deepcopy(wanted))
    plan_machine(wanted, seen)
    assert (dx.read_record(seen.tree), wanted) == before


# --- capabilities (issue 13) -----------------------------------------------------------------------------------

def test_topology_change_waits_for_a_restart():
    plan = plan_machine(spec(cpu=1, topology={"sockets": 1, "cores": 1, "threads": 1}), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update topology"]
    assert plan.facts["restart_required"] is True
    assert plan.diff() == ({"topology": None}, {"topology": {"sockets": 1, "cores": 1, "threads": 1}})


def test_qos_change_is_live_and_an_address_change_waits_for_the_guest():
    plan = plan_machine(spec(disk_qos={"data": {"iops": 500, "throughput": None}}), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update disk_qos"] and plan.facts["restart_required"] is False
    plan = plan_machine(spec(ip_reservations={"eth0": "192.168.100.20"}), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update ip_reservations"] and plan.facts["restart_required"] is True


def test_create_steps_show_secrets_swap_and_reservations_but_no_passphrase():
    secure = {"name": "secure", "volume": "web-1-secure.luks", "source": "empty", "size": 64 * MIB, "device": "vdb",
              "bus": "virtio", "encrypted": True, "passphrase": "do not show me"}
    swap = {"name": "swap", "volume": "web-1-swap.qcow2", "source": "empty", "size": 64 * MIB, "device": "vdc",
            "bus": "virtio", "serial": "machinery-swap", "swap": True}
    nic = {"name": "eth0", "network": "machinery", "mac": "52:54:00:00:00:01", "ip_address": "192.168.100.20"}
    plan = plan_machine(spec(volumes=[secure, swap], network_interfaces=[nic], swap=64 * MIB,
                             ip_reservations={"eth0": "192.168.100.20"},
                             topology={"sockets": 1, "cores": 1, "threads": 1}), Observed("web-1"))
    steps = [(s["action"], s["target"]) for s in plan.as_list()[0]["steps"]]
    assert ("define_secret", "web-1-secure.luks") in steps and ("create_volume", "web-1-swap.qcow2") in steps
    assert ("reserve_address", "machinery") in steps
    assert "do not show me" not in repr(plan.as_list())
    assert plan.diff()[1]["swap"] == "64Mi" and plan.diff()[1]["ip_reservations"] == {"eth0": "192.168.100.20"}


def test_an_encrypted_volume_of_an_image_is_planned_as_a_luks_copy_of_the_cached_image():
    root = {"name": "root", "volume": "web-1-root.luks", "source": "image", "image": {"source": "/images/a.qcow2"},
            "size": None, "device": "vda", "bus": "virtio", "boot": True, "encrypted": True,
            "passphrase": "do not show me"}
    plan = plan_machine(spec(image=None, volumes=[root]), Observed("web-1"))
    steps = plan.as_list()[0]["steps"]
    assert [(s["action"], s["target"]) for s in steps][:3] == [
        ("cache_image", "/images/a.qcow2"), ("define_secret", "web-1-root.luks"), ("create_volume", "web-1-root.luks")]
    assert steps[2]["encryption"] == "luks" and steps[2]["image"] == "/images/a.qcow2"
    assert "do not show me" not in repr(plan.as_list())


# --- resize (issue 25): a restart in place where the pool has room, a refusal naming the option where not ------


@pytest.mark.parametrize("wanted", ["running", "present"])
def test_a_running_machine_given_more_cpu_restarts_in_place(wanted):
    plan = plan_machine(spec(state=wanted, cpu=2, machine_class="medium"), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update machine_class, cpu", "restart"]
    restart = plan.as_list()[1]
    assert [(s["action"], s["target"]) for s in restart["steps"]] == [("shutdown", "web-1"), ("start", "web-1")]
    assert plan.facts["restart_required"] is False and plan.warnings == []
    before, after = plan.diff()
    assert (before["cpu"], after["cpu"], after["machine_class"]) == (1, 2, "medium")
    assert after["restart_count"] == before["restart_count"] + 1
    assert plan.actions[0].data["grows"] == ["cpu"] and plan.actions[0].data["resize"] is True


def test_memory_beyond_the_balloon_restarts_memory_within_it_does_not():
    beyond = plan_machine(spec(memory=256 * MIB), observed(RUNNING, 128 * MIB))
    assert beyond.summaries() == ["update memory", "restart"]
    assert beyond.actions[0].data["grows"] == ["memory"]
    within = plan_machine(spec(memory=96 * MIB), observed(RUNNING, 128 * MIB))
    assert within.summaries() == ["update memory"] and within.actions[0].data["grows"] == []
    assert within.facts["restart_required"] is False


def test_a_stopped_machine_is_resized_without_a_restart():
    assert plan_machine(spec(cpu=2), observed(SHUTOFF)).summaries() == ["update cpu"]
    started = plan_machine(spec(cpu=2, state="running"), observed(SHUTOFF))
    assert started.summaries() == ["update cpu", "start"]


def test_a_machine_told_to_stop_is_not_restarted():
    plan = plan_machine(spec(cpu=2, state="stopped"), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update cpu", "stop"]
    assert not restarts_to_resize(["cpu"], spec(cpu=2, state="stopped"), observed(RUNNING, 128 * MIB))


def test_changes_that_are_no_resize_do_not_restart():
    plan = plan_machine(spec(labels={"app": "db"}, machine_class="renamed"), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update machine_class, labels"]
    topology = plan_machine(spec(topology={"sockets": 1, "cores": 1, "threads": 1}), observed(RUNNING, 128 * MIB))
    assert topology.summaries() == ["update topology"] and topology.facts["restart_required"] is True


def test_a_restart_takes_the_other_pending_fields_too():
    plan = plan_machine(spec(cpu=2, topology={"sockets": 1, "cores": 2, "threads": 1}), observed(RUNNING, 128 * MIB))
    assert plan.summaries() == ["update cpu, topology", "restart"]
    assert plan.facts["restart_required"] is False and not any("next restart" in w for w in plan.warnings)


def test_a_resize_that_is_already_in_force_plans_nothing():
    assert plan_machine(spec(), observed(RUNNING, 128 * MIB)).actions == []


def test_a_shrink_grows_nothing():
    plan = plan_machine(spec(memory=64 * MIB, cpu=1), observed(SHUTOFF))
    assert plan.actions[0].data["grows"] == [] and plan.actions[0].data["resize"] is True


@pytest.mark.parametrize("given,grows,field", [
    ({"machine_class": "large", "cpu": None, "memory": None}, ["cpu", "memory"], "machine_class"),
    ({"machine_class": None, "cpu": 4, "memory": None}, ["cpu"], "cpu"),
    ({"machine_class": None, "cpu": 1, "memory": "1Gi"}, ["memory"], "memory"),
    ({"machine_class": None, "cpu": 4, "memory": "1Gi"}, ["cpu", "memory"], "cpu"),
])
def test_a_refusal_names_the_option_that_asked(given, grows, field):
    assert resize_field(given, grows) == field


def test_the_refusal_says_what_allow_move_would_do():
    wanted = spec(cpu=4, memory=1024 * MIB)
    refused = resize_refusal({"machine_class": "large", "allow_move": False}, wanted, ["cpu", "memory"], "pool-1",
                             "pool pool-1 is full")
    assert isinstance(refused, PoolFull) and refused.field == "machine_class"
    text = str(refused)
    assert "web-1" in text and "4 cpu and 1Gi" in text and "nothing was changed" in text
    assert "allow_move: true" in text and "pool pool-1 is full" in text
    moving = resize_refusal({"machine_class": None, "cpu": 4, "allow_move": True}, wanted, ["cpu"], "pool-1", "full")
    assert moving.field == "cpu" and "allow_move found no pool" in str(moving)
    assert moving.resize == {"name": "web-1", "machine_class": "small", "cpu": 4, "memory": 1024 * MIB,
                             "tolerations": []}
