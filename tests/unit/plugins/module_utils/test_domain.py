import copy
import os

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
RECORD = {"version": 1, "created": "2026-01-01T00:00:00+00:00", "boots": 0, "last_error": None,
          "spec": {"name": "web-1", "machine_class": "small", "cpu": 1, "memory": 128 * 2 ** 20,
                   "labels": {"app": "web"}, "boot_config": "abc", "firmware": "bios", "tolerations": None,
                   "topology": None, "run_strategy": "always"}}


def plan(**overrides):
    base = {"name": "web-1", "virt_type": "qemu", "cpu": 1, "memory": 128 * 2 ** 20, "firmware": "bios",
            "record": copy.deepcopy(RECORD),
            "disks": [{"name": "root", "path": "/pool/web-1-root.qcow2", "format": "qcow2", "device": "vda",
                       "boot": True},
                      {"name": "data", "path": "/pool/web-1-data.qcow2", "format": "qcow2", "device": "vdb",
                       "bus": "virtio"}],
            "nics": [{"name": "eth0", "network": "machinery", "mac": "52:54:00:01:02:03", "model": "virtio"}],
            "ignition_path": "/pool/web-1-ignition.json", "seed_path": "/pool/web-1-cidata.iso",
            "console_path": "/pool/web-1-console.log"}
    base.update(overrides)
    return base


def spec(**overrides):
    """The spec of the machine the plan builds: its record's, with the firmware it has."""
    return dict(RECORD["spec"], **overrides)


def golden(name):
    with open(os.path.join(GOLDEN, name)) as handle:
        return handle.read()


def pretty(tree):
    from lxml import etree
    return etree.tostring(tree, pretty_print=True, encoding="unicode")


def test_build_matches_golden():
    assert pretty(options.build_tree(plan(), spec())) == golden("web-1.xml")


def test_uefi_kvm_golden():
    inputs = plan(firmware="uefi", virt_type="kvm", ignition_path=None, seed_path=None)
    tree = options.build_tree(inputs, spec(firmware="uefi"))
    assert pretty(tree) == golden("web-1-uefi-kvm.xml")


def test_record_round_trip():
    tree = dx.parse(golden("web-1.xml"))
    assert dx.read_record(tree) == RECORD


def test_foreign_domain_has_no_record():
    assert dx.read_record(dx.parse("<domain type='kvm'><name>x</name></domain>")) is None
    broken = "<domain><name>x</name><metadata><m:machine xmlns:m='%s'>{oops</m:machine></metadata></domain>"
    assert dx.read_record(dx.parse(broken % dx.NAMESPACE)) is None


def test_owned_values_and_edit_in_place():
    # libvirt's own additions (uuid, addresses, emulator) must survive an edit of owned fields.
    tree = dx.parse(golden("web-1-libvirt.xml"))
    record = dx.read_record(tree)
    assert options.owned_values(tree, record) == {"cpu": 1, "memory": 128 * 2 ** 20, "machine_class": "small",
                                                  "labels": {"app": "web"}, "tolerations": None,
                                                  "boot_config": "abc", "topology": None, "disk_qos": {},
                                                  "ip_reservations": {}, "run_strategy": None, "tpm": False}
    desired = {"cpu": 2, "memory": 256 * 2 ** 20, "labels": {"app": "db"}, "machine_class": "small",
               "boot_config": "abc"}
    names = options.changed_fields(options.owned_values(tree, record), desired)
    assert names == ["machine_class", "cpu", "memory", "labels"][1:]
    options.apply_fields(tree, record, desired, names)
    assert pretty(tree) == golden("web-1-libvirt-edited.xml")
    assert options.changed_fields(options.owned_values(tree, dx.read_record(tree)), desired) == []


def test_changed_fields_ignores_unset():
    tree = dx.parse(golden("web-1.xml"))
    assert options.changed_fields(options.owned_values(tree, dx.read_record(tree)), {"cpu": 1}) == []


def test_record_xml_has_no_namespace_of_its_own():
    # virDomainSetMetadata adds the namespace itself and refuses an element that already declares it.
    assert "xmlns" not in dx.record_xml(RECORD)


def test_derived_mac_is_stable_and_local():
    mac = dx.derive_mac("web-1", "eth0")
    assert mac == dx.derive_mac("web-1", "eth0")
    assert mac != dx.derive_mac("web-2", "eth0")
    assert mac.startswith("52:54:00:")


@pytest.mark.parametrize("taken,count,expected", [
    ((), 3, ["vda", "vdb", "vdc"]),
    (("vda", "vdc"), 2, ["vdb", "vdd"]),
    (tuple("vd" + chr(c) for c in range(ord("a"), ord("z") + 1)), 2, ["vdaa", "vdab"]),
])
def test_device_names(taken, count, expected):
    assert dx.device_names(count, taken) == expected


def test_boot_config_hash():
    assert dx.boot_config_hash(None, None, None) is None
    first = dx.boot_config_hash('{"a":1}', None, None)
    assert first == dx.boot_config_hash('{"a":1}', None, None)
    assert first != dx.boot_config_hash('{"a":2}', None, None)
