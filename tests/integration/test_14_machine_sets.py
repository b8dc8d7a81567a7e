"""machine_set, machine_set_info and machine_health_check against the 3-pool lab; every effect seen from libvirt."""

import threading
import time

import libvirt
import pytest

from conftest import assert_failed, labelled_domains, warnings_of

from ansible_collections.machinery.compute.plugins.module_utils.coordination import holds as coordination
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


OWNER = "machinery.compute/machine-set"
DELETE = "machinery.compute/delete-machine"
SET = "fleet"


def members(pools):
    """{name: (pool, created, active)} of the set's members, read from the domains' records."""
    return {dom.name(): (pool.name, record["created"], bool(dom.isActive()))
            for pool, dom, record in labelled_domains(pools, OWNER, SET)}


def set_args(pools, image, replicas, **extra):
    args = dict(pools=[{"name": p.name, "uri": p.uri} for p in pools], name=SET, replicas=replicas,
                selector={"match_labels": {"app": SET}},
                template={"machine_class": "small", "image": image, "labels": {"app": SET},
                          "network_interfaces": []}, wait="running", shutdown_timeout=2)
    args.update(extra)
    return args


def test_scale_policies_adoption_rollout_and_health(registered, module, image):
    pools = registered
    module("machine_set", pools=[p.uri for p in pools], name=SET, state="absent", shutdown_timeout=2)
    assert members(pools) == {}

    planned = module("machine_set", check=True, **set_args(pools, image, 5))
    assert planned["changed"] is True and len(planned["planned_members"]) == 5 and members(pools) == {}

    made = module("machine_set", **set_args(pools, image, 5))
    assert made["changed"] is True, made
    now = members(pools)
    assert sorted(now) == sorted(planned["planned_members"])  # check mode named the members the run made
    per_pool = sorted([pool for pool, _c, _a in now.values()].count(p.name) for p in pools)
    assert per_pool == [1, 2, 2] and all(active for _p, _c, active in now.values())
    assert made["ready_replicas"] == 5 and made["out_of_date"] == []
    again = module("machine_set", **set_args(pools, image, 5))
    assert again["changed"] is False and again["actions"] == [], again

    down = module("machine_set", **set_args(pools, image, 3, delete_policy="Newest"))
    kept = members(pools)
    deleted = set(now) - set(kept)
    assert len(kept) == 3 and len(deleted) == 2, down
    assert max(kept[name][1] for name in kept) <= min(now[name][1] for name in deleted)

    up = module("machine_set", **set_args(pools, image, 4))
    assert len(up["planned_members"]) == 1 and len(members(pools)) == 4

    # the delete mark wins over the policy
    marked = sorted(members(pools))[-1]
    pool_of = {p.name: p for p in pools}[members(pools)[marked][0]]
    labels = module("machine_info", uri=pool_of.uri, name=[marked])["machines"][0]["labels"]
    module("machine", uri=pool_of.uri, name=marked, state="present", labels=dict(labels, **{DELETE: "yes"}))
    marked_down = module("machine_set", **set_args(pools, image, 3, delete_policy="Oldest"))
    assert [a["target"] for a in marked_down["plan"] if a["action"] == "delete"] == [marked]
    assert marked not in members(pools) and len(members(pools)) == 3

    before = members(pools)
    oldest = sorted(before, key=lambda name: (before[name][1], name))[0]
    module("machine_set", **set_args(pools, image, 2, delete_policy="Oldest"))
    assert oldest not in members(pools) and len(members(pools)) == 2

    # adoption: a matching machine no set owns joins the set
    orphan = "fleet-orphan"
    module("machine", uri=pools[0].uri, name=orphan, machine_class="small", image=image, labels={"app": SET},
           network_interfaces=[], state="running")
    adopted = module("machine_set", **set_args(pools, image, 3))
    assert "adopt" in adopted["actions"] and orphan in members(pools) and len(members(pools)) == 3
    assert orphan in adopted["out_of_date"]  # made from no template of the set

    # a rollout with max_unavailable 1 never has fewer than replicas - 1 members running
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            try:
                samples.append(sum(1 for _p, _c, active in members(pools).values() if active))
            except libvirt.libvirtError:
                pass  # a member deleted while it was being read: the next sample counts again
            time.sleep(0.2)
    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        rolled = module("machine_set", **set_args(pools, image, 3, rollout={"max_surge": 0, "max_unavailable": 1},
                                                  template={"machine_class": "small", "image": image,
                                                            "labels": {"app": SET, "tier": "v2"},
                                                            "network_interfaces": []}))
    finally:
        stop.set()
        watcher.join()
    assert not rolled.get("failed"), rolled
    assert rolled["out_of_date"] == [] and len(members(pools)) == 3
    assert len(samples) > 5 and min(samples) >= 2, samples

    info = module("machine_set_info", pools=[p.uri for p in pools], name=[SET])
    assert [entry["name"] for entry in info["machine_sets"]] == [SET]
    assert info["machine_sets"][0]["replicas"] == 3 and len(info["machine_sets"][0]["pools"]) == 3
    assert module("machine_set_info", pools=[p.uri for p in pools], name=["nope"])["machine_sets"] == []

    # health: destroy one member by hand; the check deletes it, the set brings a Running replacement
    check_args = dict(pools=[p.uri for p in pools], name="fleet-health", selector={"match_labels": {"app": SET}},
                      unhealthy_conditions=[{"type": "Ready", "status": "False", "timeout": "0s"}],
                      node_startup_timeout="1h", shutdown_timeout=2)
    assert module("machine_health_check", **check_args)["changed"] is False
    # the guest's own signal: a boot marker none of them prints makes all three unhealthy (check mode: no change)
    silent = module("machine_health_check", check=True, **dict(
        check_args, boot_marker="NEVER-PRINTED", unhealthy_conditions=[{"type": "Booted", "status": "False",
                                                                        "timeout": "0s"}]))
    assert sorted(u["name"] for u in silent["unhealthy"]) == sorted(members(pools)), silent
    assert all("Booted=False" in u["reasons"][0] for u in silent["unhealthy"]), silent
    broken = sorted(members(pools))[0]
    broken_pool = {p.name: p for p in pools}[members(pools)[broken][0]]
    broken_pool.domain(broken).destroy()
    planned = module("machine_health_check", check=True, **check_args)
    assert [u["name"] for u in planned["unhealthy"]] == [broken] and broken_pool.domain(broken) is not None
    healed = module("machine_health_check", **check_args)
    assert healed["actions"] == ["delete"] and healed["remediation_allowed"] is True
    assert broken not in members(pools)
    refilled = module("machine_set", **set_args(pools, image, 3, template={
        "machine_class": "small", "image": image, "labels": {"app": SET, "tier": "v2"}, "network_interfaces": []}))
    assert len(refilled["planned_members"]) == 1 and sum(a for _p, _c, a in members(pools).values()) == 3

    # two broken with max_unhealthy 1: nothing is remediated
    two = sorted(members(pools))[:2]
    for name in two:
        {p.name: p for p in pools}[members(pools)[name][0]].domain(name).destroy()
    # its observation writes nothing: the conditions are recorded after it, each under a hold on its machine, so
    # a machine another run holds (as a run on this controller would) is left for the next check, which says so
    where = {name: {p.name: p for p in pools}[members(pools)[name][0]] for name in two}
    other = coordination.Coordination("machine_snapshot", 900)
    hold = other.machine(where[two[0]].conn, two[0], where[two[0]].uri).acquire()
    try:
        held = module("machine_health_check", max_unhealthy=1, **check_args)
        assert ready_recorded(where[two[0]], two[0]) != "False"  # not written while another run holds it
    finally:
        hold.release()
    assert held["remediation_allowed"] is False and held["actions"] == [] and len(held["unhealthy"]) == 2
    assert all(name in members(pools) for name in two)
    assert [warning for warning in warnings_of(held) if "not recorded" in warning] == [
        "the health conditions of %s were not recorded: another run holds it now (the next run records them)"
        % two[0]], warnings_of(held)
    assert ready_recorded(where[two[1]], two[1]) == "False"
    module("machine_health_check", max_unhealthy=1, **check_args)
    assert ready_recorded(where[two[0]], two[0]) == "False"

    gone = module("machine_set", pools=[p.uri for p in pools], name=SET, state="absent", shutdown_timeout=2)
    assert gone["changed"] and members(pools) == {}
    assert module("machine_set_info", pools=[p.uri for p in pools], name=[SET])["machine_sets"] == []


