"""A set's members on a pool it cannot reach: when they are replaced and what is fenced when the pool is back.
Pure plans, the clock passed in."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import lost_pool
from ansible_collections.machinery.compute.plugins.module_utils.fleets import machine_set as ms

from conftest import pool_snapshot

GIB = 2 ** 30
TEMPLATE = {"machine_class": "small", "image": "/images/test.qcow2", "labels": {"app": "web"}}
LOST_AT = "2026-01-01T00:00:00+00:00"
SOON = "2026-01-01T00:00:30+00:00"
LATER = "2026-01-01T00:05:00+00:00"


def uri(name):
    return "qemu+unix:///%s" % name


def desired(**changes):
    params = {"name": "web", "replicas": 3, "selector": {"match_labels": {"app": "web"}}, "template": TEMPLATE,
              "unreachable_timeout": "2m"}
    params.update(changes)
    return ms.normalize_set(params)


def member(name, pool_name):
    return {"name": name, "pool": pool_name, "uri": uri(pool_name), "phase": "Running", "conditions": [],
            "created": LOST_AT, "labels": {"app": "web", ms.OWNER_LABEL: "web",
                                           ms.HASH_LABEL: desired()["template_hash"]}}


def record(offline_since=None, replaced=None, revision=3):
    document = ms.definition(desired())
    document.update(unreachable_timeout=120.0, revision=revision,
                    members={name: {"pool": pool_name, "uri": uri(pool_name)}
                             for name, pool_name in (("web-a", "p1"), ("web-b", "p2"), ("web-c", "p3"))},
                    unreachable={uri("p3"): offline_since} if offline_since else {}, replaced=replaced or {})
    if replaced:
        for name in replaced:
            document["members"].pop(name, None)
    return document


def observed(machines, offline=("p3",), document=None, found=None):
    pools = []
    for name in ("p1", "p2", "p3"):
        down = name in offline
        pools.append({"name": name, "uri": uri(name), "state": "Offline" if down else "Ready",
                      "definition": None if down else document})
    snapshots = [pool_snapshot(name, uri(name), cpu=64, memory=64 * GIB, state="Offline" if name in offline
                               else "Ready") for name in ("p1", "p2", "p3")]
    return {"snapshots": snapshots, "machines": list(machines), "pools": pools, "replaced_found": found or {}}


REACHABLE = [member("web-a", "p1"), member("web-b", "p2")]


def test_a_pool_first_seen_unreachable_is_only_recorded():
    plan = ms.plan_set(desired(), observed(REACHABLE, document=record()), SOON)
    assert plan.kinds() == ["record", "record"]  # the two reachable pools learn when p3 was first seen Offline
    written = plan.actions[0].data["document"]
    assert written["unreachable"] == {uri("p3"): SOON} and written["revision"] == 4
    assert "web-c" in written["members"] and written["replaced"] == {}
    assert [entry["name"] for entry in plan.facts["lost"]["lost"]] == ["web-c"]
    assert not plan.facts["lost"]["lost"][0]["replace"]


def test_before_the_timeout_the_lost_member_still_counts():
    plan = ms.plan_set(desired(), observed(REACHABLE, document=record(LOST_AT)), SOON)
    assert plan.actions == []  # the mark is already there: nothing to write, nothing to make
    status = ms.set_status(desired(), observed(REACHABLE, document=record(LOST_AT)), plan)
    lost = next(m for m in status["members"] if m["name"] == "web-c")
    assert lost["phase"] == "Unknown" and lost["conditions"] == [
        {"type": "PoolReachable", "status": "False", "since": LOST_AT}]
    assert status["replicas"] == 3 and status["ready_replicas"] == 2 and status["replaced_members"] == []


def test_after_the_timeout_the_lost_member_is_replaced_on_a_reachable_pool():
    plan = ms.plan_set(desired(), observed(REACHABLE, document=record(LOST_AT)), LATER)
    creates = [a for a in plan.actions if a.kind == "create"]
    assert len(creates) == 1 and creates[0].data["pool"] in ("p1", "p2")
    assert creates[0].target not in ("web-a", "web-b", "web-c")
    written = [a for a in plan.actions if a.kind == "record"][0].data["document"]
    assert written["replaced"] == {"web-c": {"pool": "p3", "uri": uri("p3"), "since": LOST_AT}}
    assert sorted(written["members"]) == sorted(["web-a", "web-b", creates[0].target])
    assert plan.kinds().index("record") < plan.kinds().index("create")
    assert ms.set_status(desired(), observed(REACHABLE, document=record(LOST_AT)), plan)["replaced_members"][0][
        "name"] == "web-c"


def test_a_zero_timeout_replaces_on_first_sight():
    plan = ms.plan_set(desired(unreachable_timeout="0s"), observed(REACHABLE, document=record()), SOON)
    assert "create" in plan.kinds()


def test_without_the_option_an_unseen_member_is_replaced_at_once_as_before():
    plain = ms.normalize_set({"name": "web", "replicas": 3, "selector": {"match_labels": {"app": "web"}},
                              "template": TEMPLATE})
    seen = observed(REACHABLE, document=ms.definition(plain))
    plan = ms.plan_set(plain, seen)
    # (the records count the name handed out: a later replacement gets another one)
    assert plan.kinds() == ["record", "record", "create"] and "lost" not in (plan.facts.get("lost") or {})
    assert "members" not in ms.definition(plain)


def test_a_pool_back_fences_the_replaced_member_first_and_clears_the_mark():
    replaced = {"web-c": {"pool": "p3", "uri": uri("p3"), "since": LOST_AT}}
    document = record(LOST_AT, replaced)
    document["members"]["web-d"] = {"pool": "p1", "uri": uri("p1")}
    machines = REACHABLE + [member("web-d", "p1"), member("web-c", "p3")]
    found = {"web-c": {"exists": True, "owner": "web", "volumes": ["web-c-root.qcow2"], "journal": None}}
    plan = ms.plan_set(desired(), observed(machines, offline=(), document=document, found=found), LATER)
    assert plan.kinds()[:2] == ["fence", "reclaim"] and plan.actions[0].target == "web-c"
    assert plan.actions[1].data["volumes"] == ["web-c-root.qcow2"]
    assert "delete" not in plan.kinds() and "create" not in plan.kinds()  # the stale copy is not a member
    written = [a for a in plan.actions if a.kind == "record"][0].data["document"]
    assert written["unreachable"] == {} and written["replaced"] == {}
    assert sorted(written["members"]) == ["web-a", "web-b", "web-d"]
    # once fenced, the next run has nothing to do
    after = dict(written)
    gone = {"web-c": {"exists": False, "journal": None}}
    settled = ms.plan_set(desired(), observed(REACHABLE + [member("web-d", "p1")], offline=(), document=after,
                                              found=gone), LATER)
    assert settled.actions == []


def test_fencing_never_touches_a_machine_the_set_does_not_own():
    replaced = {"web-c": {"pool": "p3", "uri": uri("p3"), "since": LOST_AT}}
    found = {"web-c": {"exists": True, "owner": None, "volumes": ["web-c-root.qcow2"], "journal": None}}
    fence, reclaim, settled, foreign = lost_pool.fence_plan(replaced, {uri("p3"): True}, found, "web")
    assert (fence, reclaim, settled, foreign) == ([], {}, [], ["web-c"])
    assert lost_pool.fence_plan(replaced, {uri("p3"): False}, found, "web") == ([], {}, [], [])


def test_a_fence_cut_off_after_the_undefine_reclaims_from_the_journal():
    replaced = {"web-c": {"pool": "p3", "uri": uri("p3"), "since": LOST_AT}}
    found = {"web-c": {"exists": False, "journal": ["web-c-root.qcow2"]}}
    assert lost_pool.fence_plan(replaced, {uri("p3"): True}, found, "web") == (
        [], {"web-c": ["web-c-root.qcow2"]}, [], [])


def test_a_pool_back_before_the_timeout_keeps_its_member():
    machines = REACHABLE + [member("web-c", "p3")]
    plan = ms.plan_set(desired(), observed(machines, offline=(), document=record(LOST_AT)), SOON)
    assert plan.kinds() == ["record"] * 3
    written = plan.actions[0].data["document"]
    assert written["unreachable"] == {} and written["replaced"] == {} and "web-c" in written["members"]


def test_the_newest_record_wins_over_a_pool_that_was_away():
    old, new = record(revision=2), record(LOST_AT, revision=7)
    assert lost_pool.trusted([old, None, new])["revision"] == 7


def test_durations_and_their_errors():
    assert lost_pool.seconds("1h30m", "f") == 5400 and lost_pool.seconds(0, "f") == 0
    # a number of seconds, whole or not, as a number or as the text Ansible makes of it for a str option
    assert [lost_pool.seconds(value, "f") for value in (5, "5", 3.5, "3.5", ".5", "1.5m", "0.5h1.5s")] == [
        5, 5, 3.5, 3.5, 0.5, 90, 1801.5]
    for bad in ("3.5.1", "5 m", "m", "1.5x", "-3.5", True):
        with pytest.raises(ValidationError):
            lost_pool.seconds(bad, "f")
    assert lost_pool.age(LOST_AT, LATER) == 300
    refused = None
    try:
        desired(unreachable_timeout="soon")
    except Exception as exc:  # pylint: disable=broad-except
        refused = exc
    assert refused is not None and refused.field == "unreachable_timeout"


# --- the health check ---------------------------------------------------------------------------------------

def check(**changes):
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import normalize_check
    params = {"name": "web", "selector": {"match_labels": {"app": "web"}}, "unhealthy_conditions": [],
              "node_startup_timeout": "1h", "unreachable_timeout": "2m"}
    params.update(changes)
    return normalize_check(params)


def watched(machine):
    ready = {"ever_ready": {"status": "True", "since": LOST_AT}}
    return dict(machine, ip_addresses=[], network_interfaces=[], health=ready)


def lost_view(document):
    return {"reachable": {uri("p1"): True, uri("p2"): True, uri("p3"): False},
            "sets": [{"name": "web", "record": document, "uris": [uri("p1"), uri("p2")]}]}


def test_the_check_records_the_mark_then_replaces_within_max_unhealthy():
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import plan_check
    machines = [watched(m) for m in REACHABLE]
    first = plan_check(check(), machines, SOON, lost_view(record()))
    assert first.kinds() == ["record"] and first.facts["unhealthy"] == [] and first.facts["covered"] == 3
    assert first.actions[0].data["document"]["unreachable"] == {uri("p3"): SOON}
    reach = {item["name"]: item["condition"] for item in first.facts["pool_reachable"]}
    assert reach["web-c"] == {"type": "PoolReachable", "status": "False", "since": SOON}
    assert reach["web-a"]["status"] == "True"

    later = plan_check(check(), machines, LATER, lost_view(record(LOST_AT)))
    assert later.kinds() == ["replace"] and [u["name"] for u in later.facts["unhealthy"]] == ["web-c"]
    written = later.actions[0].data["document"]
    assert "web-c" in written["replaced"] and "web-c" not in written["members"] and written["revision"] == 4
    assert "PoolReachable=False for 300s" in later.facts["unhealthy"][0]["reasons"][0]

    held = plan_check(check(max_unhealthy=0), machines, LATER, lost_view(record(LOST_AT)))
    assert held.actions == [] and held.facts["remediation_allowed"] is False

    # once replaced, the check has nothing more to do
    assert plan_check(check(), machines, LATER, lost_view(written)).actions == []


def test_without_the_option_the_check_does_not_look_at_unreachable_pools():
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import plan_check
    plain = check(unreachable_timeout=None)
    plan = plan_check(plain, [watched(m) for m in REACHABLE], LATER, lost_view(record(LOST_AT)))
    assert plan.actions == [] and plan.facts["covered"] == 2


def test_a_check_covers_a_set_only_through_its_labels():
    document = record()
    assert lost_pool.covers(document, {"app": "web"})
    assert lost_pool.covers(document, {ms.OWNER_LABEL: "web"})
    assert not lost_pool.covers(document, {"app": "db"})


def test_the_diff_shows_the_mark_and_the_replacement():
    plan = ms.plan_set(desired(), observed(REACHABLE, document=record(LOST_AT)), LATER)
    before, after = plan.diff()
    assert before["replaced"] == [] and after["replaced"] == ["web-c"]
    assert before["unreachable"] == after["unreachable"] == {uri("p3"): LOST_AT}
