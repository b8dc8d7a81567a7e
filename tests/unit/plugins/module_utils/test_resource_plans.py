"""The plans of pools, classes and attachments as pure functions: an observation in, actions out."""

import os

import libvirt
import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.machinery.compute.plugins.module_utils.core import options

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines.attach import plan_nic, plan_volume
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import plan_class
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, ConvergenceError, Plan, Resource, converge)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import Observed
from ansible_collections.machinery.compute.plugins.module_utils.pools import pool_registration
from ansible_collections.machinery.compute.plugins.module_utils.pools.pool_registration import plan_pool

from conftest import pool_seen, refused

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
GIB = 2 ** 30


def volume_params(raw):
    """volume_attach's parameters as the module has them: the table's defaults under what is given."""
    return options.defaulted(options.VOLUME_ATTACH, raw)


def nic_params(raw):
    return options.defaulted(options.NIC_ATTACH, raw)


REGISTERED = {"name": "hv1", "labels": {}, "taints": [], "overcommit": {"cpu": 1.0, "memory": 1.0, "storage": 1.0},
              "reserved": {"cpu": 0, "memory": 0, "storage": 0}, "storage_path": "/var/lib/libvirt/machinery", "networks": [],
              "virt_type": "qemu"}


def test_first_registration_makes_storage_networks_and_the_document():
    plan = plan_pool({"name": "hv1", "networks": [{"name": "net", "cidr": "10.9.0.0/24"}]},
                     pool_seen(storage=None))
    assert plan.kinds() == ["define_storage_pool", "define_storage_pool", "define_network", "register"]
    register = plan.find("register").as_dict()
    assert [step["action"] for step in register["steps"]] == ["probe_virt_type", "write_document"]


def test_registered_pool_is_left_alone():
    assert plan_pool({"name": "hv1"}, pool_seen(REGISTERED)).actions == []


def test_a_generation_beside_the_registration_is_pruned_when_nothing_else_is_written():
    """A writer killed midway left an unreadable newer generation (or a prune missed an older one): a re-run with
    nothing to change still leaves one generation; one that writes prunes it with its write."""
    seen = dict(pool_seen(REGISTERED), superseded=["pool.4.json"])
    plan = plan_pool({"name": "hv1"}, seen)
    assert plan.kinds() == ["prune_registration"]
    assert plan.find("prune_registration").before == {"generations": ["pool.4.json"]}
    assert plan_pool({"name": "hv1", "labels": {"zone": "b"}}, seen).kinds() == ["register"]


def test_inactive_pieces_are_started():
    plan = plan_pool({"name": "hv1", "networks": ["net"]},
                     pool_seen(dict(REGISTERED, networks=["net"]), {"active": False, "autostart": False},
                               {"net": {"active": True, "autostart": False}}))
    assert plan.kinds() == ["start_storage_pool", "autostart_storage_pool"] * 2 + ["autostart_network"]


def test_label_change_is_one_register_action_with_a_diff():
    plan = plan_pool({"name": "hv1", "labels": {"zone": "b"}}, pool_seen(REGISTERED))
    assert plan.summaries() == ["register"]
    before, after = plan.diff()
    assert before["labels"] == {} and after["labels"] == {"zone": "b"} and after["virt_type"] == "qemu"


TUNED = dict(REGISTERED, labels={"zone": "a"}, taints=[{"key": "gpu", "value": "", "effect": "NoSchedule"}],
             overcommit={"cpu": 4.0, "memory": 1.5, "storage": 1.0}, reserved={"cpu": 1, "memory": GIB, "storage": 0},
             storage_path="/srv/machines", networks=["net"])


def as_ansible_passes(table, params):
    """``params`` as a module receives them: validated against its argument spec, Ansible's defaults filled."""
    result = ArgumentSpecValidator(options.argument_spec(table)).validate(params)
    assert result.error_messages == []
    return result.validated_parameters


def test_options_left_out_keep_the_registered_values():
    assert plan_pool(as_ansible_passes(options.MACHINE_POOL, {"name": "hv1"}), pool_seen(TUNED)).actions == []
    assert plan_pool({"name": "hv1"}, pool_seen(TUNED)).actions == []


def test_a_given_option_sets_exactly_what_it_says():
    params = as_ansible_passes(options.MACHINE_POOL,
                               {"name": "hv1", "labels": {}, "taints": [], "overcommit": {"memory": 2.0}})
    plan = plan_pool(params, pool_seen(TUNED))
    after = plan.diff()[1]
    assert after["labels"] == {} and after["taints"] == []
    # a sub-option left out keeps its registered value as well
    assert after["overcommit"] == {"cpu": 4.0, "memory": 2.0, "storage": 1.0}
    assert after["reserved"] == TUNED["reserved"] and after["networks"] == ["net"]
    # a reservation given as 0 releases it
    params = as_ansible_passes(options.MACHINE_POOL, {"name": "hv1", "reserved": {"memory": 0, "cpu": 0}})
    assert plan_pool(params, pool_seen(TUNED)).diff()[1]["reserved"] == {"cpu": 0, "memory": 0, "storage": 0}


