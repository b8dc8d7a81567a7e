"""Machine set and health check plans as pure functions: observations built by hand, actions out."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.fleets import machine_set as ms
from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import (
    conditions_of, normalize_check, plan_check, transitions)

from conftest import pool_snapshot, refused

GIB = 2 ** 30
TEMPLATE = {"machine_class": "small", "image": "/images/test.qcow2", "labels": {"app": "web"}}


def pool(name, members=0):
    return pool_snapshot(name, "qemu+unix:///%s" % name, cpu=64, memory=64 * GIB, used_cpu=members,
                         used_memory=members * GIB)


def desired(**changes):
    params = {"name": "web", "replicas": 3, "selector": {"match_labels": {"app": "web"}}, "template": TEMPLATE}
    params.update(changes)
    return ms.normalize_set(params)


def member(name, pool_name, created="2026-01-01T00:00:00+00:00", phase="Running", current=True, **labels):
    tags = {"app": "web", ms.OWNER_LABEL: "web"}
    if current:
        tags[ms.HASH_LABEL] = desired()["template_hash"]
    tags.update(labels)
    return {"name": name, "pool": pool_name, "uri": "qemu+unix:///%s" % pool_name, "phase": phase,
            "created": created, "labels": tags, "conditions": []}


def observed(machines=(), pools=("p1", "p2", "p3"), definition="same"):
    document = ms.definition(desired()) if definition == "same" else definition
    return {"snapshots": [pool(name) for name in pools], "machines": list(machines),
            "pools": [{"name": name, "uri": "qemu+unix:///%s" % name, "state": "Ready", "definition": document}
                      for name in pools]}


def test_scale_up_spreads_evenly_and_names_stably():
    plan = ms.plan_set(desired(replicas=5), observed([member("web-a", "p1")]))
    creates = [action for action in plan.actions if action.kind == "create"]
    assert len(creates) == 4
    pools = [action.data["pool"] for action in creates] + ["p1"]
    assert sorted(pools.count(name) for name in ("p1", "p2", "p3")) == [1, 2, 2]
    again = ms.plan_set(desired(replicas=5), observed([member("web-a", "p1")]))
    # check mode shows the names the real run will use
    assert [a.target for a in again.actions if a.kind == "create"] == [a.target for a in creates]
    assert all(a.target.startswith("web-") and len(a.target) == 9 for a in creates)


def test_nothing_to_do_and_the_definition_is_recorded_once():
    members = [member("web-a", "p1"), member("web-b", "p2"), member("web-c", "p3")]
    assert ms.plan_set(desired(), observed(members)).actions == []
    fresh = ms.plan_set(desired(), observed(members, definition=None))
    assert fresh.kinds() == ["record"] * 3


def test_a_replacement_gets_a_new_name_and_the_record_counts_the_names():
    made = ms.plan_set(desired(replicas=3), observed([]))
    names = [a.target for a in made.actions if a.kind == "create"]
    assert made.kinds()[:3] == ["record"] * 3  # the names are recorded before the members are made
    assert {a.data["document"]["members_made"] for a in made.actions if a.kind == "record"} == {3}
    # one member was remediated (deleted): its replacement does not take its name back
    left = [member(names[0], "p1"), member(names[1], "p2")]
    again = ms.plan_set(desired(replicas=3), observed(left, definition=ms.definition(desired(), 3)))
    replacement = [a.target for a in again.actions if a.kind == "create"]
    assert len(replacement) == 1 and replacement[0] not in names, (replacement, names)
    assert {a.data["document"]["members_made"] for a in again.actions if a.kind == "record"} == {4}
    # nothing to make: the record stays as it is
    whole = left + [member(replacement[0], "p3")]
    assert ms.plan_set(desired(replicas=3), observed(whole, definition=ms.definition(desired(), 4))).actions == []
    # a pool whose record lags behind (it was away) is brought up to the most any pool says
    behind = observed(whole, definition=ms.definition(desired(), 4))
    behind["pools"][2]["definition"] = ms.definition(desired(), 1)
    assert [a.target for a in ms.plan_set(desired(replicas=3), behind).actions] == ["p3"]


@pytest.mark.parametrize("policy,expected", [("Newest", ["web-c"]), ("Oldest", ["web-a"])])
def test_scale_down_by_policy(policy, expected):
    members = [member("web-a", "p1", "2026-01-01T00:00:00+00:00"), member("web-b", "p2", "2026-01-02T00:00:00+00:00"),
               member("web-c", "p3", "2026-01-03T00:00:00+00:00")]
    plan = ms.plan_set(desired(replicas=2, delete_policy=policy), observed(members))
    assert [a.target for a in plan.actions if a.kind == "delete"] == expected


def test_the_delete_mark_wins_then_machines_not_running():
    members = [member("web-a", "p1"), member("web-b", "p2", phase="Shutdown"),
               member("web-c", "p3", **{ms.DELETE_LABEL: "true"})]
    plan = ms.plan_set(desired(replicas=1, delete_policy="Oldest"), observed(members))
    assert [a.target for a in plan.actions if a.kind == "delete"] == ["web-c", "web-b"]


def test_random_policy_is_repeatable():
    members = [member("web-%s" % c, "p1") for c in "abcdef"]
    first = ms.plan_set(desired(replicas=2), observed(members))
    assert first.summaries() == ms.plan_set(desired(replicas=2), observed(members)).summaries()


def test_orphans_are_adopted_and_foreign_members_left_alone():
    orphan = {"name": "lone", "pool": "p1", "uri": "qemu+unix:///p1", "phase": "Running", "labels": {"app": "web"}}
    foreign = dict(orphan, name="theirs", labels={"app": "web", ms.OWNER_LABEL: "other"})
    plan = ms.plan_set(desired(replicas=1), observed([orphan, foreign], definition=ms.definition(desired(replicas=1))))
    assert plan.kinds() == ["adopt"] and plan.actions[0].data["labels"][ms.OWNER_LABEL] == "web"


def test_template_change_lists_out_of_date_members_and_rolls_out_in_waves():
    old = [member("web-a", "p1", current=False), member("web-b", "p2", current=False),
           member("web-c", "p3", current=False)]
    listed = ms.plan_set(desired(), observed(old))
    assert listed.actions == [] and listed.facts["stale"] == ["web-a", "web-b", "web-c"]
    rolled = ms.plan_set(desired(rollout={"max_surge": 1, "max_unavailable": 0}), observed(old))
    waves = {}
    for action in rolled.actions:
        if action.kind == "record":
            continue
        waves.setdefault(action.data["wave"], []).append(action.kind)
    assert waves == {1: ["create", "delete"], 2: ["create", "delete"], 3: ["create", "delete"]}
    down_first = ms.plan_set(desired(rollout={"max_surge": 0, "max_unavailable": 1}), observed(old))
    assert [a.kind for a in down_first.actions if a.kind != "record"][:2] == ["delete", "create"]


def test_absent_deletes_members_and_forgets_the_definition():
    plan = ms.plan_set(ms.normalize_set({"name": "web", "state": "absent"}), observed([member("web-a", "p1")]))
    assert plan.kinds() == ["delete", "forget", "forget", "forget"]


@pytest.mark.parametrize("changes,field", [
    ({"replicas": -1}, "replicas"),
    ({"selector": {"match_labels": {"app": "db"}}}, "selector"),
    ({"selector": {"match_labels": {}}}, "selector.match_labels"),
    ({"template": dict(TEMPLATE, nmae="x")}, "template"),
    ({"template": dict(TEMPLATE, labels={"app": "web", ms.OWNER_LABEL: "x"})},
     "template.labels.%s" % ms.OWNER_LABEL),
    ({"rollout": {"max_surge": "150%"}}, "rollout.max_surge"),
    ({"rollout": {"max_surge": 0, "max_unavailable": 0}}, "rollout"),
    ({"name": "x" * 58}, "name"),
])
def test_bad_sets_name_the_field(changes, field):
    refused(field, desired, **changes)


# --- health checks ----------------------------------------------------------------------------------------

NOW = "2026-01-01T01:00:00+00:00"


def watched(name, ready, since, created="2026-01-01T00:00:00+00:00", phase=None):
    phase = phase or ("Running" if ready else "Shutdown")
    return {"name": name, "pool": "p1", "uri": "qemu+unix:///p1", "phase": phase,
            "created": created, "labels": {"app": "web"}, "ip_addresses": [], "network_interfaces": [],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "health": {"Ready": {"status": "True" if ready else "False", "since": since},
                       "ever_ready": {"status": "True", "since": created}}}


def health(**changes):
    params = {"name": "web", "selector": {"match_labels": {"app": "web"}},
              "unhealthy_conditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]}
    params.update(changes)
    return normalize_check(params)


def test_a_condition_counts_from_its_first_observation():
    fresh = watched("web-a", False, "2026-01-01T00:58:00+00:00")
    old = watched("web-b", False, "2026-01-01T00:50:00+00:00")
    plan = plan_check(health(), [fresh, old, watched("web-c", True, "2026-01-01T00:00:00+00:00")], NOW)
    assert [a.target for a in plan.actions] == ["web-b"] and plan.facts["remediation_allowed"]
    assert "Ready=False for 600s" in plan.actions[0].data["reasons"][0]


def test_a_machine_still_timed_is_neither_healthy_nor_unhealthy():
    fresh = watched("web-a", False, "2026-01-01T00:58:00+00:00")  # Ready False for 2 minutes of 5
    starting = watched("web-b", False, NOW, created="2026-01-01T00:59:00+00:00")
    del starting["health"]["ever_ready"]  # never Ready yet, inside node_startup_timeout
    plan = plan_check(health(), [fresh, starting, watched("web-c", True, "2026-01-01T00:00:00+00:00")], NOW)
    assert plan.actions == [] and plan.facts["unhealthy"] == [] and plan.facts["waiting"] == ["web-a", "web-b"]
    from ansible_collections.machinery.compute.plugins.module_utils.manifests import openshift
    shown = openshift.status(type("Obj", (), {"kind": "MachineHealthCheck"})(), {"check": plan.facts})
    assert (shown["expectedMachines"], shown["currentHealthy"]) == (3, 1)


def test_max_unhealthy_stops_remediation():
    sick = [watched("web-%d" % i, False, "2026-01-01T00:00:00+00:00") for i in range(2)]
    plan = plan_check(health(max_unhealthy=1), sick + [watched("web-9", True, NOW)], NOW)
    assert plan.actions == [] and plan.facts["remediation_allowed"] is False and "nothing" in plan.warnings[0]
    assert len(plan_check(health(max_unhealthy="70%"), sick + [watched("web-9", True, NOW)], NOW).actions) == 2


def test_never_ready_after_the_startup_timeout():
    stuck = watched("web-a", False, "2026-01-01T00:00:00+00:00")
    del stuck["health"]["ever_ready"]
    plan = plan_check(health(unhealthy_conditions=[], node_startup_timeout="30m"), [stuck], NOW)
    assert plan.kinds() == ["delete"] and "node_startup_timeout" in plan.actions[0].data["reasons"][0]
    assert plan_check(health(unhealthy_conditions=[], node_startup_timeout="2h"), [stuck], NOW).actions == []


def test_guest_signals_count_like_any_condition():
    silent = watched("web-a", True, "2026-01-01T00:00:00+00:00")
    silent.update(agent_connected=False, booted=False)
    answering = watched("web-b", True, "2026-01-01T00:00:00+00:00")
    answering.update(agent_connected=True, booted=True)
    unknown = watched("web-c", True, "2026-01-01T00:00:00+00:00")  # not observed (stopped): nothing to say
    assert conditions_of(silent)["GuestAgentConnected"] == "False" and conditions_of(silent)["Booted"] == "False"
    assert "GuestAgentConnected" not in conditions_of(unknown) and "Booted" not in conditions_of(unknown)
    for machine in (silent, answering, unknown):
        machine["health"] = transitions(machine, "2026-01-01T00:50:00+00:00")
    rules = [{"type": "GuestAgentConnected", "status": "False", "timeout": "5m"},
             {"type": "Booted", "status": "False", "timeout": "5m"}]
    plan = plan_check(health(unhealthy_conditions=rules, boot_marker="READY"), [silent, answering, unknown], NOW)
    assert [a.target for a in plan.actions] == ["web-a"]
    assert [reason.split(" ")[0] for reason in plan.actions[0].data["reasons"]] == [
        "GuestAgentConnected=False", "Booted=False"]


@pytest.mark.parametrize("changes,field", [
    ({"unhealthy_conditions": [{"type": "Booted", "status": "False", "timeout": "1m"}]}, "unhealthy_conditions"),
    ({"boot_marker": "two\nlines"}, "boot_marker"),
    ({"boot_marker": "  "}, "boot_marker"),
    ({"unhealthy_conditions": [{"type": "Bogus", "status": "False", "timeout": "1m"}]},
     "unhealthy_conditions[0].type"),
    ({"unhealthy_conditions": [{"type": "Ready", "status": "False", "timeout": "soon"}]},
     "unhealthy_conditions[0].timeout"),
    ({"max_unhealthy": "120%"}, "max_unhealthy"),
    ({"selector": {"match_labels": {}}}, "selector.match_labels"),
])
def test_bad_checks_name_the_field(changes, field):
    refused(field, health, **changes)


def test_a_batch_takes_its_jobs_from_each_pool_in_turn():
    """At most APPLYING_PER_POOL machines of a pool change at once: a run of one pool's jobs would hold the
    threads other pools could use, so the jobs come from each pool in turn, each pool's in order."""
    from types import SimpleNamespace
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.batch import interleaved
    one, two, three = (SimpleNamespace(uri="pool%d" % index) for index in (1, 2, 3))
    jobs = [("a", one), ("b", one), ("c", one), ("d", two), ("e", one), ("f", three), ("g", two)]
    assert [name for name, _ctx in interleaved(jobs)] == ["a", "d", "f", "b", "g", "c", "e"]
    assert interleaved([]) == []


