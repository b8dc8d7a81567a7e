"""machine_image from_machine: a busybox guest captured as a published image, proven by bytes written inside it.

The guest writes a marker at a fixed offset of its root disk (past the image's own bytes); the capture seals and
stops it (generalize, through its agent), copies its root flat, publishes it on both pools by checksum; a machine
built on the image on the other pool reads the marker back from its own root disk. Then the refusals (a running
machine, a missing snapshot), a capture of a snapshot that leaves the machine as it was, and the withdrawal.
"""

import hashlib

import pytest
from lxml import etree

from conftest import Pool, assert_failed, guest_agent, guest_shell, load_lab, register, run_module


SOURCE = "im-src"
COPY = "im-copy"
IMAGE = "im-golden"
SNAP_IMAGE = "im-snap"
MARKER = "MACHINERY-CAPTURE-MARKER"
# a MiB of the root disk past the test image's bytes: the guest writes the marker there, a copy reads it back
MARKER_MIB = 40
READ_MARKER = "dd if=/dev/vda bs=1M skip=%d count=1 2>/dev/null | head -c 64 | tr -d '\\000'" % MARKER_MIB


@pytest.fixture(scope="module")
def im_pools():
    lab = load_lab()
    pools = [Pool(entry["name"], entry["uri"]) for entry in lab["pools"][:2]]
    if len(pools) < 2:
        pytest.skip("the capture test publishes on two pools")
    for pool in pools:
        register(pool)
    clean(pools)
    yield pools
    clean(pools)


def clean(pools):
    for pool in pools:
        for name in (SOURCE, COPY, "im-full", "im-linked", "im-placed"):
            if pool.domain(name) is not None:
                run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)
        for name in (IMAGE, SNAP_IMAGE):
            run_module("machine_image", uri=pool.uri, name=name, state="absent", force=True)


def machine(pool, name, state="running", **extra):
    result = run_module("machine", uri=pool.uri, name=name, machine_class="small", state=state,
                        network_interfaces=[], shutdown_timeout=10, wait="running", **extra)
    assert not result.get("failed"), result
    return result


def agent_of(pool, name):
    """The guest agent of ``name``, once it answers after a boot."""
    return guest_agent(pool, name)


shell = guest_shell


def image_volumes(pool):
    return [name for name in pool.volumes() if name.startswith("image-") or name.startswith("capture-")]


def test_capture_generalize_publish_and_boot_a_copy(im_pools):
    first, second = im_pools
    machine(first, SOURCE, image=load_lab()["image"], root_size="64Mi")
    agent = agent_of(first, SOURCE)
    shell(agent, "printf %s | dd of=/dev/vda bs=1M seek=%d conv=fsync 2>/dev/null; sync" % (MARKER, MARKER_MIB))
    assert MARKER in shell(agent, READ_MARKER)
    args = dict(pools=[first.uri, second.uri], name=IMAGE, from_machine={"uri": first.uri, "machine": SOURCE})
    before = [image_volumes(pool) for pool in im_pools]

    # a running machine is refused unless it is sealed; nothing is made
    refused = run_module("machine_image", **args)
    assert_failed(refused, "from_machine.machine", "is running")
    assert [image_volumes(pool) for pool in im_pools] == before
    assert first.domain(SOURCE).isActive()

    planned = run_module("machine_image", check=True, generalize=True, **args)
    assert planned["changed"], planned
    assert planned["actions"] == ["generalize", "capture", "publish", "copy", "publish"], planned
    assert planned["image"]["generalized"] is True and planned["image"]["checksum"] is None, planned
    assert [image_volumes(pool) for pool in im_pools] == before
    assert first.domain(SOURCE).isActive()
    assert run_module("machine_image", uri=first.uri, name=IMAGE, check=True, state="absent")["changed"] is False

    captured = run_module("machine_image", generalize=True, **args)
    assert captured["changed"] and not captured.get("failed"), captured
    assert captured["image"]["pools"] == [first.name, second.name], captured
    assert captured["image"]["source"] == "machine:%s/%s" % (first.name, SOURCE)
    assert not first.domain(SOURCE).isActive()  # sealed and stopped
    checksum = captured["image"]["checksum"]
    volume = "image-%s.qcow2" % checksum[:32]
    for pool in im_pools:  # the same bits on both pools, under their checksum, and no scratch copy left
        assert volume in pool.volumes() and volume + ".complete" in pool.volumes()
        assert hashlib.sha256(pool.download(volume)).hexdigest() == checksum
        assert [name for name in pool.volumes() if name.startswith("capture-")] == []
    header = first.download(volume)[:4]
    assert header == b"QFI\xfb"  # qcow2, and flat: the copy names no backing file
    again = run_module("machine_image", generalize=True, **args)
    assert again["changed"] is False and again["actions"] == [], again

    # a machine made from the image on the other pool reads the marker from its own root disk
    machine(second, COPY, image=IMAGE)
    assert MARKER in shell(agent_of(second, COPY), READ_MARKER)


