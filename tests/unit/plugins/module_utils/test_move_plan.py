"""The pure pieces of a move: the qcow2 header rebase, the domain's relocation, mode and target choice, the steps
of a move and how an interrupted one is resolved (no libvirt daemon)."""

import json
import os
import shutil
import struct
import subprocess

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_plan
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import Unschedulable

from conftest import pool_snapshot, refused

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
GI = 2 ** 30
UNIX = "qemu+unix:///system?socket=/lab/%s/run/libvirt-sock"
SSH = "qemu+ssh://root@%s/system"
CHECKSUM = "ab" * 32


def header(backing=b"/var/lib/libvirt/machinery/image-1.qcow2", cluster_bits=16, offset=0x200):
    """The first cluster of a qcow2 v3 file whose backing file name lies at ``offset``."""
    head = bytearray(1 << cluster_bits)
    head[:4] = move_plan.QCOW2_MAGIC
    head[4:8] = struct.pack(">I", 3)
    head[8:24] = struct.pack(">QII", offset if backing else 0, len(backing), cluster_bits)
    head[offset:offset + len(backing)] = backing
    return bytes(head)


def test_rebase_header_replaces_the_name_in_place():
    head = header()
    offset, length, cluster = move_plan.backing_reference(head)
    assert (offset, length, cluster) == (0x200, 40, 65536)
    longer = "/srv/pools/hv2/machinery/image-1.qcow2"
    patched = move_plan.rebase_header(head, longer + "-longer")
    assert patched[16:20] == struct.pack(">I", len(longer) + 7)
    assert patched[0x200:0x200 + len(longer) + 7] == (longer + "-longer").encode()
    assert patched[:16] == head[:16] and patched[20:0x200] == head[20:0x200]
    shorter = move_plan.rebase_header(head, "/m/image-1.qcow2")
    assert shorter[0x200:0x200 + 40] == b"/m/image-1.qcow2".ljust(40, b"\0")  # the old name leaves no tail
    assert len(shorter) == len(head)
    assert move_plan.header_bytes_needed(head, longer) == 0x200 + 40


def test_rebase_header_refuses_what_qemu_refuses():
    with pytest.raises(ValueError, match="does not fit"):
        move_plan.rebase_header(header(offset=65536 - 50), "/" + "x" * 60)
    with pytest.raises(ValueError, match="does not fit"):
        move_plan.rebase_header(header(), "/" + "x" * 1100)
    with pytest.raises(ValueError, match="no backing file"):
        move_plan.rebase_header(header(backing=b""), "/m/image.qcow2")
    with pytest.raises(ValueError, match="not a qcow2"):
        move_plan.rebase_header(b"\0" * 512, "/m/image.qcow2")
    with pytest.raises(ValueError, match="too short"):
        move_plan.rebase_header(header()[:0x210], "/m/image.qcow2")


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img is not installed")
def test_rebase_header_gives_what_qemu_reads(tmp_path):
    """On a real overlay: qemu-img reads the rewritten header with the new backing file and the same format."""
    base = tmp_path / "image-1.qcow2"
    moved = tmp_path / "moved" / "image-1.qcow2"
    moved.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M"], check=True)
    shutil.copy(base, moved)
    overlay = tmp_path / "root.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(overlay)],
                   check=True)
    data = overlay.read_bytes()
    head = data[:move_plan.header_bytes_needed(data[:24], str(moved))]
    overlay.write_bytes(move_plan.rebase_header(head, str(moved)) + data[len(head):])
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(overlay)], check=True,
                                     capture_output=True, text=True).stdout)
    assert info["backing-filename"] == str(moved)
    assert info["backing-filename-format"] == "qcow2"
    assert subprocess.run(["qemu-img", "check", "-q", str(overlay)], check=False).returncode == 0


def golden():
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        return dx.parse(handle.read())


