"""Rebuilding a machine (issue 25): rebuild: true and a new image give a machine a new root disk, with the same name,
UUID, MACs and data volumes; without it the new image is refused; a rebuild that fails leaves the machine as it was,
running; a machine with snapshots is refused.

Every effect is checked from libvirt, and what the guest got from inside it: the busybox test image runs the
user-data script at each boot, and the script prints the instance id of the seed it was given (the console log
starts over at each start of the domain). The same on the real Debian image (cloud-init runs again in the new root,
a file written by hand on the old root is gone, the data volume's file is still there) is in test_12, on one of its
guests: a real guest's boot is the costliest thing in the suite.
"""

import json
import os
import re
import subprocess
import threading
import time
import xml.etree.ElementTree as ET

import libvirt
import pytest

from conftest import NS, first_pool, load_lab, run_module, served

NAME = "rb-web"
DATA = "rb-data"
SNAPPED = "rb-snapped"
OTHER = "rb-other"  # the name the second image is published under
DATA_MARK = b"MACHINERY-REBUILD-DATA-MARK\n"
SCRIPT = """#!/bin/sh
echo "REBUILD-IID $(sed -n 's/^instance-id: *//p' /mnt/cidata/meta-data)"
"""
BOOT_TIMEOUT = 300


def machine(pool, **extra):
    args = dict(uri=pool.uri, name=NAME, image=load_lab()["image"], machine_class="small",
                cloud_init={"user_data": SCRIPT}, volumes=[{"name": "data", "volume": DATA}], shutdown_timeout=30)
    args.update(extra)
    return run_module("machine", **args)


def clean(pool):
    for name in (NAME, SNAPPED):
        run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    run_module("volume", uri=pool.uri, name=DATA, state="absent", force=True)
    run_module("machine_image", uri=pool.uri, name=OTHER, state="absent", force=True)


def seen(pool):
    """What the tests compare from libvirt: the persistent XML, the running QEMU's id and the pool's volumes."""
    dom = pool.domain(NAME)
    return {"xml": dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), "id": dom.ID() if dom.isActive() else None,
            "volumes": pool.volumes()}


def record_of(dom):
    return json.loads(ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS,
                                                 libvirt.VIR_DOMAIN_AFFECT_CONFIG)).text)


def identity(dom):
    """(UUID, MACs, {disk target: source file}) of the persistent definition."""
    tree = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    macs = [node.get("address") for node in tree.findall("devices/interface/mac")]
    disks = {node.find("target").get("dev"): node.find("source").get("file") for node in tree.findall("devices/disk")}
    return dom.UUIDString(), macs, disks


def instance_id(pool, name=NAME):
    """The instance id the guest read from its seed at its last boot."""
    console = pool.wait_console(name, "MACHINERY-SCRIPT-END", timeout=BOOT_TIMEOUT)
    found = re.findall(r"^REBUILD-IID (\S+)", console, re.M)
    assert len(found) == 1, console[-3000:]
    return found[0]


def write_raw(pool, volume, data):
    vol = pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(volume)
    stream = pool.conn.newStream(0)
    vol.upload(stream, 0, len(data), 0)
    stream.send(data)
    stream.finish()


_EVENT_LOOP = []


def event_loop():
    """libvirt's default event loop, run by a thread of its own, once in the process (libvirt takes one)."""
    if not _EVENT_LOOP:
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()
        _EVENT_LOOP.append(threading.Thread(target=run, daemon=True))
        _EVENT_LOOP[0].start()


class Downtime:
    """The seconds from the domain's stop to its start again while a run rebuilds it, from libvirt's lifecycle
    events on a connection of its own (when libvirt says the QEMU process ended and when the next one started)."""

    def __init__(self, uri, name):
        event_loop()
        self.began = time.monotonic()
        self.ended = None
        self.conn = libvirt.open(uri)
        self.dom = self.conn.lookupByName(name)
        self.stopped_at = self.running_at = None
        self.started = threading.Event()
        self.callback = None

    def _event(self, _conn, _dom, event, _detail, _opaque):
        moment = time.monotonic()
        if event == libvirt.VIR_DOMAIN_EVENT_STOPPED and self.stopped_at is None:
            self.stopped_at = moment
        elif event == libvirt.VIR_DOMAIN_EVENT_STARTED and self.stopped_at is not None and self.running_at is None:
            self.running_at = moment
            self.started.set()

    def __enter__(self):
        self.callback = self.conn.domainEventRegisterAny(self.dom, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                         self._event, None)
        return self

    def __exit__(self, *_exc):
        self.ended = time.monotonic()
        if self.dom.isActive():
            self.started.wait(10)  # the event of the run's last moment may still be on its way
        self.conn.domainEventDeregisterAny(self.callback)
        self.conn.close()

    @property
    def ran(self):
        return self.ended - self.began

    @property
    def seconds(self):
        assert self.stopped_at is not None and self.running_at is not None, "the machine was not seen restarting"
        return self.running_at - self.stopped_at


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory):
    """A running busybox machine on the lab's first pool with a raw data volume holding a mark, and a second image
    (the same disk, compressed, so another file with another checksum) published on the pool as rb-other."""
    work = tmp_path_factory.mktemp("rebuild")
    other = str(work / "other.qcow2")
    subprocess.run(["qemu-img", "convert", "-c", "-O", "qcow2", load_lab()["image"], other], check=True, timeout=300)
    with first_pool(clean) as pool:
        made = run_module("volume", uri=pool.uri, name=DATA, size="1Mi", format="raw")
        assert not made.get("failed"), made
        write_raw(pool, DATA, DATA_MARK)
        published = run_module("machine_image", uri=pool.uri, name=OTHER, path=other)
        assert not published.get("failed"), published
        created = machine(pool)
        assert not created.get("failed"), created
        assert instance_id(pool) == "iid-%s" % NAME
        yield {"pool": pool, "work": work, "other": other}


