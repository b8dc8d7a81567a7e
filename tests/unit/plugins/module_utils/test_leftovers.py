"""Issue 23's leftovers that need no libvirt: secrets kept out of a set's definition, rollout waves that keep
the floor, and what a failed run reports it did."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.fleets import machine_set as ms

GIB = 2 ** 30
TEMPLATE = {"machine_class": "small", "image": "/images/test.qcow2", "labels": {"app": "web"}}


def pool(name):
    return {"name": name, "uri": "qemu+unix:///%s" % name, "state": "Ready", "labels": {}, "taints": [],
            "classes": {"small": {"cpu": 1, "memory": GIB}}, "machines": [],
            "allocated": {"cpu": 0, "memory": 0}, "allocatable": {"cpu": 64, "memory": 64 * GIB}}


def desired(**changes):
    params = {"name": "web", "replicas": 3, "selector": {"match_labels": {"app": "web"}}, "template": TEMPLATE}
    params.update(changes)
    return ms.normalize_set(params)


def old_member(name, pool_name, phase="Running"):
    return {"name": name, "pool": pool_name, "uri": "qemu+unix:///%s" % pool_name, "phase": phase,
            "created": "2026-01-01T00:00:00+00:00", "conditions": [],
            "labels": {"app": "web", ms.OWNER_LABEL: "web", ms.HASH_LABEL: "0ld"}}


def observed(machines, pools=("p1", "p2", "p3")):
    return {"snapshots": [pool(name) for name in pools], "machines": list(machines),
            "pools": [{"name": name, "uri": "qemu+unix:///%s" % name, "state": "Ready", "definition": None}
                      for name in pools]}


def test_the_stored_template_keeps_no_passphrase():
    template = dict(TEMPLATE, ignition={"ignition": {"version": "3.4.0"}}, cloud_init={"user_data": "#cloud"},
                    volumes=[{"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "correct horse"},
                             {"name": "scratch", "size": "1Gi"}])
    document = ms.definition(desired(template=template))
    assert "correct horse" not in repr(document)
    assert document["template"]["volumes"] == [
        {"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "<secret>"},
        {"name": "scratch", "size": "1Gi"}]
    assert document["template"]["ignition"] == "<secret>"
    assert document["template"]["cloud_init"] == {"user_data": "<secret>"}
    # the original template is left as it was: members are still made from it
    assert template["volumes"][0]["passphrase"] == "correct horse"


def replay(plan, members):
    """Apply a plan's waves in the order the set applies them, counting running members after every step."""
    running = {member["name"] for member in members if member["phase"] == "Running"}
    total = {member["name"] for member in members}
    lowest, highest = len(running), len(total)
    for action in plan.actions:
        if action.kind == "create":
            running.add(action.target)
            total.add(action.target)
        elif action.kind == "delete":
            running.discard(action.target)
            total.discard(action.target)
        lowest, highest = min(lowest, len(running)), max(highest, len(total))
    return running, lowest, highest


@pytest.mark.parametrize("replicas,surge,unavailable", [
    (6, 2, 1), (6, 1, 0), (6, 0, 1), (6, 0, 2), (5, 3, 2), (3, 1, 1), (4, 2, 0), (1, 1, 0), (1, 0, 1)])
def test_a_rollout_never_drops_below_its_floor_nor_above_its_ceiling(replicas, surge, unavailable):
    members = [old_member("web-old%d" % index, "p%d" % (index % 3 + 1)) for index in range(replicas)]
    wanted = desired(replicas=replicas, rollout={"max_surge": surge, "max_unavailable": unavailable})
    plan = ms.plan_set(wanted, observed(members))
    running, lowest, highest = replay(plan, members)
    assert lowest >= replicas - unavailable
    assert highest <= replicas + surge
    assert len(running) == replicas
    assert not running & {member["name"] for member in members}
    assert plan.warnings == []


def test_members_not_running_go_first_and_cost_the_floor_nothing():
    members = [old_member("web-old%d" % index, "p1", "Shutdown" if index < 2 else "Running") for index in range(4)]
    plan = ms.plan_set(desired(replicas=4, rollout={"max_surge": 1, "max_unavailable": 0}), observed(members))
    _running, lowest, _highest = replay(plan, members)
    assert lowest >= 2  # the two running ones stay until new ones run
    first_wave = [a for a in plan.actions if a.data.get("wave") == 1 and a.kind == "delete"]
    assert {a.target for a in first_wave} >= {"web-old0", "web-old1"}
