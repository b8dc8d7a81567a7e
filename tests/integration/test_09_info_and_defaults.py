"""machine_pool_info and machine_class_info (read-only, filters, empty lists, offline pools) and module_defaults
of the action group reaching every module of it in a real play."""

import os

import pytest

from conftest import OVERCOMMIT, REPO, assert_failed, lab_file, register, run_playbook, warnings_of


@pytest.fixture(name="image", scope="session")
def idle_guest_image(idle_image):
    """Nothing here looks inside a guest: its machines run the idle image (conftest.idle_image), at no CPU cost."""
    return idle_image


PLAYBOOK = os.path.join(REPO, "tests", "integration", "playbooks", "module_defaults.yml")
UNREACHABLE = "qemu+unix:///system?socket=/nonexistent/sock"
POOL_KEYS = {"name", "uri", "labels", "taints", "state", "problems", "virt_type", "capacity", "allocated",
             "allocatable", "storage", "available_machine_classes", "machine_count", "must_leave",
             "hypervisor", "overcommit", "reserved", "storage_path", "networks"}
CLASS_KEYS = {"name", "cpu", "memory", "pool", "uri", "allocatable"}


def footprint(pools):
    """What a read-only module must leave as it was: every pool's domains and registry documents."""
    return {pool.name: (pool.domain_names(), pool.volumes("machinery-registry")) for pool in pools}


def pool_named(result, name):
    found = [entry for entry in result["pools"] if entry["name"] == name]
    assert len(found) == 1, result
    return found[0]


def test_pool_info_lists_filters_and_never_changes(registered, module):
    pools = registered
    before = footprint(pools)
    uris = [pool.uri for pool in pools]
    listed = module("machine_pool_info", pools=uris)
    planned = module("machine_pool_info", check=True, pools=uris)
    assert listed["changed"] is False and planned["changed"] is False, listed
    assert [entry["name"] for entry in listed["pools"]] == [pool.name for pool in pools]
    assert [entry["name"] for entry in planned["pools"]] == [pool.name for pool in pools]
    assert footprint(pools) == before

    # the same shape and the same facts as machine_pool's own return
    own = module("machine_pool", check=True, uri=pools[0].uri, name=pools[0].name, networks=[{"name": "machinery"}],
                 overcommit=OVERCOMMIT)
    assert own["changed"] is False, own
    entry = pool_named(listed, pools[0].name)
    assert set(entry) == set(own["pool"]) == POOL_KEYS
    for key in ("name", "uri", "labels", "taints", "state", "virt_type", "machine_count", "hypervisor"):
        assert entry[key] == own["pool"][key], key
    assert entry["state"] == "Ready" and entry["problems"] == []
    assert "small" in [item["name"] for item in entry["available_machine_classes"]]

    labelled = pools[1]
    try:
        assert not register(labelled, labels={"suite": "info", "zone": "b"}).get("failed")
        by_label = module("machine_pool_info", pools=uris, labels={"suite": "info"})
        assert [entry["name"] for entry in by_label["pools"]] == [labelled.name]
        assert by_label["pools"][0]["labels"] == {"suite": "info", "zone": "b"}
        # every label must match
        assert module("machine_pool_info", pools=uris, labels={"suite": "info", "zone": "a"})["pools"] == []
        by_name = module("machine_pool_info", pools=[{"name": "given", "uri": uri} for uri in uris],
                         name=[labelled.name, pools[2].name])
        assert [entry["name"] for entry in by_name["pools"]] == [labelled.name, pools[2].name]
        nothing = module("machine_pool_info", pools=uris, name=["dflt-no-such-pool"])
        assert nothing["pools"] == [] and not nothing.get("failed"), nothing
    finally:
        register(labelled)


