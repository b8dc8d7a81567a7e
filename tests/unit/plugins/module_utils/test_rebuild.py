"""rebuild: true as pure functions: normalize marks the spec, the plan orders the steps, the seed gets a new
instance id, the domain is pointed at the new files (no libvirt daemon)."""

import copy
import os

import libvirt
import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import plan_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import (
    Facts, ephemeral_volumes, normalize, params, rebuild_requested)
from ansible_collections.machinery.compute.plugins.module_utils.machines.rebuild import (
    point_disks, rebuild_action, wants_rebuild)
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import machine_disks

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
RUNNING = (libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_RUNNING_BOOTED)
SHUTOFF = (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN)
MIB, GIB = 2 ** 20, 2 ** 30
OLD = {"source": "/images/old.qcow2", "checksum": "0" * 64, "format": "qcow2"}
NEW = {"image": {"source": "/images/new.qcow2", "checksum": "1" * 64, "path": "/images/new.qcow2"},
       "format": "qcow2", "size": 2 * GIB}


def record(**changes):
    spec = {"name": "web-1", "machine_class": None, "cpu": 1, "memory": 128 * MIB, "labels": {"app": "web"},
            "firmware": "bios", "boot_config": "abc", "image": dict(OLD), "root_size": GIB, "volumes": [],
            "network_interfaces": [], "swap": None, "run_strategy": "manual",
            "files": {"console": "web-1-console.log", "seed": "web-1-cidata.iso"}}
    spec.update(changes)
    return {"version": 1, "created": "2026-01-01T00:00:00+00:00", "boots": 1, "spec": spec}


def normalized(raw, rec=None):
    rec = rec or record()
    prm = params(dict({"name": "web-1"}, **raw))
    facts = Facts(images={"image": NEW} if rebuild_requested(prm, rec["spec"]) else {})
    return normalize(prm, facts, rec, {"cpu": 1, "memory": 128 * MIB, "labels": {"app": "web"},
                                       "boot_config": "abc"})


def observed(rec, state=RUNNING):
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = dx.parse(handle.read())
    dx.write_record(tree, rec)
    return Observed("web-1", dom=object(), tree=tree, record=rec, state=state, live_max_memory=128 * MIB,
                    autostart=False, saved=False)


# --- normalize --------------------------------------------------------------------------------------------------

def test_without_rebuild_a_changed_image_is_refused_and_the_error_says_how():
    with pytest.raises(ConflictError) as info:
        normalized({"image": "/images/new.qcow2"})
    assert info.value.field == "image" and "rebuild: true" in info.value.message


def test_other_fixed_options_stay_refused_with_rebuild():
    with pytest.raises(ConflictError) as info:
        normalized({"image": "/images/new.qcow2", "rebuild": True, "firmware": "uefi"})
    assert info.value.field == "firmware" and "rebuild" not in info.value.message


def test_rebuild_takes_the_new_image_and_keeps_the_roots_size_when_it_is_larger():
    spec = normalized({"image": "/images/new.qcow2", "rebuild": True}, record(root_size=4 * GIB))
    assert spec["rebuild"] and spec["image"]["source"] == "/images/new.qcow2" and spec["root_size"] == 4 * GIB


def test_rebuild_grows_the_root_to_a_larger_image_and_takes_a_root_size_given():
    assert normalized({"image": "/images/new.qcow2", "rebuild": True})["root_size"] == 2 * GIB
    assert normalized({"image": "/images/new.qcow2", "rebuild": True, "root_size": "3Gi"})["root_size"] == 3 * GIB
    with pytest.raises(ValidationError) as info:
        normalized({"image": "/images/new.qcow2", "rebuild": True, "root_size": "1Gi"})
    assert info.value.field == "root_size"


@pytest.mark.parametrize("raw", [{"rebuild": True}, {"rebuild": True, "image": "/images/old.qcow2"},
                                 {"rebuild": True, "image_checksum": "sha256:" + "0" * 64}])
def test_rebuild_with_the_same_image_asks_for_nothing(raw):
    spec = normalized(raw)
    assert not spec.get("rebuild") and spec["image"] == OLD


def test_a_machine_without_a_root_of_its_own_is_not_rebuilt():
    with pytest.raises(ConflictError) as info:
        normalized({"image": "/images/new.qcow2", "rebuild": True}, dict(record(), adopted=True))
    assert info.value.field == "rebuild"


def test_only_the_machine_module_rebuilds():
    with pytest.raises(ValidationError) as info:
        params({"name": "web-1", "rebuild": True}, "machines[0]", scheduling=True)
    assert "rebuild" in info.value.message


# --- plan -------------------------------------------------------------------------------------------------------