def test_relocate_points_every_file_at_the_target_storage():
    tree = move_plan.relocate(golden(), "/pool/", "/srv/machinery")
    text = dx.tostring(tree)
    assert "'/pool/" not in text and '"/pool/' not in text
    assert tree.find("sysinfo/entry").get("file") == "/srv/machinery/web-1-ignition.json"
    assert [node.get("file") for node in tree.iter("source") if node.get("file")] == [
        "/srv/machinery/web-1-root.qcow2", "/srv/machinery/web-1-data.qcow2", "/srv/machinery/web-1-cidata.iso"]
    assert {node.get("file") for node in tree.iter("log")} == {"/srv/machinery/web-1-console.log"}
    assert tree.find("devices/emulator") is None
    assert tree.find("devices/interface/mac").get("address") == golden().find("devices/interface/mac").get("address")
    assert dx.read_record(tree) == dx.read_record(golden())


def test_machine_files_and_what_cannot_move():
    files = move_plan.machine_files(golden(), "/pool")
    assert [(item["volume"], item["kind"]) for item in files] == [
        ("web-1-root.qcow2", "disk"), ("web-1-data.qcow2", "disk"), ("web-1-cidata.iso", "readonly"),
        ("web-1-ignition.json", "file"), ("web-1-console.log", "log")]
    assert files[0]["device"] == "vda"
    tree = golden()
    tree.find("devices/disk/source").set("file", "/elsewhere/disk.qcow2")
    with pytest.raises(ConflictError) as info:
        move_plan.machine_files(tree, "/pool")
    assert info.value.field == "machine" and "/elsewhere/disk.qcow2" in info.value.message


def test_image_of_names_the_cache_and_its_full_checksum():
    record = {"spec": {"image": {"checksum": CHECKSUM}, "volumes": [{"image": {"checksum": "cd" * 32}}]}}
    assert move_plan.image_of("image-%s.qcow2" % CHECKSUM[:32], record) == {
        "volume": "image-%s.qcow2" % CHECKSUM[:32], "checksum": CHECKSUM, "format": "qcow2"}
    assert move_plan.image_of("image-%s.raw" % ("cd" * 16), record)["checksum"] == "cd" * 32
    assert move_plan.image_of("image-%s.qcow2" % ("ef" * 16), record)["checksum"] == "ef" * 16  # the name's part
    with pytest.raises(ConflictError, match="not an image cache"):
        move_plan.image_of("someone-elses-base.qcow2", record)


@pytest.mark.parametrize("mode, active, source, target, chosen", [
    ("cold", True, UNIX % "a", UNIX % "b", "cold"),
    ("auto", False, UNIX % "a", UNIX % "b", "cold"),
    ("auto", True, UNIX % "a", UNIX % "b", "live"),
    ("auto", True, SSH % "a", SSH % "b", "cold"),
    ("auto", True, UNIX % "a", SSH % "b", "cold"),
    ("live", True, SSH % "a", SSH % "b", "live"),
])
def test_choose_mode(mode, active, source, target, chosen):
    assert move_plan.choose_mode(mode, active, source, target) == chosen


def test_live_needs_a_running_machine_and_a_known_mode():
    assert "stopped" in refused("mode", move_plan.choose_mode, "live", False, UNIX % "a", UNIX % "b")
    refused("mode", move_plan.choose_mode, "warm", True, UNIX % "a", UNIX % "b")


def test_live_transport():
    assert move_plan.unix_socket_dir(UNIX % "b") == "/lab/b/run"
    assert move_plan.unix_socket_dir("qemu+unix:///system") is None
    assert move_plan.unix_socket_dir(SSH % "b") is None
    assert move_plan.live_transport("web-1", UNIX % "a", UNIX % "b") == {
        "uri": "unix:///lab/b/run/machinery-migrate-web-1.sock",
        "disks_uri": "unix:///lab/b/run/machinery-nbd-web-1.sock"}
    assert move_plan.live_transport("web-1", SSH % "a", SSH % "b") == {}


def journal(was_running=True):
    return move_plan.journal_body("web-1", "u-1", "cold", was_running, {"pool": "a", "uri": UNIX % "a"},
                                  {"pool": "b", "uri": UNIX % "b"}, ["web-1-root.qcow2", "web-1-data.qcow2"],
                                  ["image-1.qcow2"])