def test_without_rebuild_a_new_image_is_refused_with_nothing_changed(rebuilt):
    pool = rebuilt["pool"]
    before = seen(pool)
    for check in (True, False):
        refused = machine(pool, check=check, image=OTHER)
        assert refused.get("failed") and refused["field"] == "image", refused
        assert "rebuild: true" in refused["msg"] and not refused.get("changed"), refused
        assert seen(pool) == before


def test_check_mode_plans_the_rebuild_and_writes_nothing(rebuilt):
    pool = rebuilt["pool"]
    before = seen(pool)
    planned = machine(pool, check=True, image=OTHER, rebuild=True)
    assert planned["changed"] is True and planned["actions"] == ["rebuild"], planned
    steps = [(step["action"], step["target"]) for step in planned["plan"][0]["steps"]]
    assert steps == [("cache_image", OTHER), ("shutdown", NAME), ("create_volume", NAME + ".r1-root.qcow2"),
                     ("write_volume", NAME + ".r1-cidata.iso"), ("define", NAME), ("start", NAME),
                     ("delete_volume", NAME + "-root.qcow2"), ("delete_volume", NAME + "-cidata.iso")]
    assert planned["diff"]["before"]["image"] == load_lab()["image"] and planned["diff"]["after"]["image"] == OTHER
    assert seen(pool) == before


def test_a_rebuild_whose_image_fails_its_checksum_changes_nothing(rebuilt):
    """The image is fetched before the machine is touched: a download that fails its checksum leaves it running,
    never stopped, and nothing new in the pool."""
    pool = rebuilt["pool"]
    before = seen(pool)
    with served(os.path.dirname(rebuilt["other"])) as base:
        failed = machine(pool, image=base + "/other.qcow2", image_checksum="ab" * 32, rebuild=True)
    assert failed.get("failed") and failed["field"] == "image_checksum", failed
    assert "checksum mismatch" in failed["msg"], failed
    assert seen(pool) == before


def test_a_rebuild_that_fails_after_the_shutdown_puts_the_machine_back_running(rebuilt):
    """Another domain holds the volume name the new seed would get: found after the shutdown and after the new
    root was made, so the new root is deleted, the machine started again from its old root and seed, and the pool
    holds what it held."""
    pool = rebuilt["pool"]
    before = seen(pool)
    path = os.path.join(os.path.dirname(pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(
        NAME + "-root.qcow2").path()), NAME + ".r1-cidata.iso")
    blocker = pool.conn.defineXML(
        "<domain type='qemu'><name>rb-blocker</name><memory unit='MiB'>64</memory><os><type arch='x86_64' "
        "machine='q35'>hvm</type></os><devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
        "<source file='%s'/><target dev='vda' bus='virtio'/></disk></devices></domain>" % path)
    try:
        failed = machine(pool, image=OTHER, rebuild=True)
    finally:
        blocker.undefine()
    assert failed.get("failed") and failed["field"] == "rebuild", failed
    assert "rb-blocker" in failed["msg"], failed
    after = seen(pool)
    assert record_of(pool.domain(NAME))["spec"]["image"]["source"] == load_lab()["image"]
    assert identity(pool.domain(NAME)) == identity_from(before["xml"], pool)
    assert after["volumes"] == before["volumes"]
    assert after["id"] is not None and after["id"] != before["id"]  # shut down, then started again
    assert instance_id(pool) == "iid-%s" % NAME  # the old seed, read at this boot
    assert record_of(pool.domain(NAME))["last_error"].startswith("rebuild failed")