def test_pool_info_offline_and_unregistered_hosts(registered, module):
    pools = registered
    result = module("machine_pool_info", pools=[pools[0].uri, {"name": "gone", "uri": UNREACHABLE}])
    assert not result.get("failed"), result
    assert [entry["name"] for entry in result["pools"]] == [pools[0].name, "gone"]
    offline = result["pools"][1]
    assert set(offline) == POOL_KEYS
    assert offline["state"] == "Offline" and offline["uri"] == UNREACHABLE
    assert "/nonexistent/sock" in offline["problems"][0]
    assert offline["allocatable"] == {"cpu": 0, "memory": "0"} and offline["available_machine_classes"] == []
    assert any("gone" in text and "offline" in text for text in warnings_of(result)), result
    # a filter that names the offline pool keeps it; a label filter cannot match it
    assert [e["name"] for e in module("machine_pool_info", uri=UNREACHABLE, name=[UNREACHABLE])["pools"]] \
        == [UNREACHABLE]
    assert module("machine_pool_info", uri=UNREACHABLE, labels={"zone": "a"})["pools"] == []

    # a host that machine_pool never registered (or unregistered) is no pool: left out, no failure
    host = pools[2]
    assert not module("machine_pool", uri=host.uri, name=host.name, state="absent", force=True).get("failed")
    try:
        listed = module("machine_pool_info", pools=[pool.uri for pool in pools])
        assert [entry["name"] for entry in listed["pools"]] == [pools[0].name, pools[1].name], listed
        alone = module("machine_pool_info", uri=host.uri)
        assert alone["pools"] == [] and not alone.get("failed") and not warnings_of(alone), alone
        classes = module("machine_class_info", uri=host.uri)
        assert classes["machine_classes"] == [] and not classes.get("failed"), classes
    finally:
        register(host)


def test_class_info_lists_filters_and_counts_what_fits(registered, module, image):
    pools = registered
    first = pools[0]
    module("machine", uri=first.uri, name="dflt-big-1", state="absent", shutdown_timeout=2)
    module("machine_class", uri=first.uri, name="dflt-big", state="absent", force=True)
    try:
        assert module("machine_class", uri=first.uri, name="dflt-big", cpu=2, memory="256Mi")["changed"] is True
        before = footprint(pools)
        # pools in the order given, then classes by name
        backwards = [pool.uri for pool in reversed(pools)]
        listed = module("machine_class_info", pools=backwards)
        planned = module("machine_class_info", check=True, pools=backwards)
        assert listed["changed"] is False and planned["changed"] is False
        assert footprint(pools) == before
        assert [(c["pool"], c["name"]) for c in listed["machine_classes"]] == \
            [(pool.name, "small") for pool in reversed(pools[1:])] + [(first.name, "dflt-big"), (first.name, "small")]
        assert all(set(item) == CLASS_KEYS for item in listed["machine_classes"])
        assert [c["name"] for c in planned["machine_classes"]] == [c["name"] for c in listed["machine_classes"]]

        big = module("machine_class_info", pools=[pool.uri for pool in pools], name=["dflt-big"])["machine_classes"]
        assert len(big) == 1, big
        assert {key: big[0][key] for key in ("name", "cpu", "memory", "pool", "uri")} == \
            {"name": "dflt-big", "cpu": 2, "memory": "256Mi", "pool": first.name, "uri": first.uri}
        status = pool_named(module("machine_pool_info", uri=first.uri), first.name)
        assert big[0]["allocatable"] == [c for c in status["available_machine_classes"]
                                         if c["name"] == "dflt-big"][0]["allocatable"] > 0

        # one more machine of the class on the pool: one fewer fits
        made = module("machine", uri=first.uri, name="dflt-big-1", machine_class="dflt-big", image=image,
                      network_interfaces=[], state="present")
        assert made["changed"] is True, made
        after = module("machine_class_info", uri=first.uri, name=["dflt-big"])["machine_classes"]
        assert after[0]["allocatable"] == big[0]["allocatable"] - 1, (big, after)

        assert module("machine_class_info", pools=[pool.uri for pool in pools],
                      name=["dflt-no-such-class"])["machine_classes"] == []
        offline = module("machine_class_info", pools=[first.uri, UNREACHABLE], name=["dflt-big"])
        assert not offline.get("failed"), offline
        assert [c["pool"] for c in offline["machine_classes"]] == [first.name]
        assert any("offline" in text for text in warnings_of(offline)), offline
    finally:
        module("machine", uri=first.uri, name="dflt-big-1", state="absent", shutdown_timeout=2)
        module("machine_class", uri=first.uri, name="dflt-big", state="absent", force=True)
    assert first.domain("dflt-big-1") is None