def side(exists=True, active=False, uuid="u-1"):
    return {"exists": exists, "active": active, "uuid": uuid if exists else None}


@pytest.mark.parametrize("source, target, kind", [
    (side(), side(exists=False), "discard"),  # died before the define: copy again
    (side(active=True), side(exists=False), "discard"),  # died before the shutdown
    (side(), side(uuid="other"), "discard"),  # another machine of that name on the target is not the copy
    (side(), side(), "finish"),  # defined, not started yet
    (side(), side(active=True), "finish"),  # started, source not deleted yet
    (side(exists=False), side(active=True), "finish"),  # source undefined, journals not cleared yet
    (side(uuid="new"), side(active=True), "finish"),  # a new machine of that name on the source is not touched
    (side(active=True), side(), "discard_copy"),  # the source was started again after the copy was defined
])
def test_resolve_interrupted(source, target, kind):
    assert move_plan.resolve_interrupted(journal(), source, target) == kind


def test_resolve_interrupted_refuses_what_it_cannot_tell():
    with pytest.raises(ConflictError, match="runs on both"):
        move_plan.resolve_interrupted(journal(), side(active=True), side(active=True))
    with pytest.raises(ConflictError, match="on neither") as info:
        move_plan.resolve_interrupted(journal(), side(exists=False), side(exists=False))
    assert info.value.field == "machine" and "web-1-root.qcow2" in info.value.message


def actions(steps):
    return [(item["action"], item["target"], item.get("pool")) for item in steps]


def test_recovery_steps():
    present = {"source": ["web-1-data.qcow2"], "target": ["web-1-root.qcow2"], "images": ["image-1.qcow2"]}
    assert actions(move_plan.recovery_steps("finish", journal(), side(), side(), present)) == [
        ("start", "web-1", "b"), ("delete_volume", "web-1-data.qcow2", "a"), ("undefine", "web-1", "a"),
        ("clear_journal", "web-1", None)]
    assert actions(move_plan.recovery_steps("finish", journal(False), side(uuid="new"), side(), present)) == [
        ("delete_volume", "web-1-data.qcow2", "a"), ("clear_journal", "web-1", None)]
    assert actions(move_plan.recovery_steps("discard", journal(), side(), side(exists=False), present)) == [
        ("delete_volume", "web-1-root.qcow2", "b"), ("delete_image", "image-1.qcow2", "b"),
        ("clear_journal", "web-1", None)]
    assert actions(move_plan.recovery_steps("discard_copy", journal(), side(active=True), side(), present))[0] == \
        ("undefine", "web-1", "b")


def facts(active=True, missing_images=True):
    files = [{"volume": "web-1-root.qcow2", "kind": "disk", "device": "vda", "format": "qcow2", "capacity": GI,
              "backing": "/pool/image-1.qcow2"},
             {"volume": "web-1-data.qcow2", "kind": "disk", "device": "vdb", "format": "qcow2", "capacity": GI},
             {"volume": "web-1-cidata.iso", "kind": "readonly", "device": "sda", "format": "raw", "capacity": 1},
             {"volume": "web-1-console.log", "kind": "log", "format": "raw", "capacity": 1}]
    images = [{"volume": "image-1.qcow2", "checksum": CHECKSUM}] if missing_images else []
    return {"machine": "web-1", "active": active, "source": {"pool": "a"}, "target": {"pool": "b"},
            "files": files, "missing_images": images}