def test_first_registration_gets_the_documented_values():
    desired = plan_pool({"name": "hv1"}, pool_seen(storage=None)).facts["registration"]
    assert {key: desired[key] for key in pool_registration.FIRST_REGISTRATION} == pool_registration.FIRST_REGISTRATION


@pytest.mark.parametrize("params,field", [
    ({"name": "hv1", "networks": ["missing"]}, "networks"),
    ({"name": "hv1", "reserved": {"cpu": 8}}, "reserved"),
    ({"name": "hv1", "storage_path": "relative"}, "storage_path"),
    ({"name": "hv1", "taints": [{"key": "a", "effect": "Sometimes"}]}, "taints[0].effect"),
    ({"name": "Bad Name"}, "name"),
])
def test_bad_pool_input_names_the_field(params, field):
    refused(field, plan_pool, params, pool_seen(REGISTERED))


def test_unregister_refuses_a_pool_with_machines():
    with pytest.raises(ConflictError):
        plan_pool({"name": "hv1", "state": "absent"}, pool_seen(REGISTERED, machines=["web-1"]))
    assert plan_pool({"name": "hv1", "state": "absent", "force": True},
                     pool_seen(REGISTERED, machines=["web-1"])).kinds() == ["unregister"]
    assert plan_pool({"name": "hv1", "state": "absent"}, pool_seen(storage=None)).actions == []
    # an empty registry left by an older release goes as well
    assert plan_pool({"name": "hv1", "state": "absent"}, pool_seen()).kinds() == ["unregister"]


def test_unused_image_caches_are_pruned_on_request():
    seen = dict(pool_seen(REGISTERED), unused_images=["image-abc.qcow2"])
    plan = plan_pool({"name": "hv1", "prune_images": True}, seen)
    assert plan.kinds() == ["prune_image"] and plan.actions[0].target == "image-abc.qcow2"


def test_class_plans():
    small = {"name": "small", "cpu": 1, "memory": 512 * 2 ** 20}
    assert plan_class({"name": "small", "cpu": 1, "memory": "512Mi"}, small, []).actions == []
    grow = plan_class({"name": "small", "cpu": 2, "memory": "512Mi"}, small, [])
    assert grow.summaries() == ["publish"] and grow.diff()[1] == {"name": "small", "cpu": 2, "memory": "512Mi"}
    with pytest.raises(ConflictError):
        plan_class({"name": "small", "state": "absent"}, small, ["web-1"])
    assert plan_class({"name": "small", "state": "absent", "force": True}, small, ["web-1"]).kinds() == ["withdraw"]
    refused("memory", plan_class, {"name": "small", "cpu": 1}, None, [])


def test_class_options_left_out_keep_the_published_size():
    small = {"name": "small", "cpu": 2, "memory": 2 * GIB}
    assert plan_class(as_ansible_passes(options.MACHINE_CLASS, {"name": "small"}), small, []).actions == []
    grow = plan_class(as_ansible_passes(options.MACHINE_CLASS, {"name": "small", "memory": "4Gi"}), small, [])
    assert grow.diff()[1] == {"name": "small", "cpu": 2, "memory": "4Gi"}


def target(running=False):
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = dx.parse(handle.read())
    state = (libvirt.VIR_DOMAIN_RUNNING, 1) if running else (libvirt.VIR_DOMAIN_SHUTOFF, 1)
    seen = Observed("web-1", object(), tree, dx.read_record(tree), state, 128 * 2 ** 20)
    seen.live = tree
    return seen


def attached(seen, **entry):
    seen.record["spec"].setdefault("volumes", []).append(dict({"name": "extra", "volume": "extra", "device": "vdc",
                                                               "bus": "virtio", "ephemeral": False}, **entry))
    return seen


def test_volume_attach_create_and_grow():
    plan = plan_volume(volume_params({"volume": "extra", "size": "1Gi", "storage_pool": "machinery"}), target(), None)
    attach = plan.as_list()[0]
    assert attach["action"] == "attach" and [s["action"] for s in attach["steps"]][0] == "create_volume"
    assert attach["after"]["device"] not in ("vda", "vdb")
    existing = {"format": "qcow2", "capacity": GIB, "users": [], "path": "/p/extra"}
    grow = plan_volume(volume_params({"volume": "extra", "size": "2Gi"}), attached(target()), existing)
    assert grow.summaries() == ["grow"] and grow.diff() == ({"size": "1Gi"}, {"size": "2Gi"})
    shrink = plan_volume(volume_params({"volume": "extra", "size": "512Mi"}), attached(target()), existing)
    assert shrink.actions == [] and "never shrunk" in shrink.warnings[0]