def test_a_set_in_an_anti_affinity_group_puts_one_member_per_pool():
    group = {"name": "web", "policy": "anti-affinity"}
    template = dict(TEMPLATE, server_group=group)
    plan = ms.plan_set(desired(replicas=4, template=template), observed([member("web-a", "p1")]))
    creates = [action for action in plan.actions if action.kind == "create"]
    assert sorted(action.data["pool"] for action in creates) == ["p2", "p3"]
    refusals = [warning for warning in plan.warnings if "pools available" in warning]
    assert len(refusals) == 1 and "3 server group web (anti-affinity) has a member there" in refusals[0], refusals


def test_a_set_in_an_affinity_group_stays_together_and_books_storage():
    template = dict(TEMPLATE, server_group={"name": "web", "policy": "affinity"}, root_size="10Gi")
    seen = observed([member("web-a", "p2")])
    for snapshot in seen["snapshots"]:
        snapshot["storage"] = {"allocatable": 100 * GIB, "allocated": 75 * GIB}
    plan = ms.plan_set(desired(replicas=4, template=template), seen)
    creates = [action for action in plan.actions if action.kind == "create"]
    # p2 has room for two more 10Gi root disks: the third is refused rather than put elsewhere
    assert [action.data["pool"] for action in creates] == ["p2", "p2"]
    refusals = [warning for warning in plan.warnings if "pools available" in warning]
    assert len(refusals) == 1 and refusals[0].endswith(
        "2 server group web (affinity) has its members on p2, 1 insufficient storage (p2: storage 5Gi free, "
        "needs 10Gi)"), refusals


