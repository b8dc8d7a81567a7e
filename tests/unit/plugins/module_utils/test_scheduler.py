import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.lookup.scheduler import validated
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import (
    Unschedulable, must_leave, normalize_tolerations, tolerates)
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules as rules

from conftest import pool_snapshot, refused

GI = 2 ** 30
SMALL = {"cpu": 1, "memory": 1 * GI}
LARGE = {"cpu": 4, "memory": 8 * GI}


def pool(name, memory=16, used_memory=0, classes=None, **given):
    """A pool snapshot, memory in GiB, publishing classes small and large unless told; ``server_groups`` as a
    snapshot lists them ({machine: {name, policy}})."""
    groups = given.pop("server_groups", None)
    snapshot = pool_snapshot(name, "qemu+unix:///system?socket=/%s" % name, memory=memory * GI,
                             used_memory=used_memory * GI,
                             classes={"small": SMALL, "large": LARGE} if classes is None else classes, **given)
    if groups is not None:
        snapshot["server_groups"] = groups
        snapshot["machines"] = sorted(set(snapshot["machines"]) | set(groups))
    return snapshot


def spec(name, machine_class="small", **extra):
    return dict(name=name, machine_class=machine_class, **extra)


def schedule(specs, pools, **options):
    """The scheduler over specs validated as the lookup validates its terms."""
    return scheduler.schedule(validated(specs), pools, **options)


def placed(specs, pools, **options):
    return [p["pool"] for p in schedule(specs, pools, **options)]


def test_ready_filter():
    pools = [pool("a", state="Offline"), pool("b", state="Error"), pool("c")]
    assert placed([spec("m")], pools) == ["c"]
    with pytest.raises(Unschedulable) as info:
        schedule([spec("m")], pools[:2])
    assert "0/2 pools available for m: 1 pool unreachable, 1 pool not ready" == info.value.message


