"""The machine resource's planner, with no connection: an observation recorded as plain JSON (what
machine.MachineResource._complete reads: the domain's XML, state, autostart and managed-save flag, the spec
normalized against the pool, the pool's name, an adoption's moment) is planned by machine_plan.plan_observed, and
the domain's handle in it fails the test on any use, so a plan that read libvirt would show."""

import json
import os

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import (
    adoption_record, plan_observed)

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
MIB = 2 ** 20


class Unreachable:
    """A domain handle that is never to be used: planning reads nothing."""

    def __getattr__(self, name):
        raise AssertionError("the planner called %s on the domain: planning must read nothing" % name)


def recorded(**changes):
    """A completed observation of web-1, stopped, as JSON would carry it."""
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), encoding="utf-8") as handle:
        xml = handle.read()
    observation = {
        "name": "web-1", "pool": "pool1", "xml": xml, "managed": True,
        "state": [libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN], "autostart": False,
        "saved": False, "moment": None,
        "spec": {"name": "web-1", "state": "present", "cpu": 1, "memory": 128 * MIB, "machine_class": "small",
                 "labels": {"app": "web"}, "boot_config": "abc", "firmware": "bios",
                 "image": {"source": "/images/test.qcow2", "checksum": "0" * 64}, "root_size": None,
                 "volumes": [], "network_interfaces": []}}
    for key, value in changes.items():
        if key in observation["spec"] and key != "name":
            observation["spec"][key] = value
        else:
            observation[key] = value
    return json.loads(json.dumps(observation))


def observed_from(observation):
    tree = dx.parse(observation["xml"].encode())
    found = Observed(observation["name"], dom=Unreachable(), tree=tree,
                     record=dx.read_record(tree) if observation["managed"] else None,
                     state=tuple(observation["state"]), autostart=observation["autostart"],
                     saved=observation["saved"])
    found.pool, found.spec, found.moment = observation["pool"], observation["spec"], observation["moment"]
    if not observation["managed"]:
        found.adopted = adoption_record(found, None, observation["moment"])
    return found


def test_a_converged_machine_plans_nothing():
    plan = plan_observed({"adopt": False}, observed_from(recorded()))
    assert plan.actions == []


def test_a_change_and_a_start_are_planned_from_the_record_alone():
    plan = plan_observed({"adopt": False}, observed_from(recorded(cpu=2, state="running")))
    assert plan.summaries() == ["update cpu", "start"]
    assert plan.diff() == ({"cpu": 1}, {"cpu": 2})


def test_a_foreign_domain_is_refused_naming_the_pool_and_adopted_when_asked():
    foreign = recorded(managed=False, moment="2026-12-07T00:00:00+00:00", machine_class=None, labels={},
                       boot_config=None)
    with pytest.raises(ConflictError, match="a domain named web-1 exists on pool1 but was not created"):
        plan_observed({"adopt": False}, observed_from(foreign))
    plan = plan_observed({"adopt": True}, observed_from(foreign))
    assert plan.summaries() == ["adopt"]
    assert plan.actions[0].data["record"]["created"] == "2026-12-07T00:00:00+00:00"