def test_a_set_spreads_its_members_over_a_pool_label():
    seen = observed([member("web-a", "p1")], pools=("p1", "p2", "p3"))
    for snapshot, zone in zip(seen["snapshots"], ("a", "a", "b")):
        snapshot["labels"] = {"zone": zone}
    spread = [{"topology_key": "zone", "max_skew": 1}]
    plan = ms.plan_set(desired(replicas=4, topology_spread=spread), seen)
    zones = {"p1": "a", "p2": "a", "p3": "b"}
    creates = [zones[action.data["pool"]] for action in plan.actions if action.kind == "create"]
    assert sorted(creates + ["a"]) == ["a", "a", "b", "b"]
    # without the constraint the set spreads by member counts over the pools: zone a gets two of three more
    plain = [zones[action.data["pool"]] for action in ms.plan_set(desired(replicas=4), seen).actions
             if action.kind == "create"]
    assert sorted(plain + ["a"]) == ["a", "a", "a", "b"]
    assert ms.definition(desired(topology_spread=spread))["topology_spread"] == \
        [{"topology_key": "zone", "max_skew": 1, "when_unsatisfiable": "refuse"}]
    assert "topology_spread" not in ms.definition(desired())


def test_members_no_pool_has_room_for_are_one_warning_per_reason():
    plan = ms.plan_set(desired(replicas=400), observed([]))
    made = [action for action in plan.actions if action.kind == "create"]
    assert 0 < len(made) < 400
    assert len(plan.warnings) == 1, plan.warnings
    assert plan.warnings[0].startswith("%d of %d new member(s) cannot be placed (web-" % (400 - len(made), 400))
    assert " and %d more): 0/3 pools available: " % (400 - len(made) - 3) in plan.warnings[0]