def test_a_running_machine_is_rebuilt_in_order_and_started_again():
    rec = record()
    plan = plan_machine(normalized({"image": "/images/new.qcow2", "rebuild": True}), observed(rec), rec)
    assert plan.summaries() == ["rebuild"]
    steps = [(s["action"], s["target"]) for s in plan.as_list()[0]["steps"]]
    assert steps == [("cache_image", "/images/new.qcow2"), ("shutdown", "web-1"),
                     ("create_volume", "web-1.r1-root.qcow2"), ("write_volume", "web-1.r1-cidata.iso"),
                     ("define", "web-1"), ("start", "web-1"), ("delete_volume", "web-1-root.qcow2"),
                     ("delete_volume", "web-1-cidata.iso")]
    assert plan.diff() == ({"image": "/images/old.qcow2", "image_checksum": "0" * 64},
                           {"image": "/images/new.qcow2", "image_checksum": "1" * 64})


def test_a_second_rebuild_replaces_the_first_ones_volumes():
    rec = record(root_volume="web-1.r1-root.qcow2", files={"console": "web-1-console.log",
                                                           "seed": "web-1.r1-cidata.iso"})
    rec["rebuilds"] = 1
    action = rebuild_action(dict(normalized({"image": "/images/new.qcow2", "rebuild": True}, rec)), rec, False)
    assert action.data["made"] == {"root": "web-1.r2-root.qcow2", "seed": "web-1.r2-cidata.iso"}
    assert action.data["old"] == {"root": "web-1.r1-root.qcow2", "seed": "web-1.r1-cidata.iso"}
    assert action.data["generation"] == 2 and not action.data["restart"]
    assert "shutdown" not in [s["action"] for s in action.steps]


def test_a_rebuild_to_stopped_shuts_down_once_and_a_stopped_one_starts_after():
    rec = record()
    spec = normalized({"image": "/images/new.qcow2", "rebuild": True, "state": "stopped"})
    plan = plan_machine(spec, observed(rec), rec)
    assert plan.summaries() == ["rebuild"] and "start" not in [s["action"] for s in plan.actions[0].steps]
    spec = normalized({"image": "/images/new.qcow2", "rebuild": True, "state": "running"})
    assert plan_machine(spec, observed(rec, SHUTOFF), rec).summaries() == ["rebuild", "start"]


def test_a_rebuild_already_done_plans_nothing():
    rec = record()
    spec = normalized({"image": "/images/new.qcow2", "rebuild": True})
    done = copy.deepcopy(rec)
    done["spec"]["image"] = {"source": "/images/new.qcow2", "checksum": "1" * 64, "format": "qcow2"}
    assert not wants_rebuild(spec, done)
    assert plan_machine(spec, observed(done), done).actions == []


def test_snapshots_refuse_a_rebuild_naming_the_option():
    rec = record()
    seen = observed(rec)
    seen.snapshots = 2
    with pytest.raises(ConflictError) as info:
        plan_machine(normalized({"image": "/images/new.qcow2", "rebuild": True}), seen, rec)
    assert info.value.field == "rebuild" and "2 snapshots" in info.value.message


def test_a_new_boot_configuration_goes_with_the_rebuild_not_in_place():
    rec = record()
    spec = normalized({"image": "/images/new.qcow2", "rebuild": True, "cloud_init": {"user_data": "#cloud-config\n"}})
    plan = plan_machine(spec, observed(rec), rec)
    assert plan.summaries() == ["rebuild"]
    assert plan.diff()[1]["boot_config"] == spec["boot_config"] != "abc"


# --- apply helpers ----------------------------------------------------------------------------------------------

def test_the_seed_gets_the_instance_id_of_its_generation_and_a_users_own_is_kept():
    files = seed.nocloud_files("web-1", {"user_data": {"packages": ["curl"]}})
    again = seed.with_generation(files, "web-1", 3)
    assert b"instance-id: iid-web-1.r3" in again["meta-data"] and again["user-data"] == files["user-data"]
    assert seed.with_generation(again, "web-1", 0) == files
    own = seed.nocloud_files("web-1", {"meta_data": {"instance-id": "mine"}})
    assert seed.with_generation(own, "web-1", 3) == own


def test_the_seed_iso_reads_back_as_written():
    files = seed.nocloud_files("web-1", {"user_data": {"runcmd": [["true"]]}}, ["ssh-ed25519 AAAA key"])
    assert seed.read_nocloud_iso(seed.nocloud_iso(files)) == files


def test_the_domain_is_pointed_at_the_new_root_seed_and_ignition_only():
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = dx.parse(handle.read())
    point_disks(tree, {"root": "/pool/web-1.r1-root.qcow2", "seed": "/pool/web-1.r1-cidata.iso",
                       "ignition": "/pool/web-1.r1-ignition.json"})
    sources = [node.get("file") for node in tree.findall("devices/disk/source")]
    assert sources == ["/pool/web-1.r1-root.qcow2", "/pool/web-1-data.qcow2", "/pool/web-1.r1-cidata.iso"]
    assert tree.find("sysinfo/entry").get("file") == "/pool/web-1.r1-ignition.json"


def test_a_rebuilt_machines_root_is_deleted_and_counted_by_its_recorded_name():
    rec = record(root_volume="web-1.r1-root.qcow2")
    assert ephemeral_volumes(rec)[0] == "web-1.r1-root.qcow2"
    assert "web-1.r1-root.qcow2" in machine_disks(rec) and "web-1-root.qcow2" not in machine_disks(rec)