def test_capture_refusals_and_a_snapshot(im_pools):
    first = im_pools[0]
    if first.domain(SOURCE) is None:
        machine(first, SOURCE, state="stopped", image=load_lab()["image"], root_size="64Mi")
    missing = run_module("machine_image", uri=first.uri, name=SNAP_IMAGE,
                         from_machine={"machine": SOURCE, "snapshot": "nope"})
    assert_failed(missing, "from_machine.snapshot", "no snapshot nope")
    nobody = run_module("machine_image", uri=first.uri, name=SNAP_IMAGE, from_machine={"machine": "im-nobody"})
    assert_failed(nobody, "from_machine.machine", "no machine im-nobody")
    sealed_stopped = run_module("machine_image", uri=first.uri, name=SNAP_IMAGE, generalize=True,
                                from_machine={"machine": SOURCE})
    assert_failed(sealed_stopped, "generalize", "it is stopped")
    assert run_module("machine_image", uri=first.uri, name=SNAP_IMAGE, check=True, state="absent")["changed"] is False

    taken = run_module("machine_snapshot", uri=first.uri, machine=SOURCE, name="s1")
    assert not taken.get("failed"), taken
    xml_before = first.domain(SOURCE).XMLDesc(2)
    captured = run_module("machine_image", uri=first.uri, name=SNAP_IMAGE,
                          from_machine={"machine": SOURCE, "snapshot": "s1"})
    assert captured["changed"] and captured["actions"] == ["capture", "publish"], captured
    assert captured["image"]["source"] == "machine:%s/%s@s1" % (first.name, SOURCE)
    dom = first.domain(SOURCE)
    assert sorted(dom.snapshotListNames(0)) == ["s1"] and not dom.isActive()
    assert dom.XMLDesc(2) == xml_before
    withdrawn = run_module("machine_image", uri=first.uri, name=SNAP_IMAGE, state="absent")
    assert withdrawn["changed"], withdrawn
    assert run_module("machine_image", uri=first.uri, name=SNAP_IMAGE, state="absent")["changed"] is False


def root_backing(pool, machine):
    """The backing file of a machine's root volume, as libvirt reads it (None for a flat one)."""
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    xml = storage.storageVolLookupByName("%s-root.qcow2" % machine).XMLDesc(0)

    return etree.fromstring(xml).findtext("backingStore/path")


def test_full_and_linked_clones(im_pools):
    first, second = im_pools
    if first.domain(SOURCE) is None:
        pytest.skip("needs the machine the capture test made")
    source = first.domain(SOURCE)
    if source.isActive():
        run_module("machine", uri=first.uri, name=SOURCE, state="stopped", shutdown_timeout=10)
    full = dict(clone_from={"machine": SOURCE, "mode": "full"})
    planned = run_module("machine", check=True, uri=first.uri, name="im-full", machine_class="small",
                         network_interfaces=[], **full)
    assert planned["changed"] and not planned.get("failed"), planned
    assert first.domain("im-full") is None and "im-full-root.qcow2" not in first.volumes()
    both = run_module("machine", uri=first.uri, name="im-full", machine_class="small", image=IMAGE, **full)
    assert_failed(both, "clone_from", "give image or clone_from")
    assert first.domain("im-full") is None

    machine(first, "im-full", **full)
    assert root_backing(first, "im-full") is None  # flat: nothing shared with the source
    assert MARKER in shell(agent_of(first, "im-full"), READ_MARKER)
    clone_dom = first.domain("im-full")
    assert clone_dom.UUIDString() != source.UUIDString()
    assert run_module("machine", uri=first.uri, name="im-full", machine_class="small", network_interfaces=[],
                      **full)["changed"] is False

    # linked, onto the other pool: the base is captured into that pool's cache and the root is an overlay on it
    linked = dict(clone_from={"uri": first.uri, "machine": SOURCE, "mode": "linked"})
    made = machine(second, "im-linked", **linked)
    base = root_backing(second, "im-linked")
    assert base is not None and base.rsplit("/", 1)[-1].startswith("image-"), base
    assert MARKER in shell(agent_of(second, "im-linked"), READ_MARKER)
    assert made["machine"]["image"].startswith("clone:%s/%s" % (first.name, SOURCE)), made["machine"]["image"]
    pruned = run_module("machine_pool", uri=second.uri, name=second.name, networks=[{"name": "machinery"}],
                        prune_images=True)
    assert not pruned.get("failed"), pruned
    assert base.rsplit("/", 1)[-1] in second.volumes()  # a base in use stays
    for pool, name in ((first, "im-full"), (second, "im-linked")):
        assert run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=0)["changed"]

    # a clone placed by the scheduler, as the machines role places machines: its disk goes where it lands
    batch = run_module("machine_batch", pools=[pool.uri for pool in im_pools], machines=[
        {"name": "im-placed", "machine_class": "small", "network_interfaces": [], "state": "present",
         "clone_from": {"uri": first.uri, "machine": SOURCE, "mode": "full"}}])
    assert not batch.get("failed"), batch
    (landed,) = [pool for pool in im_pools if pool.domain("im-placed") is not None]
    assert root_backing(landed, "im-placed") is None
    assert run_module("machine", uri=landed.uri, name="im-placed", state="absent", shutdown_timeout=0)["changed"]
