"""Placement rules against real pools: server groups (hard anti-affinity and affinity) and storage in the
scheduler. Every placement is checked from libvirt itself; every machine made here is deleted again."""

import pytest


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


PREFIX = "place-"


def machines(image, names, **extra):
    return [dict({"name": name, "machine_class": "small", "image": image, "network_interfaces": [],
                  "state": "present"}, **extra) for name in names]


def where(pools, names):
    """{machine: [pools where libvirt has a domain of that name]}."""
    return {name: [pool.name for pool in pools if pool.domain(name) is not None] for name in names}


def ours(pools):
    return sorted(name for pool in pools for name in pool.domain_names() if name.startswith(PREFIX))


@pytest.fixture
def fleet(registered, module):
    """The lab's pools, with no machine of this file's before or after the test."""
    def clean():
        names = ours(registered)
        if names:
            result = module("machine_batch", pools=[p.uri for p in registered],
                            machines=[{"name": name, "state": "absent"} for name in names])
            assert not result.get("failed"), result
        assert ours(registered) == []
    clean()
    yield registered
    clean()


def test_hard_anti_affinity_one_per_pool_then_refused(fleet, module, image):
    pools = fleet
    uris = [p.uri for p in pools]
    group = {"name": "place-db", "policy": "anti-affinity"}
    names = ["%sdb-%d" % (PREFIX, index) for index in range(len(pools))]
    made = module("machine_batch", pools=uris, machines=machines(image, names, server_group=group))
    assert not made.get("failed"), made
    found = where(pools, names)
    assert sorted(pool for places in found.values() for pool in places) == sorted(p.name for p in pools), found
    # the group is in each machine's record: the batch's return and a listing show it
    assert {m["name"]: m["server_group"] for m in made["machines"]} == {name: group for name in names}
    listed = module("machine_info", uri=pools[0].uri, name=[n for n in names if found[n] == [pools[0].name]])
    assert [m["server_group"] for m in listed["machines"]] == [group]

    extra = "%sdb-%d" % (PREFIX, len(pools))
    before = {pool.name: pool.domain_names() for pool in pools}
    refused = module("machine_batch", pools=uris, machines=machines(image, [extra], server_group=group))
    assert refused.get("failed"), refused
    assert refused["failures"][0]["reason"] == "Unschedulable", refused
    assert "server group place-db (anti-affinity) has a member there" in refused["failures"][0]["msg"], refused
    assert where(pools, [extra]) == {extra: []}
    assert {pool.name: pool.domain_names() for pool in pools} == before

    # a group is fixed at creation: a member cannot change it
    moved = module("machine_batch", pools=uris,
                   machines=machines(image, names[:1], server_group={"name": "place-db", "policy": "affinity"}))
    assert moved.get("failed"), moved
    assert "server group of an existing machine is fixed at creation" in moved["msg"], moved


def test_affinity_puts_members_together(fleet, module, image):
    pools = fleet
    uris = [p.uri for p in pools]
    group = {"name": "place-web", "policy": "affinity"}
    first = ["%sweb-0" % PREFIX, "%sweb-1" % PREFIX]
    made = module("machine_batch", pools=uris, machines=machines(image, first, server_group=group))
    assert not made.get("failed"), made
    found = where(pools, first)
    assert len(found[first[0]]) == 1 and found[first[0]] == found[first[1]], found
    # a later run counts the members already placed: spread alone would pick an emptier pool
    late = "%sweb-2" % PREFIX
    again = module("machine_batch", pools=uris, machines=machines(image, [late], server_group=group))
    assert not again.get("failed"), again
    assert where(pools, [late]) == {late: found[first[0]]}