def test_a_cold_move_copies_before_it_defines_and_deletes_last():
    steps = actions(move_plan.move_steps(facts(), "cold", True, 30))
    assert steps == [
        ("write_journal", "web-1", None), ("shutdown", "web-1", None), ("cache_image", "image-1.qcow2", "b"),
        ("copy_volume", "web-1-root.qcow2", "b"), ("copy_volume", "web-1-data.qcow2", "b"),
        ("copy_volume", "web-1-cidata.iso", "b"), ("copy_volume", "web-1-console.log", "b"),
        ("define", "web-1", "b"), ("start", "web-1", "b"),
        ("delete_volume", "web-1-root.qcow2", "a"), ("delete_volume", "web-1-data.qcow2", "a"),
        ("delete_volume", "web-1-cidata.iso", "a"), ("delete_volume", "web-1-console.log", "a"),
        ("undefine", "web-1", "a"), ("clear_journal", "web-1", None)]
    stopped = actions(move_plan.move_steps(facts(active=False, missing_images=False), "cold", False, 30))
    assert ("shutdown", "web-1", None) not in stopped and ("start", "web-1", "b") not in stopped
    assert not any(item[0] == "cache_image" for item in stopped)


def test_a_live_move_prepares_the_disks_and_migrates():
    steps = actions(move_plan.move_steps(facts(), "live", True, 30))
    assert steps[:6] == [
        ("write_journal", "web-1", None), ("cache_image", "image-1.qcow2", "b"),
        ("prepare_volume", "web-1-root.qcow2", "b"), ("prepare_volume", "web-1-data.qcow2", "b"),
        ("copy_volume", "web-1-cidata.iso", "b"), ("migrate", "web-1", "b")]
    assert ("shutdown", "web-1", None) not in steps and ("define", "web-1", "b") not in steps
    assert not any(item[1] == "web-1-console.log" and item[2] == "b" for item in steps)


def snapshot(name, **given):
    return pool_snapshot(name, UNIX % name, **given)


def machine(machine_class="small"):
    return move_plan.scheduling_spec("web-1", {"spec": {"machine_class": machine_class}}, 2, GI)


def test_pick_target_leaves_out_the_source_and_honours_the_filters():
    pools = [snapshot("a"), snapshot("b", used_cpu=6), snapshot("c", used_cpu=2),
             snapshot("d", taints=[{"key": "maintenance", "value": "", "effect": "NoExecute"}]),
             snapshot("e", classes={}), snapshot("f", state="Offline")]
    chosen, reason = move_plan.pick_target(machine(), pools, UNIX % "a")
    assert chosen["name"] == "c" and "2/4 pools fit" in reason  # e does not publish the class
    assert move_plan.pick_target(machine(), pools, UNIX % "a", "binpack")[0]["name"] == "b"
    assert move_plan.pick_target(machine(None), pools, UNIX % "a", wanted="e")[0]["name"] == "e"


def test_pick_target_says_why_not():
    pools = [snapshot("a"), snapshot("d", taints=[{"key": "maintenance", "value": "", "effect": "NoExecute"}]),
             snapshot("e", classes={})]
    with pytest.raises(Unschedulable) as info:
        move_plan.pick_target(machine(), pools, UNIX % "a")
    assert info.value.field == "target"
    assert "taint not tolerated" in info.value.message and "e: class small not published" in info.value.message
    with pytest.raises(Unschedulable, match="class small not published"):
        move_plan.pick_target(machine(), pools, UNIX % "a", wanted="e")
    with pytest.raises(Unschedulable, match="taint not tolerated"):
        move_plan.pick_target(machine(), pools, UNIX % "a", wanted="d")
    with pytest.raises(Unschedulable, match="insufficient cpu"):
        move_plan.pick_target(machine(), [snapshot("a"), snapshot("b", cpu=1)], UNIX % "a", wanted="b")


def test_pick_target_honours_the_recorded_tolerations():
    gpu = [{"key": "gpu", "value": "", "effect": "NoSchedule"}]
    pools = [snapshot("a"), snapshot("gpu", taints=gpu)]
    tolerant = move_plan.scheduling_spec("web-1", {"spec": {"machine_class": "small", "tolerations": [
        {"key": "gpu", "operator": "Exists", "value": "", "effect": ""}]}}, 2, GI)
    assert move_plan.pick_target(tolerant, pools, UNIX % "a")[0]["name"] == "gpu"
    with pytest.raises(Unschedulable, match="taint not tolerated"):
        move_plan.pick_target(machine(), pools, UNIX % "a")