def identity_from(xml, pool):
    """identity() of a definition as text (the machine's UUID is the domain's)."""
    tree = ET.fromstring(xml)
    macs = [node.get("address") for node in tree.findall("devices/interface/mac")]
    disks = {node.find("target").get("dev"): node.find("source").get("file") for node in tree.findall("devices/disk")}
    return tree.findtext("uuid"), macs, disks


def test_rebuild_gives_a_new_root_and_keeps_the_machine(rebuilt, capsys):
    pool = rebuilt["pool"]
    dom = pool.domain(NAME)
    uuid, macs, disks = identity(dom)
    volumes = pool.volumes()
    assert NAME + "-root.qcow2" in volumes and NAME + "-cidata.iso" in volumes
    load = os.getloadavg()
    with Downtime(pool.uri, NAME) as downtime:
        result = machine(pool, image=OTHER, rebuild=True)
    assert result["changed"] is True and not result.get("failed"), result
    assert result["actions"] == ["rebuild"], result
    assert result["diff"]["after"]["image"] == OTHER
    assert (result["machine"]["image"], result["machine"]["phase"]) == (OTHER, "Running")
    dom = pool.domain(NAME)
    new_uuid, new_macs, new_disks = identity(dom)
    assert (new_uuid, new_macs) == (uuid, macs)
    assert new_disks["vdb"] == disks["vdb"]  # the data volume, attached as it was
    assert new_disks["vda"] != disks["vda"] and new_disks["vda"].endswith("/%s.r1-root.qcow2" % NAME)
    assert new_disks["sda"].endswith("/%s.r1-cidata.iso" % NAME)
    after = pool.volumes()
    assert NAME + "-root.qcow2" not in after and NAME + "-cidata.iso" not in after  # the old ones, deleted
    assert NAME + ".r1-root.qcow2" in after and NAME + ".r1-cidata.iso" in after
    assert set(after) - set(volumes) == {NAME + ".r1-root.qcow2", NAME + ".r1-cidata.iso"}
    backing = ET.fromstring(pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(
        NAME + ".r1-root.qcow2").XMLDesc(0)).findtext("backingStore/path")
    assert backing and "/image-" in backing  # a thin overlay on the cached image, as a create makes
    record = record_of(dom)
    assert record["spec"]["image"]["source"] == OTHER and record["rebuilds"] == 1
    assert record["spec"]["root_volume"] == NAME + ".r1-root.qcow2"
    assert dom.isActive()
    assert instance_id(pool) == "iid-%s.r1" % NAME  # the seed was given again, with a new instance id
    assert pool.download(DATA)[:len(DATA_MARK)] == DATA_MARK
    with capsys.disabled():
        print("\nrebuild downtime (shut off -> running) %.1f s, the whole run %.1f s; load average before %.2f %.2f %.2f"
              % ((downtime.seconds, downtime.ran) + load))


def test_second_run_changes_nothing(rebuilt):
    pool = rebuilt["pool"]
    before = seen(pool)
    again = machine(pool, image=OTHER, rebuild=True)
    assert again["changed"] is False and again["actions"] == [], again
    plain = machine(pool, image=OTHER)  # without rebuild: the image it has now is no change
    assert plain["changed"] is False and not plain.get("failed"), plain
    assert seen(pool) == before


def test_a_machine_with_snapshots_is_not_rebuilt(rebuilt):
    """Its snapshots live inside its root's qcow2 (a machine of its own: the raw data volume of rb-web takes no
    internal snapshot)."""
    pool = rebuilt["pool"]
    args = dict(uri=pool.uri, name=SNAPPED, image=load_lab()["image"], machine_class="small", shutdown_timeout=5)
    created = run_module("machine", **args)
    assert not created.get("failed"), created
    try:
        snap = run_module("machine_snapshot", uri=pool.uri, machine=SNAPPED, name="before-rebuild")
        assert not snap.get("failed"), snap
        dom = pool.domain(SNAPPED)
        before = (dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), dom.ID(), pool.volumes())
        for check in (True, False):
            refused = run_module("machine", check=check, **{**args, "image": OTHER, "rebuild": True})
            assert refused.get("failed") and refused["field"] == "rebuild", refused
            assert "1 snapshot" in refused["msg"] and "nothing was changed" in refused["msg"], refused
            assert (dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), dom.ID(), pool.volumes()) == before
    finally:
        gone = run_module("machine", uri=pool.uri, name=SNAPPED, state="absent", shutdown_timeout=5)
        assert not gone.get("failed"), gone


def test_delete_removes_the_rebuilt_roots_volumes(rebuilt):
    pool = rebuilt["pool"]
    deleted = run_module("machine", uri=pool.uri, name=NAME, state="absent", shutdown_timeout=5)
    assert deleted["changed"] is True and not deleted.get("failed"), deleted
    assert [name for name in pool.volumes() if name.startswith(NAME)] == []
    assert DATA in pool.volumes()  # an existing volume is not the machine's