def test_multi_pool_modules_need_pools_or_uri(registered, module):
    for name, extra in (("machine_pool_info", {}), ("machine_class_info", {}), ("machine_batch", {"machines": []})):
        assert_failed(module(name, **extra), "pools", "uri")
        assert_failed(module(name, pools=[{"name": "no-uri"}], **extra), "pools[0]", "uri")
        assert_failed(module(name, uri="not a uri", **extra), "uri")
    # pools win over uri (the group's module_defaults may set uri beside a task's pools)
    both = module("machine_pool_info", uri=UNREACHABLE, pools=[registered[0].uri])
    assert [entry["uri"] for entry in both["pools"]] == [registered[0].uri], both


def test_machine_info_reads_many_pools_into_one_table(registered, module, image):
    """machine_info takes pools as the other info modules do: read in parallel, one list and one table; a pool
    that cannot be read is a warning naming it, not a failure (with uri alone it stays a failure)."""
    pools = registered[:2]
    names = ["info-many-%d" % index for index in range(2)]
    for pool, name in zip(pools, names):
        module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    try:
        for pool, name in zip(pools, names):
            assert module("machine", uri=pool.uri, name=name, machine_class="small", image=image,
                          network_interfaces=[], state="present", labels={"info": "many"})["changed"] is True
        before = footprint(registered)
        listed = module("machine_info", pools=[pool.uri for pool in reversed(pools)], labels={"info": "many"})
        assert footprint(registered) == before and listed["changed"] is False
        assert [(m["name"], m["pool"], m["uri"]) for m in listed["machines"]] == \
            [(name, pool.name, pool.uri) for pool, name in zip(pools, names)]
        assert listed["table"][0].split()[:2] == ["NAME", "POOL"] and len(listed["table"]) == 3
        assert [line.split()[:2] for line in listed["table"][1:]] == [[name, pool.name] for pool, name in zip(pools, names)]
        assert not warnings_of(listed), listed

        offline = module("machine_info", pools=[pools[0].uri, UNREACHABLE], labels={"info": "many"})
        assert not offline.get("failed"), offline
        assert [m["name"] for m in offline["machines"]] == [names[0]]
        assert any(UNREACHABLE in text and "not read" in text for text in warnings_of(offline)), offline
        assert_failed(module("machine_info", uri=UNREACHABLE), "uri", UNREACHABLE)
    finally:
        for pool, name in zip(pools, names):
            module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    assert [pool.domain(name) for pool, name in zip(pools, names)] == [None, None]


def play(tmp_path, phase, run=1):
    return run_playbook(PLAYBOOK, tmp_path / ("vars-%s-%d.json" % (phase, run)),
                        {"lab_file": lab_file(), "dflt_phase": phase}, timeout=900)


def test_module_defaults_reach_every_module(registered, module, tmp_path):
    pools = registered
    names = ["dflt-vm1", "dflt-vm2", "dflt-vm3"]
    target, others = pools[0], pools[1:]

    def cleanup():
        for name in names:
            module("machine", uri=target.uri, name=name, state="absent", shutdown_timeout=2)
        module("machine_class", uri=target.uri, name="dflt-tiny", state="absent", force=True)

    cleanup()
    try:
        proc, recap = play(tmp_path, "create")
        assert recap["failed"] == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert recap["changed"] > 0
        assert "Unsupported parameters" not in proc.stdout
        # from libvirt itself: everything is on the pool module_defaults named, nothing elsewhere
        assert all(target.domain(name) is not None for name in names)
        assert all(pool.domain(name) is None for pool in others for name in names)
        xml = target.domain("dflt-vm1").XMLDesc(0)
        assert "dflt-vm1-data.qcow2" in xml and "<interface" in xml
        assert "dflt-vm1-data.qcow2" in target.volumes()
        published = module("machine_class_info", pools=[pool.uri for pool in pools], name=["dflt-tiny"])
        assert [c["pool"] for c in published["machine_classes"]] == [target.name]

        proc, recap = play(tmp_path, "create", run=2)
        assert recap["failed"] == 0, proc.stdout[-6000:]
        assert recap["changed"] == 0, proc.stdout[-6000:]

        proc, recap = play(tmp_path, "delete")
        assert recap["failed"] == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert all(target.domain(name) is None for name in names)
        assert not [volume for volume in target.volumes() if volume.startswith("dflt-")]
    finally:
        cleanup()
