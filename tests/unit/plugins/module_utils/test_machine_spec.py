"""The one path of a machine spec: params (the option table, once) and the pure normalize, with Facts built by
hand (no libvirt, no files)."""

import ast
import glob
import os

import pytest
from ansible.module_utils.common.parameters import remove_values

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import FrozenDict, FrozenList
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import outgoing
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import Facts, normalize, params

from conftest import refused

MIB, GIB = 2 ** 20, 2 ** 30
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
IMAGE = {"image": {"source": "/images/test.qcow2", "checksum": "0" * 64, "path": "/images/test.qcow2"},
         "format": "qcow2", "size": 1 * GIB}
NETWORK = {"info": {"cidr": "192.168.100.0/24", "dhcp_start": "192.168.100.10", "dhcp_end": "192.168.100.200",
                    "dhcp_hosts": []}, "leases": []}


def facts(**changes):
    base = dict(pool="pool1", classes={"small": {"cpu": 1, "memory": 256 * MIB}}, networks={"default": NETWORK},
                default_network="default", images={"image": IMAGE})
    base.update(changes)
    return Facts(**base)


def created(**raw):
    """normalize of a new machine from raw options."""
    base = {"name": "web-1", "machine_class": "small", "image": "/images/test.qcow2"}
    base.update(raw)
    return normalize(params(base), facts())


# --- params ----------------------------------------------------------------------------------------------------

def test_params_apply_the_tables_defaults_and_freeze():
    prm = params({"name": "web-1"})
    assert isinstance(prm, FrozenDict)
    for item in options.MACHINE:
        if item.argument and item.default is not None:
            assert prm[item.name] == item.default, item.name
    with pytest.raises(TypeError):
        prm["state"] = "absent"


def test_params_check_values_once_and_name_the_field():
    prm = params({"name": "a", "memory": "1Gi", "root_size": "5Gi", "swap": "512Mi", "labels": {"app": "web"},
                  "volumes": [{"name": "data", "size": "1Gi", "iops": 100}],
                  "network_interfaces": [{"name": "eth0", "network": "n", "mac": "52:54:00:AA:BB:CC",
                                          "security_groups": ["web", "db", "web"], "ip_address": " 10.0.0.5 "}]})
    assert (prm["memory"], prm["root_size"], prm["swap"]) == (GIB, 5 * GIB, 512 * MIB)
    assert prm["volumes"][0]["size"] == GIB and prm["volumes"][0]["bus"] == "virtio"
    nic = prm["network_interfaces"][0]
    assert nic["mac"] == "52:54:00:aa:bb:cc" and nic["security_groups"] == ["db", "web"]
    assert nic["ip_address"] == "10.0.0.5"


@pytest.mark.parametrize("raw, field", [
    ({"name": "a", "memory": "lots"}, "machines[2].memory"),
    ({"name": "a", "volumes": [{"name": "d", "size": "1Gi", "volume": "x"}]}, "machines[2].volumes[0]"),
    ({"name": "a", "volumes": [{"name": "root", "size": "1Gi"}]}, "machines[2].volumes[0].name"),
    ({"name": "a", "volumes": [{"name": "d", "size": "1Gi", "passphrase": "secret-phrase"}]},
     "machines[2].volumes[0].passphrase"),
    ({"name": "a", "volumes": [{"name": "d", "volume": "v", "encrypted": True}]}, "machines[2].volumes[0].encrypted"),
    ({"name": "a", "network_interfaces": [{"name": "e", "network": "n", "bridge": "br0"}]},
     "machines[2].network_interfaces[0]"),
    ({"name": "a", "network_interfaces": [{"name": "e", "network": "n", "ip_address": "999.1.1.1"}]},
     "machines[2].network_interfaces[0].ip_address"),
    ({"name": "a", "wait_timeout": 0}, "machines[2].wait_timeout"),
    ({"name": "a", "tolerance": []}, "machines[2]"),
    ({"name": "a", "state": "gone"}, "machines[2]"),
])
def test_params_refuse_bad_input_naming_the_field(raw, field):
    refused(field, params, raw, "machines[2]", scheduling=True)


def test_defaults_fill_what_a_machine_leaves_out_and_are_checked_themselves():
    prm = params({"name": "a"}, defaults={"wait": "address", "labels": {"tier": "web"}})
    assert prm["wait"] == "address" and prm["labels"] == {"tier": "web"}
    refused("defaults", params, {"name": "a"}, defaults={"nme": "x"})


# --- normalize (pure) ------------------------------------------------------------------------------------------

