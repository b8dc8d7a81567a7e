"""machine_pool: check-mode → register → idempotent → modify with diff → unregister → unregister again."""

import json

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks

from conftest import NS, assert_failed, register, run_module


@pytest.fixture(scope="module", autouse=True)
def third_pool_given_back(pools):
    """This file unregisters, re-registers, labels and taints the lab's third pool. It gives it back as the
    session's ``registered`` fixture leaves every pool (registered afresh, class small published, no label, no
    taint), so that the files after it find the same pools whichever ran before them (on two labs at once the
    order of files differs)."""
    yield
    pool = pools[2]
    gone = run_module("machine_pool", uri=pool.uri, name=pool.name, state="absent", force=True)
    assert not gone.get("failed"), gone
    register(pool)
    status = run_module("machine_pool_info", uri=pool.uri)["pools"][0]
    assert (status["labels"], status["taints"]) == ({}, []), status


def storage_pool_names(pool):
    return sorted(p.name() for p in pool.conn.listAllStoragePools(0))


def test_pool_lifecycle(pools, module):
    pool = pools[2]
    module("machine_pool", uri=pool.uri, name=pool.name, state="absent", force=True)
    before = storage_pool_names(pool)

    result = module("machine_pool", check=True, uri=pool.uri, name=pool.name, labels={"zone": "c"},
                    networks=[{"name": "machinery"}])
    assert result["changed"] is True
    assert storage_pool_names(pool) == before
    assert "machinery-registry" not in before or not pool.conn.storagePoolLookupByName(
        "machinery-registry").listVolumes()

    result = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                    networks=[{"name": "machinery"}])
    assert result["changed"] is True, result
    status = result["pool"]
    assert status["state"] == "Ready"
    assert status["virt_type"] in ("kvm", "qemu")
    assert status["capacity"]["cpu"] >= 1
    managed = [dom for dom in pool.conn.listAllDomains(0) if NS in dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)]
    assert status["machine_count"] == len(managed)
    registry = pool.conn.storagePoolLookupByName("machinery-registry")
    stored = [name for name in registry.listVolumes() if name.startswith("pool.")]
    assert len(stored) == 1
    document = json.loads(pool.download(stored[0], "machinery-registry"))
    assert document["body"]["labels"] == {"zone": "c"}
    assert document["body"]["virt_type"] == status["virt_type"]

    again = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                   networks=[{"name": "machinery"}])
    assert again["changed"] is False, again

    changed = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "d"},
                     networks=[{"name": "machinery"}])
    assert changed["changed"] is True
    assert changed["diff"]["before"]["labels"] == {"zone": "c"}
    assert changed["diff"]["after"]["labels"] == {"zone": "d"}
    assert changed["pool"]["labels"] == {"zone": "d"}
    # the new generation replaced the old one: exactly one readable document
    assert len([n for n in registry.listVolumes() if n.startswith("pool.")]) == 1

    gone = module("machine_pool", uri=pool.uri, name=pool.name, state="absent")
    assert gone["changed"] is True
    # the registration is gone, and so is the registry storage pool that held it (issue 10: it was left empty)
    assert "machinery-registry" not in storage_pool_names(pool)
    assert module("machine_pool", uri=pool.uri, name=pool.name, state="absent")["changed"] is False


def test_options_left_out_keep_the_registered_values(pools, module):
    """Issue 23: re-registering a pool without overcommit reset its ratios and taints."""
    pool = pools[2]
    module("machine_pool", uri=pool.uri, name=pool.name, state="absent", force=True)
    tuned = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                   taints=[{"key": "gpu", "value": "yes"}], overcommit={"cpu": 4.0}, reserved={"memory": "64Mi"},
                   networks=[{"name": "machinery"}])
    assert tuned["pool"]["overcommit"] == {"cpu": 4.0, "memory": 1.0, "storage": 1.0}, tuned
    registry = pool.conn.storagePoolLookupByName("machinery-registry")
    stored = [name for name in registry.listVolumes() if name.startswith("pool.")]
    document = json.loads(pool.download(stored[0], "machinery-registry"))["body"]

    again = module("machine_pool", uri=pool.uri, name=pool.name)
    assert again["changed"] is False, again
    status = again["pool"]
    assert status["overcommit"]["cpu"] == 4.0 and status["reserved"]["memory"] == "64Mi"
    assert status["taints"] == [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]
    assert status["labels"] == {"zone": "c"} and status["networks"] == ["machinery"]
    stored = [name for name in registry.listVolumes() if name.startswith("pool.")]
    assert json.loads(pool.download(stored[0], "machinery-registry"))["body"] == document

    # a sub-option given sets that one alone; a list given replaces the registered one
    changed = module("machine_pool", uri=pool.uri, name=pool.name, overcommit={"memory": 2.0}, taints=[])
    assert changed["pool"]["overcommit"] == {"cpu": 4.0, "memory": 2.0, "storage": 1.0}
    assert changed["pool"]["taints"] == [] and changed["pool"]["labels"] == {"zone": "c"}

    module("machine_class", uri=pool.uri, name="keep", cpu=2, memory="256Mi")
    kept = module("machine_class", uri=pool.uri, name="keep")
    assert kept["changed"] is False and kept["machine_class"] == {"name": "keep", "cpu": 2, "memory": "256Mi"}
    module("machine_pool", uri=pool.uri, name=pool.name, state="absent", force=True)