def test_taint_filter_and_tolerations():
    tainted = pool("gpu", taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
    with pytest.raises(Unschedulable, match="1 taint not tolerated"):
        schedule([spec("m")], [tainted])
    for toleration in ({"key": "gpu", "operator": "Exists"},
                       {"key": "gpu", "operator": "Equal", "value": "true"},
                       {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                       {"operator": "Exists"}):
        assert placed([spec("m", tolerations=[toleration])], [tainted]) == ["gpu"], toleration
    for toleration in ({"key": "gpu", "operator": "Equal", "value": "false"},
                       {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
                       {"key": "other", "operator": "Exists"}):
        with pytest.raises(Unschedulable):
            schedule([spec("m", tolerations=[toleration])], [tainted])


def test_tolerates_effect_rules():
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert tolerates({"key": "k", "operator": "Equal", "value": "v", "effect": ""}, taint)
    assert not tolerates({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, taint)


def test_must_leave_only_for_untolerated_no_execute_taints():
    drain = {"key": "maintenance", "value": "drain", "effect": "NoExecute"}
    keep_out = {"key": "gpu", "value": "", "effect": "NoSchedule"}
    assert not must_leave([], None)
    assert not must_leave([keep_out], [])  # NoSchedule keeps new machines away, never evicts
    assert must_leave([keep_out, drain], [])
    assert must_leave([drain], normalize_tolerations([{"key": "maintenance", "operator": "Equal",
                                                       "value": "other"}], "tolerations"))
    for toleration in ({"key": "maintenance", "operator": "Exists"},
                       {"key": "maintenance", "value": "drain", "effect": "NoExecute"},
                       {"operator": "Exists"}):
        assert not must_leave([drain], normalize_tolerations([toleration], "tolerations")), toleration
    assert must_leave([drain], normalize_tolerations([{"key": "maintenance", "operator": "Exists",
                                                       "effect": "NoSchedule"}], "tolerations"))


def test_normalize_tolerations_names_the_field():
    assert normalize_tolerations(None, "tolerations") is None
    assert normalize_tolerations([], "tolerations") is None  # as a record without any
    assert normalize_tolerations([{"key": "a", "operator": "Exists"}], "tolerations") == [
        {"key": "a", "operator": "Exists", "value": "", "effect": ""}]
    refused("tolerations", normalize_tolerations, "gpu", "tolerations")
    with pytest.raises(ValidationError) as info:
        normalize_tolerations([{"key": "a", "operator": "Exists"}, {"key": "b", "effect": "Sometimes"}],
                              "template.tolerations")
    assert info.value.field == "template.tolerations[1].effect"


def test_selector_filter():
    pools = [pool("a", labels={"zone": "a", "disk": "hdd"}), pool("b", labels={"zone": "b", "disk": "ssd"})]
    assert placed([spec("m", machine_pool_selector={"disk": "ssd"})], pools) == ["b"]
    with pytest.raises(Unschedulable, match=r"2 selector not matched \(disk=nvme\)"):
        schedule([spec("m", machine_pool_selector={"disk": "nvme"})], pools)
    # the label keys that failed are named, so a region or zone refusal says which label to set on a pool
    with pytest.raises(Unschedulable, match=r"1 selector not matched \(disk=ssd, topology.kubernetes.io/region=west\), "
                                            r"1 selector not matched \(topology.kubernetes.io/region=west\)"):
        schedule([spec("m", machine_pool_selector={"disk": "ssd", "topology.kubernetes.io/region": "west"})],
                 pools)


def test_class_filter():
    pools = [pool("a", classes={"small": SMALL}), pool("b")]
    assert placed([spec("m", "large")], pools) == ["b"]
    with pytest.raises(Unschedulable, match="1 class huge not published"):
        schedule([spec("m", "huge")], pools[:1])


def test_a_class_named_as_a_kubernetes_object_name_places_a_machine_and_a_set_template():
    """t3.medium is a DNS-1123 subdomain, a class name as written (machine_class, machine_set templates)."""
    pools = [pool("a", classes={"t3.medium": SMALL}), pool("b")]
    assert placed([spec("m", "t3.medium")], pools) == ["a"]
    template = machine_spec.params({"name": "set-1-x", "machine_class": "t3.medium", "image": "my-image"},
                                   scheduling=True)
    assert template["machine_class"] == "t3.medium"
    refused("machine_class", machine_spec.params, {"name": "m", "machine_class": "T3_Medium", "image": "i"})


def test_explicit_size_without_class():
    pools = [pool("a", cpu=2, classes={}), pool("b", cpu=8, classes={})]
    assert placed([{"name": "m", "cpu": 4, "memory": "1Gi"}], pools) == ["b"]
    with pytest.raises(ValidationError):
        schedule([{"name": "m", "cpu": 4}], pools)


def test_capacity_filter_names_the_resource():
    pools = [pool("a", cpu=2), pool("b", memory=4), pool("c", cpu=2, memory=4)]
    with pytest.raises(Unschedulable) as info:
        schedule([spec("m", "large")], pools)
    assert info.value.message == "0/3 pools available for m: 2 insufficient cpu, 2 insufficient memory"


def test_filters_run_in_order():
    # a pool failing several filters is counted under the first one only
    bad = pool("a", state="Ready", taints=[{"key": "x", "value": "", "effect": "NoSchedule"}],
               labels={}, classes={})
    with pytest.raises(Unschedulable) as info:
        schedule([spec("m", machine_pool_selector={"zone": "z"})], [bad])
    assert info.value.message.endswith("1 taint not tolerated")


def test_spread_and_binpack():
    pools = [pool("a", used_cpu=6, used_memory=12), pool("b")]
    assert placed([spec("m")], pools) == ["b"]
    assert placed([spec("m")], pools, strategy="binpack") == ["a"]


def test_batch_never_double_books():
    pools = [pool("a", cpu=4, memory=8), pool("b", cpu=4, memory=8)]
    assert sorted(placed([spec("l1", "large"), spec("l2", "large")], pools)) == ["a", "b"]
    with pytest.raises(Unschedulable, match="l3"):
        schedule([spec("l1", "large"), spec("l2", "large"), spec("l3", "large")], pools)


def test_non_strict_reports_the_unschedulable():
    result = schedule([spec("l1", "large"), spec("l2", "large")], [pool("a", cpu=4, memory=8)], strict=False)
    assert result[0]["pool"] == "a"
    assert result[1]["pool"] is None and result[1]["uri"] is None
    assert result[1]["reason"] == "0/1 pools available for l2: 1 insufficient cpu, 1 insufficient memory"


def test_existing_machine_stays_where_it_is():
    pools = [pool("a", machines=["m"], used_cpu=8, used_memory=16), pool("b")]
    result = schedule([spec("m")], pools)
    assert result[0]["pool"] == "a" and "already exists" in result[0]["reason"]


def test_pinned_pool():
    pools = [pool("a"), pool("b")]
    assert placed([spec("m", machine_pool="a")], pools) == ["a"]
    with pytest.raises(Unschedulable, match="not among the pools"):
        schedule([spec("m", machine_pool="z")], pools)


def test_tie_breaker_is_stable_but_not_always_the_first_pool():
    pools = [pool(name) for name in ("a", "b", "c")]
    chosen = {placed([spec("m-%d" % index)], pools)[0] for index in range(30)}
    assert len(chosen) > 1
    assert placed([spec("m-1")], pools) == placed([spec("m-1")], list(reversed(pools)))


def test_bad_specs():
    refused("terms[0].name", schedule, [spec("Bad Name")], [pool("a")])
    refused("terms[1].name", schedule, [spec("m"), spec("m")], [pool("a")])
    with pytest.raises(ValidationError):
        schedule([spec("m", tolerations=[{"operator": "Sometimes"}])], [pool("a")])
    with pytest.raises(ValidationError):
        schedule([spec("m")], [pool("a")], strategy="random")


pool_strategy = st.builds(
    lambda index, cpu, memory, used_cpu, used_memory: pool("p%d" % index, cpu=cpu, memory=memory,
                                                           used_cpu=min(used_cpu, cpu),
                                                           used_memory=min(used_memory, memory)),
    st.integers(0, 10 ** 6), st.integers(1, 64), st.integers(1, 256), st.integers(0, 64), st.integers(0, 256))


@settings(max_examples=200, deadline=None)
@given(pools=st.lists(pool_strategy, min_size=1, max_size=8, unique_by=lambda p: p["name"]),
       classes=st.lists(st.sampled_from(["small", "large"]), min_size=1, max_size=40),
       strategy=st.sampled_from(["spread", "binpack"]))
def test_never_overcommits_and_is_deterministic(pools, classes, strategy):
    specs = [spec("m%d" % index, machine_class) for index, machine_class in enumerate(classes)]
    first = schedule(specs, pools, strategy=strategy, strict=False)
    assert first == schedule(specs, pools, strategy=strategy, strict=False)
    sizes = {"small": SMALL, "large": LARGE}
    by_name = {p["name"]: p for p in pools}
    for name, target in by_name.items():
        mine = [sizes[c] for s, c, p in zip(specs, classes, first) if p["pool"] == name]
        assert target["allocated"]["cpu"] + sum(size["cpu"] for size in mine) <= target["allocatable"]["cpu"]
        assert target["allocated"]["memory"] + sum(size["memory"] for size in mine) <= \
            target["allocatable"]["memory"]


# --- storage (issue 24) ------------------------------------------------------------------------------------------

def stored(snapshot, free, allocatable=100):
    """``snapshot`` with storage of ``allocatable`` GiB of which ``free`` GiB are not allocated."""
    snapshot["storage"] = {"allocatable": allocatable * GI, "allocated": (allocatable - free) * GI}
    return snapshot


def test_storage_need_is_what_the_params_tell():
    request = scheduler.machine_request(validated([spec("m", image="/i.qcow2", root_size="10Gi",
                                                        volumes=[{"name": "data", "size": "5Gi"},
                                                                 {"name": "old", "volume": "kept.qcow2"}])])[0])
    assert request["storage"] == 15 * GI
    # the image's own size is only known once the image is read on the pool: not counted here
    assert scheduler.machine_request(validated([spec("m", image="/i.qcow2")])[0])["storage"] == 0


def test_storage_filter_names_the_pool_and_the_need():
    pools = [stored(pool("a"), free=3), stored(pool("b"), free=20)]
    big = spec("m", image="/i.qcow2", root_size="10Gi")
    assert placed([big], pools) == ["b"]
    with pytest.raises(Unschedulable) as info:
        schedule([big], pools[:1])
    assert info.value.message == "0/1 pools available for m: 1 insufficient storage (a: storage 3Gi free, needs 10Gi)"


def test_storage_counts_after_cpu_and_memory_and_only_where_known():
    pools = [stored(pool("a", cpu=0), free=1), pool("b")]  # b's snapshot says nothing of storage: not filtered
    assert placed([spec("m", image="/i.qcow2", root_size="10Gi")], pools) == ["b"]
    with pytest.raises(Unschedulable) as info:
        schedule([spec("m", image="/i.qcow2", root_size="10Gi")], pools[:1])
    assert info.value.message.endswith("1 insufficient cpu, 1 insufficient storage (a: storage 1Gi free, needs 10Gi)")


def test_batch_books_storage():
    pools = [stored(pool("a"), free=15), stored(pool("b"), free=15)]
    machines = [spec("m%d" % index, image="/i.qcow2", root_size="10Gi") for index in range(3)]
    result = schedule(machines, pools, strict=False)
    assert sorted(p["pool"] for p in result[:2]) == ["a", "b"]
    assert result[2]["pool"] is None and "2 insufficient storage" in result[2]["reason"]


def test_spread_and_binpack_weigh_storage():
    # the same cpu and memory free on both; only storage tells them apart
    pools = [stored(pool("a"), free=10), stored(pool("b"), free=90)]
    assert placed([spec("m")], pools) == ["b"]
    assert placed([spec("m")], pools, strategy="binpack") == ["a"]


# --- server groups (issue 25) ------------------------------------------------------------------------------------

def grouped(name, policy="anti-affinity", **extra):
    return spec(name, server_group={"name": "db", "policy": policy}, **extra)


def test_anti_affinity_one_per_pool_and_refuses_naming_the_group():
    pools = [pool("a"), pool("b"), pool("c")]
    assert sorted(placed([grouped("db-%d" % index) for index in range(3)], pools)) == ["a", "b", "c"]
    with pytest.raises(Unschedulable) as info:
        schedule([grouped("db-%d" % index) for index in range(4)], pools)
    assert info.value.message == \
        "0/3 pools available for db-3: 3 server group db (anti-affinity) has a member there"


def test_members_already_on_the_pools_count():
    pools = [pool("a", server_groups={"db-0": {"name": "db", "policy": "anti-affinity"}}, machines=["db-0"]),
             pool("b")]
    assert placed([grouped("db-1")], pools) == ["b"]
    # a member of another group does not count
    pools[0]["server_groups"] = {"db-0": {"name": "other", "policy": "anti-affinity"}}
    assert sorted(placed([grouped("db-1"), grouped("db-2")], pools)) == ["a", "b"]


def test_affinity_keeps_members_together():
    pools = [pool("a"), pool("b"), pool("c")]
    where = placed([grouped("web-%d" % index, "affinity") for index in range(4)], pools)
    assert len(set(where)) == 1
    pools = [pool("a", cpu=1), pool("b", server_groups={"web-0": {"name": "db", "policy": "affinity"}})]
    assert placed([grouped("web-1", "affinity")], pools) == ["b"]
    # the pool with the members is full: refused, never put elsewhere
    full = [pool("a"), pool("b", cpu=0, server_groups={"web-0": {"name": "db", "policy": "affinity"}})]
    with pytest.raises(Unschedulable) as info:
        schedule([grouped("web-1", "affinity")], full)
    assert info.value.message == ("0/2 pools available for web-1: 1 server group db (affinity) has its members on b, "
                                  "1 insufficient cpu")


def test_soft_rules_are_preferences():
    pools = [pool("a"), pool("b")]
    # soft anti-affinity spreads even under binpack, then doubles up rather than refuse
    where = placed([grouped("s-%d" % index, "soft-anti-affinity") for index in range(4)], pools, strategy="binpack")
    assert sorted(where[:2]) == ["a", "b"] and sorted(where) == ["a", "a", "b", "b"]
    # soft affinity packs even under spread, and goes elsewhere when the pool is full
    small = [pool("a", cpu=2), pool("b", cpu=2)]
    where = placed([grouped("t-%d" % index, "soft-affinity") for index in range(3)], small)
    assert where[0] == where[1] != where[2]


def test_server_group_is_validated():
    for bad, field in (({"name": "db"}, "policy"), ({"name": "Db!", "policy": "affinity"}, "name"),
                       ({"name": "db", "policy": "together"}, "policy")):
        with pytest.raises(ValidationError) as info:
            validated([spec("m", server_group=bad)])
        assert field in str(info.value.field) + info.value.message, (bad, info.value)


def test_admission_rechecks_the_hard_rules():
    group = {"name": "db", "policy": "anti-affinity"}
    others = [("db-0", {"name": "db", "policy": "anti-affinity"}), ("web-0", None), ("x", {"name": "x", "policy": "affinity"})]
    assert rules.admission_refusal(group, "pool1", others) == \
        "server group db (anti-affinity): pool pool1 already has member db-0"
    assert rules.admission_refusal(group, "pool1", others[1:]) is None
    # the soft rules are no rules; affinity needs the members on the peer pools (None: not looked at)
    for policy in ("affinity", "soft-anti-affinity", "soft-affinity"):
        assert rules.admission_refusal(dict(group, policy=policy), "pool1", others) is None
    assert rules.admission_refusal(None, "pool1", others) is None
    together = {"name": "web", "policy": "affinity"}
    assert rules.admission_refusal(together, "pool1", others, [("pool2", "web-0")]) == \
        "server group web (affinity): its members are on pool2 (web-0), not on pool pool1"
    assert rules.admission_refusal(together, "pool1", others, []) is None  # the first member goes anywhere
    assert rules.admission_refusal(together, "pool1", others + [("web-1", together)], [("pool2", "web-0")]) is None


# --- topology spread -------------------------------------------------------------------------------------------

def zoned(name, zone, **given):
    return pool(name, labels={"zone": zone} if zone else {}, **given)


def test_topology_spread_refuses_beyond_max_skew():
    pools = [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b")]
    zone = [{"topology_key": "zone", "max_skew": 1}]
    where = placed([spec("m%d" % index) for index in range(4)], pools, topology_spread=zone)
    by_zone = [("a" if name.startswith("a") else "b") for name in where]
    assert sorted(by_zone) == ["a", "a", "b", "b"]
    # zone b has no room: a second machine in zone a would make skew 2 (its domain still counts, empty)
    full = [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b", cpu=0)]
    result = schedule([spec("m%d" % index) for index in range(2)], full, topology_spread=zone, strict=False)
    assert [p["pool"] is None for p in result] == [False, True]
    assert result[1]["reason"] == ("0/3 pools available for m1: 2 topology spread on zone would exceed max_skew 1, "
                                   "1 insufficient cpu")
    assert [p["pool"] is None for p in schedule([spec("m0"), spec("m1")], full, strict=False,
                                                topology_spread=[dict(zone[0], max_skew=2)])] == [False, False]


def test_topology_spread_counts_the_batch_machines_already_placed_and_only_those():
    pools = [zoned("a1", "a", machines=["m0", "other"]), zoned("b1", "b", machines=["other-2", "other-3"])]
    zone = [{"topology_key": "zone"}]
    # m0 (of the batch) is in zone a; the others are not counted
    assert placed([spec("m0"), spec("m1")], pools, topology_spread=zone, strategy="binpack") == ["a1", "b1"]
    assert [p["pool"] for p in scheduler.schedule(validated([spec("m1")]), pools, "binpack", topology_spread=zone,
                                                  spread_members=["m0", "m1"])] == ["b1"]


def test_topology_spread_pools_without_the_key():
    pools = [zoned("a1", "a"), zoned("none", None)]
    with pytest.raises(Unschedulable) as info:
        schedule([spec("m0"), spec("m1")], pools[1:], topology_spread=[{"topology_key": "zone"}])
    assert "2 topology spread on zone: pool has no such label" not in info.value.message
    assert info.value.message.startswith("0/1 pools available for m0: 1 topology spread on zone: pool has no such label")
    # schedule_anyway never refuses: a pool without the label ranks after those with it, and takes what they cannot
    anyway = [{"topology_key": "zone", "when_unsatisfiable": "schedule_anyway"}]
    assert placed([spec("m0"), spec("m1")], pools, topology_spread=anyway) == ["a1", "a1"]
    assert placed([spec("m0"), spec("m1")], [zoned("a1", "a", cpu=1), pools[1]], topology_spread=anyway) == ["a1", "none"]


def test_topology_spread_soft_prefers_least_skew_over_the_strategy():
    pools = [zoned("a1", "a"), zoned("b1", "b", used_cpu=6, used_memory=12)]
    anyway = [{"topology_key": "zone", "when_unsatisfiable": "schedule_anyway"}]
    assert placed([spec("m0"), spec("m1")], pools) == ["a1", "a1"]
    assert sorted(placed([spec("m0"), spec("m1")], pools, topology_spread=anyway)) == ["a1", "b1"]


@pytest.mark.parametrize("bad, field", [
    ([{"max_skew": 1}], "topology_spread[0].topology_key"),
    ([{"topology_key": "zone", "max_skew": 0}], "topology_spread[0].max_skew"),
    ([{"topology_key": "zone", "when_unsatisfiable": "never"}], "topology_spread[0].when_unsatisfiable"),
    ([{"topology_key": "zone", "skew": 1}], "topology_spread[0]"),
    ({"topology_key": "zone"}, "topology_spread"),
])
def test_topology_spread_is_validated(bad, field):
    with pytest.raises(ValidationError) as info:
        schedule([spec("m")], [pool("a")], topology_spread=bad)
    assert info.value.field == field


def test_storage_counts_the_local_images_the_caller_read(tmp_path):
    image = tmp_path / "disk.qcow2"
    # a qcow2 header: magic, version, ..., the virtual size at offset 24
    image.write_bytes(b"QFI\xfb" + b"\0\0\0\3" + b"\0" * 16 + (8 * GI).to_bytes(8, "big"))
    specs = validated([spec("m", image=str(image)), spec("n", image=str(image), root_size="20Gi"),
                       spec("v", image="https://example.org/x.qcow2", image_checksum="0" * 64,
                            volumes=[{"name": "copy", "image": str(image)}, {"name": "big", "size": "1Gi"}])])
    sizes = machine_spec.local_image_sizes(specs)
    assert sizes == {str(image): 8 * GI}
    assert [scheduler.machine_request(prm, "m", sizes)["storage"] for prm in specs] == [8 * GI, 20 * GI, 9 * GI]
    # the root disk is as large as the image: a pool with 5Gi free cannot take it
    with pytest.raises(Unschedulable, match=r"\(a: storage 5Gi free, needs 8Gi\)"):
        scheduler.schedule(specs[:1], [stored(pool("a"), free=5)], image_sizes=sizes)
    assert machine_spec.local_image_sizes(validated([spec("m", image="published-name"),
                                                     spec("n", image=str(tmp_path / "missing.qcow2"))])) == {}


def test_class_count_is_how_many_of_a_class_fit():
    from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import class_count
    small = {"cpu": 1, "memory": 512 * 2 ** 20}
    assert class_count({"cpu": 32, "memory": 16 * 2 ** 30}, small) == 32
    assert class_count({"cpu": 32, "memory": 2 * 2 ** 30}, small) == 4  # memory bounds it
    assert class_count({"cpu": -1, "memory": 2 * 2 ** 30}, small) == 0  # overcommitted: none, never negative
    assert class_count({"cpu": 4, "memory": 2 ** 30}, {"cpu": 0, "memory": 0}) == 0