def test_storage_too_big_for_every_pool_is_refused_by_the_scheduler(fleet, module, image):
    pools = fleet
    name = "%sbig" % PREFIX
    before = {pool.name: pool.domain_names() for pool in pools}
    refused = module("machine_batch", pools=[p.uri for p in pools],
                     machines=machines(image, [name], root_size="1Pi"))
    assert refused.get("failed"), refused
    failure = refused["failures"][0]
    assert failure["reason"] == "Unschedulable", failure
    head = "0/%d pools available for %s: %d insufficient storage (" % (len(pools), name, len(pools))
    assert failure["msg"].startswith(head), failure
    for pool in pools:
        assert "%s: storage " % pool.name in failure["msg"] and "needs 1Pi" in failure["msg"], failure
    assert {pool.name: pool.domain_names() for pool in pools} == before
    # a root disk that fits is placed (check mode: nothing is made)
    placed = module("machine_batch", check=True, pools=[p.uri for p in pools],
                    machines=machines(image, [name], root_size="1Gi"))
    assert not placed.get("failed"), placed
    assert placed["placements"][0]["pool"] in [p.name for p in pools]
    assert {pool.name: pool.domain_names() for pool in pools} == before


def test_topology_spread_over_a_pool_label(fleet, module, image):
    pools = fleet
    zones = {pools[0].name: "a", pools[1].name: "a", pools[2].name: "b"}
    try:
        for pool in pools:
            labelled = module("machine_pool", uri=pool.uri, name=pool.name, labels={"place-zone": zones[pool.name]})
            assert not labelled.get("failed"), labelled
        names = ["%sspread-%d" % (PREFIX, index) for index in range(2)]
        # binpack alone puts both on one pool; the spread puts one in each zone, so one on the only pool of zone b
        made = module("machine_batch", pools=[p.uri for p in pools], machines=machines(image, names), strategy="binpack",
                      topology_spread=[{"topology_key": "place-zone", "max_skew": 1}])
        assert not made.get("failed"), made
        found = where(pools, names)
        assert sorted(zones[places[0]] for places in found.values()) == ["a", "b"], found
    finally:
        for pool in pools:
            restored = module("machine_pool", uri=pool.uri, name=pool.name, labels={})
            assert not restored.get("failed"), restored


def test_the_pool_refuses_a_second_anti_affinity_member(fleet, module, image):
    """The machine module is given its pool (no scheduler): the pool's own room check keeps the rule."""
    pool = fleet[0]
    group = {"name": "place-solo", "policy": "anti-affinity"}
    first, second = "%ssolo-0" % PREFIX, "%ssolo-1" % PREFIX
    made = module("machine", uri=pool.uri, name=first, machine_class="small", image=image, network_interfaces=[],
                  state="present", server_group=group)
    assert made["changed"] is True and made["machine"]["server_group"] == group, made
    refused = module("machine", uri=pool.uri, name=second, machine_class="small", image=image,
                     network_interfaces=[], state="present", server_group=group)
    assert refused.get("failed") and refused.get("field") == "server_group", refused
    assert "server group place-solo (anti-affinity): pool %s already has member %s" % (pool.name, first) \
        in refused["msg"], refused
    assert pool.domain(second) is None
    # another group, or none, is no member
    other = module("machine", uri=pool.uri, name=second, machine_class="small", image=image, network_interfaces=[],
                   state="present", server_group={"name": "place-other", "policy": "anti-affinity"})
    assert other["changed"] is True, other
    assert pool.domain(second) is not None


def test_admission_refuses_an_affinity_member_away_from_the_others(fleet, module, image):
    """Given its pool, the machine module plans without the scheduler; under the admission locks of its pool and
    of the pools in unique_across it finds the group's members elsewhere and refuses."""
    here, there = fleet[0], fleet[1]
    group = {"name": "place-pair", "policy": "affinity"}
    first, second = "%spair-0" % PREFIX, "%spair-1" % PREFIX
    made = module("machine", uri=there.uri, name=first, machine_class="small", image=image, network_interfaces=[],
                  state="present", server_group=group)
    assert made["changed"] is True, made
    refused = module("machine", uri=here.uri, name=second, machine_class="small", image=image, network_interfaces=[],
                     state="present", server_group=group, unique_across=[there.uri])
    assert refused.get("failed") and refused.get("field") == "server_group", refused
    expected = "server group place-pair (affinity): its members are on %s (%s), not on pool %s" % (
        there.uri, first, here.name)
    assert expected in refused["msg"], refused
    assert here.domain(second) is None
    joined = module("machine", uri=there.uri, name=second, machine_class="small", image=image, network_interfaces=[],
                    state="present", server_group=group, unique_across=[here.uri])
    assert joined["changed"] is True, joined
    assert there.domain(second) is not None