def test_cut_off_registry_write_falls_back(pools, module):
    pool = pools[2]
    assert not module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                      networks=[{"name": "machinery"}]).get("failed")
    registry = pool.conn.storagePoolLookupByName("machinery-registry")
    current = [n for n in registry.listVolumes() if n.startswith("pool.")][0]
    generation = int(current.split(".")[1])
    # a write that died midway: the next generation exists but holds half a document
    broken = registry.createXML("<volume><name>pool.%d.json</name><capacity>20</capacity><target>"
                                "<format type='raw'/></target></volume>" % (generation + 1), 0)
    stream = pool.conn.newStream(0)
    broken.upload(stream, 0, 20, 0)
    stream.send(b'{"key": "pool", "gen')
    stream.finish()
    result = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                    networks=[{"name": "machinery"}])
    # the previous generation is still read (nothing to register again); the dead write's volume is deleted
    assert result["actions"] == ["prune_registration"], "the previous generation must still be read: %s" % result
    assert result["pool"]["labels"] == {"zone": "c"}
    registry.refresh(0)
    assert [n for n in registry.listVolumes() if n.startswith("pool.")] == [current]
    again = module("machine_pool", uri=pool.uri, name=pool.name, labels={"zone": "c"},
                   networks=[{"name": "machinery"}])
    assert again["changed"] is False, again


def test_registry_writes_do_not_wait_for_the_admission_lock(pools, module):
    """A document commits by its exclusive copy, not under the host's admission lock: a registration written while
    another run holds that lock (a long create, say) is made at once, as one new generation, and leaves no staged
    volume behind."""
    pool = pools[2]
    args = dict(uri=pool.uri, name=pool.name, networks=[{"name": "machinery"}])
    assert not module("machine_pool", labels={"zone": "c"}, **args).get("failed")
    registry = pool.conn.storagePoolLookupByName("machinery-registry")
    before = sorted(n for n in registry.listVolumes() if n.startswith("pool."))
    lock = locks.admission_lock(pool.conn, registry).acquire()  # this test's process holds it, alive
    try:
        held = lock.marker
        changed = module("machine_pool", labels={"zone": "f"}, **args)
        registry.refresh(0)
        assert lock.still_held() and held in registry.listVolumes()  # held all the while the write was made
    finally:
        lock.release()
    assert changed["changed"] is True and changed["pool"]["labels"] == {"zone": "f"}, changed
    registry.refresh(0)
    names = registry.listVolumes()
    after = [n for n in names if n.startswith("pool.")]
    assert len(after) == 1 and after[0] not in before
    assert not [n for n in names if n.startswith("stage.")]
    assert module("machine_pool", labels={"zone": "c"}, **args)["changed"] is True


def test_pool_bad_input(pools, module):
    pool = pools[2]
    before = storage_pool_names(pool)
    assert_failed(module("machine_pool", uri="qemu+unix:///system?socket=/nonexistent/sock", name="x"), "uri",
                  "cannot connect")
    assert_failed(module("machine_pool", uri="not a uri", name="x"), "uri")
    assert_failed(module("machine_pool", uri=pool.uri, name="Bad_Name"), "name", "DNS-1123")
    assert_failed(module("machine_pool", uri=pool.uri, name=pool.name, storage_path="relative/path"),
                  "storage_path")
    assert_failed(module("machine_pool", uri=pool.uri, name=pool.name, reserved={"cpu": 4096}), "reserved")
    assert_failed(module("machine_pool", uri=pool.uri, name=pool.name, networks=[{"name": "nope"}]), "networks",
                  "does not exist")
    assert storage_pool_names(pool) == before
    try:
        pool.conn.networkLookupByName("nope")
        raise AssertionError("network nope must not exist")
    except libvirt.libvirtError:
        pass