def test_an_attach_killed_before_its_record_is_finished_not_refused():
    """The disk is defined with this module's alias but the record was never written (a run killed between the
    two): the re-run records it; a disk of that volume under another alias is still refused."""
    seen = target()
    devices = seen.tree.find("devices")
    devices.append(elements.disk("/p/extra", "qcow2", "vdx", "virtio", dx.volume_alias("extra")))
    existing = {"format": "qcow2", "capacity": GIB, "users": ["web-1"], "path": "/p/extra"}
    plan = plan_volume(volume_params({"volume": "extra"}), seen, existing)
    assert plan.summaries() == ["attach"] and plan.actions[0].handler == "record_disk"
    assert [s["action"] for s in plan.as_list()[0]["steps"]] == ["write_record"]
    other = target()
    other.tree.find("devices").append(elements.disk("/p/extra", "qcow2", "vdx", "virtio", "ua-vol-other"))
    with pytest.raises(ConflictError):
        plan_volume(volume_params({"volume": "extra"}), other, existing)


def test_volume_attach_refusals():
    with pytest.raises(NotFoundError):
        plan_volume(volume_params({"volume": "nope", "storage_pool": "machinery"}), target(), None)
    used = {"format": "qcow2", "capacity": GIB, "users": ["db-1"], "path": "/p/x"}
    with pytest.raises(ConflictError):
        plan_volume(volume_params({"volume": "x"}), target(), used)
    refused("shareable", plan_volume, volume_params({"volume": "x", "shareable": True}), target(), used)
    refused("bus", plan_volume, volume_params({"volume": "x", "size": "1Gi", "bus": "sata", "storage_pool": "m"}),
            target(running=True), None)


def test_volume_detach():
    plan = plan_volume(volume_params({"volume": "extra", "state": "detached"}), attached(target(), ephemeral=True), None)
    assert plan.kinds() == ["detach"] and plan.diff()[1] == {"deleted": "extra"}
    assert plan_volume(volume_params({"volume": "extra", "state": "detached"}), target(), None).actions == []


def test_nic_plans():
    params = nic_params({"name": "eth9", "network": "net", "network_exists": True, "pool_name": "hv1"})
    plan = plan_nic(params, target(), {})
    assert plan.kinds() == ["attach"] and plan.diff()[1]["mac"] == dx.derive_mac("web-1", "eth9")
    with pytest.raises(ConflictError) as raised:
        plan_nic(params, target(), {dx.derive_mac("web-1", "eth9"): [("db-1", "net")]})
    assert raised.value.field == "mac"
    with pytest.raises(NotFoundError):
        plan_nic(dict(params, network_exists=False), target(), {})
    with pytest.raises(ValidationError):
        plan_nic(dict(params, bridge="br0"), target(), {})


def test_attachment_options_left_out_keep_the_attached_values():
    seen = target()
    seen.record["spec"].setdefault("network_interfaces", []).append(
        {"name": "eth9", "network": "net", "bridge": None, "mac": "52:54:00:00:00:09", "model": "e1000e",
         "ephemeral": True})
    params = as_ansible_passes(options.NIC_ATTACH, {"machine": "web-1", "name": "eth9", "network": "net"})
    params.update(network_exists=True, pool_name="hv1")
    assert plan_nic(params, seen, {}).actions == []
    with pytest.raises(ConflictError) as raised:
        plan_nic(dict(params, model="virtio"), seen, {})
    assert raised.value.field == "model"
    seen = attached(target(), bus="scsi", device="sdb")
    params = as_ansible_passes(options.VOLUME_ATTACH, {"machine": "web-1", "volume": "extra"})
    params["storage_pool"] = "machinery"
    volume = {"format": "qcow2", "capacity": 2 ** 30, "path": "/x/extra", "users": ["web-1"]}
    plan = plan_volume(params, seen, volume)
    assert plan.actions == [] and plan.facts["volume_state"]["bus"] == "scsi"
    with pytest.raises(ConflictError) as raised:
        plan_volume(dict(params, bus="virtio"), seen, volume)
    assert raised.value.field == "bus"


class Counter(Resource):
    """A resource whose apply does nothing: converge must report the leftover difference as a bug."""

    def __init__(self, broken):
        self.broken = broken
        self.applied = []

    def describe(self):
        return "counter"

    def holds(self, plan, observed):
        return ()

    def observe(self):
        return len(self.applied)

    def plan(self, observed):
        return Plan([Action("bump", "counter")] if observed < 1 else [])

    def _bump(self, action, _observed):
        if not self.broken:
            self.applied.append(action)

    APPLY = {"bump": _bump}


def test_converge_verifies_and_check_mode_applies_nothing():
    fine = Counter(broken=False)
    plan, final = converge(fine)
    assert plan.summaries() == ["bump"] and final == 1
    checked = Counter(broken=False)
    assert converge(checked, check_mode=True)[0].summaries() == ["bump"] and checked.applied == []
    with pytest.raises(ConvergenceError):
        converge(Counter(broken=True))


def test_detach_finds_a_disk_the_machine_module_made_by_its_own_alias():
    seen = attached(target(), name="data", volume="web-1-data.qcow2", device="vdb")
    plan = plan_volume(volume_params({"volume": "web-1-data.qcow2", "state": "detached"}), seen, None)
    assert plan.actions[0].data["alias"] == "ua-vol-data"