def test_pick_target_counts_the_disks_and_the_server_group():
    record = {"spec": {"name": "web-1", "machine_class": "small", "root_size": 10 * GI,
                       "volumes": [{"volume": "web-1-data.qcow2", "size": 5 * GI}],
                       "server_group": {"name": "web", "policy": "anti-affinity"}}}
    moving = move_plan.scheduling_spec("web-1", record, 2, GI)
    assert moving["storage"] == 15 * GI
    tight, roomy, other = snapshot("tight"), snapshot("roomy"), snapshot("member")
    tight["storage"] = {"allocatable": 20 * GI, "allocated": 10 * GI}
    roomy["storage"] = {"allocatable": 100 * GI, "allocated": 10 * GI}
    other["server_groups"] = {"web-2": {"name": "web", "policy": "anti-affinity"}}
    assert move_plan.pick_target(moving, [snapshot("a"), tight, roomy, other], UNIX % "a")[0]["name"] == "roomy"
    with pytest.raises(Unschedulable) as info:
        move_plan.pick_target(moving, [snapshot("a"), tight, other], UNIX % "a")
    assert "tight: storage 10Gi free, needs 15Gi" in info.value.message
    assert "server group web (anti-affinity) has a member there" in info.value.message


# What a Debian 12 pool's QEMU 7.2 offers (an excerpt of its capabilities and domain capabilities): q35 is
# pc-q35-7.2 there, and libvirt writes that expanded name into every domain it defines.
OLDER_CAPABILITIES = """<capabilities><guest><os_type>hvm</os_type><arch name='x86_64'>
  <machine maxCpus='255'>pc-i440fx-7.2</machine><machine canonical='pc-i440fx-7.2' maxCpus='255'>pc</machine>
  <machine maxCpus='288'>pc-q35-7.2</machine><machine canonical='pc-q35-7.2' maxCpus='288'>q35</machine>
  <machine maxCpus='288'>pc-q35-7.1</machine><domain type='qemu'/><domain type='kvm'/></arch></guest>
</capabilities>"""


def machine_tree(machine_type, cpu=""):
    return dx.parse("<domain type='qemu'><name>m</name><os><type arch='x86_64' machine='%s'>hvm</type></os>%s"
                    "<devices/></domain>" % (machine_type, cpu))


def test_a_move_is_refused_the_machine_type_the_target_lacks():
    caps = dx.parse(OLDER_CAPABILITIES)
    with pytest.raises(ConflictError) as refusal:
        move_plan.missing_hardware("m", machine_tree("pc-q35-10.0"), "pool1", caps, set())
    assert refusal.value.field == "target"
    assert "machine type pc-q35-10.0" in refusal.value.message and "pool1" in refusal.value.message
    # an older type the target has, its alias and its canonical name all pass
    for machine_type in ("pc-q35-7.2", "pc-q35-7.1", "q35"):
        move_plan.missing_hardware("m", machine_tree(machine_type), "pool1", caps, set())


def test_a_move_is_refused_the_cpu_model_the_target_lacks():
    caps = dx.parse(OLDER_CAPABILITIES)
    newer_model = "<cpu mode='custom' match='exact'><model fallback='forbid'>GraniteRapids</model></cpu>"
    with pytest.raises(ConflictError) as refusal:
        move_plan.missing_hardware("m", machine_tree("pc-q35-7.2", newer_model), "pool1", caps, {"qemu64", "Haswell"})
    assert "CPU model GraniteRapids" in refusal.value.message and refusal.value.field == "target"
    both = "<cpu mode='custom' match='exact'><model fallback='forbid'>qemu64</model></cpu>"
    move_plan.missing_hardware("m", machine_tree("pc-q35-7.2", both), "pool1", caps, {"qemu64", "Haswell"})
    # host-passthrough names no model: nothing to compare
    move_plan.missing_hardware("m", machine_tree("pc-q35-7.2", "<cpu mode='host-passthrough'/>"), "pool1", caps,
                               set())