def test_a_new_machine_takes_its_class_and_image():
    spec = created()
    assert (spec["cpu"], spec["memory"], spec["machine_class"]) == (1, 256 * MIB, "small")
    assert spec["image"]["checksum"] == "0" * 64 and spec["firmware"] == options.initial(options.MACHINE, "firmware")
    assert spec["network_interfaces"][0]["network"] == "default" and spec["virt_type"] == "qemu"


def test_the_spec_is_frozen():
    spec = created(volumes=[{"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "long enough secret"}])
    with pytest.raises(TypeError):
        spec["volumes"][0].pop("passphrase")
    with pytest.raises(TypeError):
        spec["image"]["format"] = "raw"


def test_a_module_result_holding_a_frozen_spec_passes_ansibles_secret_masking():
    """ansible-core before 2.17 masks no_log values by building each container anew as an empty one of its type and
    filling it: a frozen spec inside a result refused that, and every machine_batch run failed under 2.16."""
    spec = created(volumes=[{"name": "data", "size": "1Gi", "encrypted": True, "passphrase": "long enough secret"}])
    result = outgoing({"changed": True, "machines": [{"name": "vm", "spec": spec}]})
    masked = remove_values(result, ["long enough secret"])
    assert masked["machines"][0]["spec"]["volumes"][0]["passphrase"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    assert not isinstance(masked["machines"][0]["spec"], FrozenDict) and not isinstance(masked["machines"], FrozenList)


@pytest.mark.parametrize("image", [True, False])
def test_swap_reaches_the_machine_with_and_without_an_image(image):
    """KupenStack machines boot from an existing volume and have no image: their swap was dropped."""
    raw = {"name": "vm", "cpu": 1, "memory": "512Mi", "swap": "1Gi"}
    if image:
        raw["image"] = "/images/test.qcow2"
    else:
        raw["volumes"] = [{"name": "boot", "volume": "vm-boot"}]
    found = facts(volumes={"vm-boot": {"size": GIB, "format": "qcow2", "users": []}})
    spec = normalize(params(raw), found)
    assert spec["swap"] == GIB
    swap = [vol for vol in spec["volumes"] if vol.get("swap")]
    assert len(swap) == 1 and swap[0]["size"] == GIB and swap[0]["device"] == "vdb"


def test_an_unchanged_swap_is_no_conflict_and_a_changed_one_is_refused():
    record = {"spec": {"name": "vm", "cpu": 1, "memory": 512 * MIB, "swap": GIB, "image": None, "volumes": [],
                       "network_interfaces": []}}
    current = {"cpu": 1, "memory": 512 * MIB}
    assert normalize(params({"name": "vm", "swap": "1Gi"}), facts(), record, current)["swap"] == GIB
    with pytest.raises(ConflictError) as info:
        normalize(params({"name": "vm", "swap": "2Gi"}), facts(), record, current)
    assert info.value.field == "swap" and "it is 1Gi" in info.value.message


@pytest.mark.parametrize("option, given", [("image", "/images/other.qcow2"), ("firmware", "uefi"),
                                           ("image_checksum", "1" * 64)])
def test_options_fixed_at_creation_are_refused_when_changed(option, given):
    record = {"spec": {"name": "web-1", "cpu": 1, "memory": 256 * MIB, "firmware": "bios",
                       "image": {"source": "/images/test.qcow2", "checksum": "0" * 64}, "volumes": [],
                       "network_interfaces": []}}
    with pytest.raises(ConflictError) as info:
        normalize(params({"name": "web-1", option: given}), facts(), record, {"cpu": 1})
    assert info.value.field == option


def test_every_capability_field_of_a_new_machine():
    spec_facts = facts(security_groups={"web": True})
    spec = normalize(params({"name": "web-1", "machine_class": "small", "image": "/images/test.qcow2",
                             "topology": {"sockets": 1, "cores": 1, "threads": 1},
                             "volumes": [{"name": "data", "size": "1Gi", "iops": 500, "throughput": 200}],
                             "network_interfaces": [{"name": "eth0", "network": "default",
                                                     "ip_address": "192.168.100.20", "security_groups": ["web"]}]}),
                     spec_facts)
    assert spec["topology"] == {"sockets": 1, "cores": 1, "threads": 1}
    assert spec["disk_qos"] == {"data": {"iops": 500, "throughput": 200}}
    assert spec["ip_reservations"] == {"eth0": "192.168.100.20"}
    assert spec["network_interfaces"][0]["security_groups"] == ["web"]


@pytest.mark.parametrize("raw, found, error, field", [
    ({"machine_class": "large"}, {}, NotFoundError, "machine_class"),
    ({"network_interfaces": [{"name": "e", "network": "nowhere"}]}, {}, NotFoundError,
     "network_interfaces[0].network"),
    ({"network_interfaces": [{"name": "e", "network": "default", "security_groups": ["web"]}]}, {},
     NotFoundError, "network_interfaces[0].security_groups[0]"),
    ({"network_interfaces": [{"name": "e", "network": "default", "ip_address": "10.9.9.9"}]}, {},
     ValidationError, "network_interfaces[0].ip_address"),
    ({"volumes": [{"name": "d", "volume": "missing"}]}, {}, NotFoundError, "volumes[0].volume"),
    ({"volumes": [{"name": "d", "volume": "used"}]},
     {"volumes": {"used": {"size": GIB, "format": "qcow2", "users": ["db-1"]}}}, ConflictError, "volumes[0].volume"),
    ({"volumes": [{"name": "d", "size": "1Gi"}]}, {"taken_volumes": {"web-1-d.qcow2"}}, ConflictError,
     "volumes[0].name"),
    ({"root_size": "512Mi"}, {}, ValidationError, "root_size"),
    ({"network_interfaces": [{"name": "e", "bridge": "br9"}]}, {"bridges": {"br9": (None, True)}},
     NotFoundError, "network_interfaces[0].bridge"),
    ({"network_interfaces": [], "wait": "address"}, {}, ValidationError, "wait"),
])
def test_what_the_pool_says_is_refused_naming_the_field(raw, found, error, field):
    base = {"name": "web-1", "machine_class": "small", "image": "/images/test.qcow2"}
    base.update(raw)
    with pytest.raises(error) as info:
        normalize(params(base), facts(**found))
    assert info.value.field == field


def test_an_unpublished_class_is_refused_with_the_classes_the_pool_publishes():
    prm = params({"name": "web-1", "machine_class": "huge", "image": "/images/test.qcow2"})
    with pytest.raises(NotFoundError) as raised:
        normalize(prm, facts(classes={"huge": None}, published_classes=["medium", "small"]))
    assert raised.value.field == "machine_class"
    assert "class 'huge' is not published on pool pool1; it publishes: medium, small" in raised.value.message
    with pytest.raises(NotFoundError, match="it publishes: none"):
        normalize(prm, facts(classes={"huge": None}))


def test_a_machine_the_pool_lacks_is_named_absent_when_no_size_is_given():
    """``state: running`` with no size, aimed at a pool the machine is not on (it moved away): the error says so
    rather than asking for a class, and marks the name for the module to look for it on its other pools."""
    message = refused("machine_class", normalize, params({"name": "web-1", "image": "/images/test.qcow2"}), facts())
    assert message == ("there is no machine web-1 on pool pool1; to create it there, give machine_class, or both "
                       "cpu and memory")


def test_an_existing_machine_keeps_what_the_user_leaves_out():
    record = {"spec": {"name": "web-1", "machine_class": "small", "cpu": 1, "memory": 256 * MIB,
                       "labels": {"app": "web"}, "firmware": "uefi", "boot_config": "abc", "topology": None,
                       "image": {"source": "/images/test.qcow2", "checksum": "0" * 64}, "volumes": [],
                       "network_interfaces": [], "swap": None}}
    spec = normalize(params({"name": "web-1"}), facts(classes={}), record, {"cpu": 2, "memory": 256 * MIB})
    assert (spec["cpu"], spec["labels"], spec["firmware"], spec["boot_config"]) == (2, {"app": "web"}, "uefi", "abc")
    assert spec["tolerations"] is None
    assert normalize(params({"name": "web-1", "tolerations": []}), facts(classes={}), record)["tolerations"] is None


def test_normalize_reads_nothing():
    """normalize is pure: it takes no context and its module names no libvirt call in it."""
    with open(machine_spec.__file__, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    pure = {"normalize", "_size", "_boot_config", "_volumes", "_swap", "_network", "_groups", "_reservation", "_nics",
            "_existing_capabilities", "check_wait", "check_fixed", "check_bridge"}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in pure:
            names = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
            assert not names & {"ctx", "lv", "storage", "sgs", "named_images", "open", "os"}, node.name


# --- one path: no literal default repeats what options.py declares -----------------------------------------------

def _declared_defaults():
    declared = {}
    for name in dir(options):
        table = getattr(options, name)
        if isinstance(table, tuple) and table and all(isinstance(item, options.Option) for item in table):
            for item in table:
                if item.default is not None and not isinstance(item.default, (bool, tuple)):
                    declared.setdefault(item.name, set()).add(item.default)
    return declared


def _repeated_defaults(path, declared):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = []
    for node in ast.walk(tree):
        key, value = None, None
        # params.get("wait_timeout") or 300
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2:
            left, right = node.values
            if isinstance(left, ast.Call) and getattr(left.func, "attr", None) == "get" and left.args and \
                    isinstance(left.args[0], ast.Constant) and isinstance(right, ast.Constant):
                key, value = left.args[0].value, right.value
        # params.get("shutdown_timeout", 60)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and len(node.args) == 2 and \
                all(isinstance(arg, ast.Constant) for arg in node.args):
            key, value = node.args[0].value, node.args[1].value
        if key in declared and value in declared[key]:
            found.append("%s:%d %s=%r" % (os.path.relpath(path, ROOT), node.lineno, key, value))
    return found


def test_no_literal_default_repeats_a_declared_one():
    """The dialects' modules are left out: a CRD's own default (vitistack's cores: 1, OpenShift's maxUnhealthy
    100%) is the dialect's, not a repeat of ours."""
    declared = _declared_defaults()
    paths = glob.glob(os.path.join(ROOT, "plugins", "module_utils", "machines", "*.py")) + \
        glob.glob(os.path.join(ROOT, "plugins", "module_utils", "fleets", "*.py")) + \
        [os.path.join(ROOT, "plugins", "module_utils", "manifests", "engine.py")] + \
        glob.glob(os.path.join(ROOT, "plugins", "modules", "machine*.py"))
    found = [hit for path in sorted(paths) for hit in _repeated_defaults(path, declared)]
    assert found == []


# --- an option added by its declaration: hostname ------------------------------------------------------------------

def test_hostname_is_checked_by_its_declaration_and_reaches_both_boot_configurations():
    refused("machines[0].hostname", params, {"name": "a", "hostname": "not a host"}, "machines[0]")
    spec = created(hostname="web.lab", ignition={"ignition": {"version": "3.4.0"}}, cloud_init={"user_data": {}})
    assert b'"path":"/etc/hostname"' in spec["ignition_data"] and b"data:,web.lab" in spec["ignition_data"]
    assert b"local-hostname: web.lab" in spec["seed_files"]["meta-data"]
    alone = created(hostname="web.lab")
    assert "ignition_data" not in alone and b"local-hostname: web.lab" in alone["seed_files"]["meta-data"]
    # a machine given no hostname has the boot configuration (and its hash) it always had
    assert created()["boot_config"] is None
    assert b"local-hostname: web-1" in created(cloud_init={"user_data": {}})["seed_files"]["meta-data"]


def test_a_changed_hostname_is_a_new_boot_configuration_and_an_unchanged_one_is_none():
    record = {"spec": {"name": "web-1", "cpu": 1, "memory": 256 * MIB, "image": None, "volumes": [],
                       "network_interfaces": [], "boot_config": "old"}}
    first = normalize(params({"name": "web-1", "hostname": "a.lab"}), facts(), record, {"cpu": 1})
    again = normalize(params({"name": "web-1", "hostname": "a.lab"}), facts(), record, {"cpu": 1})
    other = normalize(params({"name": "web-1", "hostname": "b.lab"}), facts(), record, {"cpu": 1})
    assert first["boot_config"] == again["boot_config"] != other["boot_config"]
    assert normalize(params({"name": "web-1"}), facts(), record, {"cpu": 1})["boot_config"] == "old"


def test_a_server_group_is_recorded_and_fixed_at_creation():
    group = {"name": "db", "policy": "anti-affinity"}
    spec = created(server_group=group)
    assert spec["server_group"] == group
    assert machine_spec.recorded_spec(spec, {})["server_group"] == group
    assert created()["server_group"] is None
    record = {"spec": {"name": "web-1", "cpu": 1, "memory": 256 * MIB, "server_group": group, "image": None,
                       "volumes": [], "network_interfaces": []}}
    # left out or repeated: kept; changed or given to a machine made without one: refused
    assert normalize(params({"name": "web-1"}), facts(), record, {"cpu": 1})["server_group"] == group
    assert normalize(params({"name": "web-1", "server_group": group}), facts(), record, {"cpu": 1})["server_group"] \
        == group
    without = {"spec": dict(record["spec"], server_group=None)}
    for other, old in (({"name": "db", "policy": "affinity"}, record), (group, without)):
        with pytest.raises(ConflictError) as info:
            normalize(params({"name": "web-1", "server_group": other}), facts(), old, {"cpu": 1})
        assert info.value.field == "server_group"