def test_members_no_pool_has_room_for_hand_out_no_name_and_the_next_plan_is_the_same():
    """The names of members that cannot be placed are not counted in the record: the plan after the record was
    written (the run's own verification, the next run) plans the same names again, and records nothing new. With
    the count taken for every name planned, a set on full pools recorded a new count on each run and its run
    failed as not converged."""
    full = observed([], definition=None)  # a new set
    for snapshot in full["snapshots"]:
        snapshot["allocatable"]["cpu"] = snapshot["allocated"]["cpu"]  # no room anywhere
    plan = ms.plan_set(desired(replicas=3), full)
    assert plan.kinds() == ["record"] * 3 and len(plan.warnings) == 1
    document = plan.actions[0].data["document"]
    assert "members_made" not in document  # no name handed out
    full["pools"] = [dict(entry, definition=document) for entry in full["pools"]]
    assert ms.plan_set(desired(replicas=3), full).actions == []
    # room for one: one name handed out, the count is one
    full["snapshots"][0]["allocatable"]["cpu"] = 1
    one = ms.plan_set(desired(replicas=3), full)
    assert one.kinds().count("create") == 1
    assert {a.data["document"]["members_made"] for a in one.actions if a.kind == "record"} == {1}


def test_the_record_keeps_when_the_set_was_first_recorded():
    first, later = "2026-11-25T03:00:00+00:00", "2026-11-26T03:00:00+00:00"
    made = ms.plan_set(desired(replicas=1), observed([], definition=None), first)
    assert {a.data["document"].get("created") for a in made.actions if a.kind == "record"} == {first}
    members = [member(a.target, a.data["pool"]) for a in made.actions if a.kind == "create"]
    recorded = observed(members, definition=ms.definition(desired(replicas=1), 1, first))
    assert ms.plan_set(desired(replicas=1), recorded, later).actions == []  # kept, not renewed
    old = observed(members, definition=ms.definition(desired(replicas=1), 1))
    assert ms.plan_set(desired(replicas=1), old, later).actions == []  # recorded before it was kept: left as it is