def ready_recorded(pool, name):
    """The Ready condition the health checks recorded in the machine's record, read from libvirt."""
    record = dx.read_record(dx.parse(pool.domain(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))) or {}
    return ((record.get("health") or {}).get("Ready") or {}).get("status")


def test_bad_sets_and_checks_change_nothing(registered, module, image):
    pools = registered
    module("machine", uri=pools[0].uri, name="fleet-taken", state="absent")
    before = {pool.name: pool.domain_names() for pool in pools}
    base = set_args(pools, image, 2)
    module("machine", uri=pools[0].uri, name="fleet-taken", machine_class="small", image=image, state="present",
           network_interfaces=[])
    for change, field in (({"replicas": -1}, "replicas"),
                          ({"selector": {"match_labels": {"app": "other"}}}, "selector"),
                          ({"rollout": {"max_surge": "150%"}}, "rollout.max_surge"),
                          ({"name": "fleet-taken"}, "name")):
        assert_failed(module("machine_set", **dict(base, **change)), field)
    # Ansible's own argument check refuses an unknown condition type, naming the option
    unknown = module("machine_health_check", pools=[p.uri for p in pools], name="h",
                     selector={"match_labels": {"app": SET}},
                     unhealthy_conditions=[{"type": "Bogus", "status": "False", "timeout": "1m"}])
    assert unknown["failed"] and "type must be one of" in unknown["msg"] and "unhealthy_conditions" in unknown["msg"]
    assert_failed(module("machine_health_check", pools=[p.uri for p in pools], name="h",
                         selector={"match_labels": {"app": SET}}, max_unhealthy="101%"), "max_unhealthy")
    module("machine", uri=pools[0].uri, name="fleet-taken", state="absent")
    assert {pool.name: pool.domain_names() for pool in pools} == before