@pytest.mark.parametrize("key", ["rebuild", "allow_move"])
def test_a_template_refuses_what_only_the_machine_module_does(key):
    message = refused("template", desired, template=dict(TEMPLATE, **{key: True}))
    said, takes = message.split("; a template takes ")
    assert said == "unknown option %s" % key and key not in takes.split(", "), message


@pytest.mark.parametrize("state", ["absent", "restarted"])
def test_a_template_state_is_one_a_member_is_kept_in(state):
    message = refused("template.state", desired, template=dict(TEMPLATE, state=state))
    assert "a member's state is what every run keeps it in" in message


@pytest.mark.parametrize("state, strategy", [("running", "always"), ("present", "manual"), ("stopped", "halted")])
def test_a_member_takes_the_strategy_its_template_state_implies(state, strategy):
    spec = ms.member_spec(desired(template=dict(TEMPLATE, state=state)), "web-00001", "none", 300)
    assert (spec["state"], spec["run_strategy"]) == (state, strategy)


@pytest.mark.parametrize("machine, expected", [
    ({"phase": "Running", "agent_connected": True, "network_interfaces": [{"network": "n"}]}, "True"),
    ({"phase": "Shutdown", "agent_connected": None, "network_interfaces": [{"network": "n"}]}, "False"),
    ({"phase": "Running", "agent_connected": False, "ip_addresses": ["10.0.0.5"],
      "network_interfaces": [{"network": "n"}]}, "True"),
    ({"phase": "Running", "agent_connected": False, "network_interfaces": [{"network": "n"}]}, "False"),
    ({"phase": "Running", "agent_connected": False, "ip_addresses": ["10.0.0.5"],
      "network_interfaces": [{"network": "n"}], "health": {"ever_agent": {"status": "True", "since": "x"}}},
     "Unknown"),
])
def test_node_ready_is_the_guests_readiness(machine, expected):
    """Issue 39: a running domain is not a ready guest; an agent that answered and fell silent is Unknown."""
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import conditions_of
    assert conditions_of(machine)["NodeReady"] == expected


def test_a_startup_timeout_of_zero_disables_the_startup_check():
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import normalize_check, verdict
    desired = normalize_check({"name": "c", "selector": {"match_labels": {"a": "b"}}, "node_startup_timeout": "0",
                               "startup_condition": "NodeReady"})
    machine = {"name": "m", "created": "2020-01-01T00:00:00+00:00", "phase": "Running"}
    assert desired["startup"] is None
    assert verdict(desired, machine, {}, "2026-01-01T00:00:00+00:00") == []
    waiting = normalize_check({"name": "c", "selector": {"match_labels": {"a": "b"}}, "node_startup_timeout": "10m",
                               "startup_condition": "NodeReady"})
    assert verdict(waiting, machine, {"ever_ready": {"status": "True"}}, "2026-01-01T00:00:00+00:00") != []
