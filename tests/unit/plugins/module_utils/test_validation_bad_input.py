"""The checks that refuse bad input before anything is written (issue 10), as pure functions."""

import random
import struct

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.fleets.batch import converge as batch_converge
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, NotFoundError)
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import host_bridge
from ansible_collections.machinery.compute.plugins.module_utils.pools.pool_registration import (
    check_host_overlaps, normalize_networks, normalize_taints, plan_pool)
from ansible_collections.machinery.compute.plugins.lookup.scheduler import validated

from conftest import pool_seen, refused


def normalize_machine(term, keys=True):
    """A lookup term validated as the lookup validates it (keys=None: a batch's machine)."""
    if keys is None:
        return machine_spec.params(term, "machines[0]", scheduling=True)
    return validated([term])[0]


GIB = 2 ** 30


# --- labels, taints, numbers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, 3, 1.1, ["a"], {"a": "b"}])
def test_label_values_are_strings_never_stringified(value):
    assert "quote it" in refused("labels.app", check.labels, {"app": value})


def test_label_keys_are_strings_and_null_values_are_empty():
    refused("labels.1", check.labels, {1: "a"})
    assert check.labels({"app": None, "example.com/tier": "web"}) == {"app": "", "example.com/tier": "web"}


@pytest.mark.parametrize("taint, field", [({"key": "a b<"}, "taints[0].key"), ({"key": "a", "value": "x y"}, "taints[0].value"),
                                          ({"key": "a", "value": 1}, "taints[0].value"), ({"key": ""}, "taints[0].key")])
def test_taints_follow_the_label_rules(taint, field):
    refused(field, normalize_taints, [taint])


def test_a_taint_per_key_and_effect():
    assert normalize_taints([{"key": "gpu"}, {"key": "gpu", "effect": "NoExecute"}])[1]["effect"] == "NoExecute"
    refused("taints[1].key", normalize_taints, [{"key": "gpu", "value": "a"}, {"key": "gpu", "value": "b"}])


@pytest.mark.parametrize("value", [-5, 0, True, "soon"])
def test_a_wait_timeout_is_positive_seconds(value):
    refused("wait_timeout", check.timeout_seconds, value, "wait_timeout")


def test_zero_means_at_once_only_where_allowed():
    assert check.timeout_seconds(0, "shutdown_timeout", allow_zero=True) == 0
    refused("shutdown_timeout", check.timeout_seconds, -1, "shutdown_timeout", allow_zero=True)
    assert check.whole_number("7", "workers", 1, 256) == 7


@pytest.mark.parametrize("workers, retries, field", [(0, 3, "workers"), (16, -1, "retries"), (1000, 3, "workers")])
def test_batch_bounds_are_checked_before_any_pool_is_opened(workers, retries, field):
    refused(field, batch_converge, [{"name": "x", "uri": "qemu:///nowhere-checked"}], [], retries=retries,
            workers=workers)


# --- URIs --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("uri", ["qemu:///system", "qemu+ssh://root@h1/system", "qemu+tls://h1/system",
                                 "qemu+unix:///system?socket=/run/x/libvirt-sock", "qemu:///session",
                                 "qemu+libssh2://root@h1:2222/system?known_hosts=/k", "test:///default"])
def test_uris_of_qemu_hosts_pass(uri):
    assert lv.validate_uri(uri) == uri


@pytest.mark.parametrize("uri, words", [("foo://", "qemu+ssh://"), ("xen:///system", "scheme xen"),
                                        ("qemu:///sytem", "/sytem"), ("qemu+ssh://root@host", "/system"),
                                        ("qemu+ssh://host/system/", "/system/"), ("qemu system", "libvirt URI")])
def test_other_uris_are_refused_up_front(uri, words):
    assert words in refused("uri", lv.validate_uri, uri)


# --- images ------------------------------------------------------------------------------------------------------------

def qcow2(version=3, backing=0, cluster_bits=16, size=GIB, crypt=0):
    return struct.pack(">4sIQIIQI", b"QFI\xfb", version, backing, 0, cluster_bits, size, crypt).ljust(4096, b"\0")


def raw(offset, magic, size=1 << 20):
    data = bytearray(size)
    data[offset:offset + len(magic)] = magic
    return bytes(data)


def image_format(data):
    return check.disk_image(data[:check.IMAGE_HEADER_BYTES], len(data))


def test_qcow2_images_pass_when_they_stand_alone():
    assert image_format(qcow2()) == "qcow2"
    assert "backing file" in refused("image", image_format, qcow2(backing=0x200))
    assert "encrypted" in refused("image", image_format, qcow2(crypt=2))
    assert "version 9" in refused("image", image_format, qcow2(version=9))
    assert "corrupt" in refused("image", image_format, qcow2(cluster_bits=40))
    refused("image", image_format, b"QFI\xfb\0\0\0\3")


@pytest.mark.parametrize("offset, magic", [(510, b"\x55\xaa"), (512, b"EFI PART"), (1080, b"\x53\xef"), (0, b"XFSB"),
                                           (0x8001, b"CD001"), (0x10040, b"_BHRfS_M"), (0, b"hsqs")])
def test_raw_disks_carry_a_partition_table_or_a_file_system(offset, magic):
    assert image_format(raw(offset, magic)) == "raw"


def test_anything_else_is_refused():
    assert "no partition table" in refused("image", image_format, random.Random(3).randbytes(3 << 20))
    assert "no partition table" in refused("image", image_format, bytes(1 << 20))
    assert "512-byte sectors" in refused("image", image_format, raw(510, b"\x55\xaa", size=(1 << 20) + 1))
    assert "0 bytes" in refused("image", image_format, b"")
    assert "VMDK" in refused("volumes[0].image", check.disk_image, b"KDMV" + bytes(600), 1 << 20, "volumes[0].image")


# --- networks ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cidr, words", [("127.0.0.0/24", "loopback"), ("126.0.0.0/7", "loopback"),
                                         ("169.254.0.0/24", "link-local"), ("239.0.0.0/16", "multicast"),
                                         ("240.1.0.0/16", "reserved"), ("0.0.0.0/24", "this network"),
                                         ("10.0.0.0/29", "/28"), ("10.0.0.1/24", "host bits"), ("fd00::/64", "IPv6"),
                                         ("banana", "IPv4 subnet")])
def test_reserved_and_malformed_subnets_are_refused(cidr, words):
    assert words in refused("networks[0].cidr", check.network_cidr, cidr, "networks[0].cidr")


def test_networks_of_one_request_do_not_overlap_each_other_or_the_host():
    refused("networks[1].cidr", normalize_networks, [{"name": "a", "cidr": "10.1.0.0/16"},
                                                     {"name": "b", "cidr": "10.1.2.0/24"}])
    refused("networks[1].name", normalize_networks, ["a", "a"])
    wanted = normalize_networks([{"name": "machinery"}, {"name": "b", "cidr": "192.168.100.128/25"}])
    with pytest.raises(ConflictError) as info:
        check_host_overlaps(wanted, {"machinery": "192.168.100.0/24", "other": None})
    assert info.value.field == "networks[1].cidr" and "machinery" in info.value.message
    # a network the host has already is not created, so its own subnet is no clash
    check_host_overlaps(normalize_networks([{"name": "machinery", "cidr": "192.168.100.0/24"}]),
                        {"machinery": "192.168.100.0/24"})


def test_a_pool_with_machines_keeps_its_name():
    registration = {"name": "hv1", "labels": {}, "taints": [], "networks": []}
    with pytest.raises(ConflictError) as info:
        plan_pool({"name": "hv2"}, pool_seen(registration, machines=["web-1"]))
    assert info.value.field == "name" and "web-1" in info.value.message
    assert plan_pool({"name": "hv2"}, pool_seen(registration)).summaries() == ["register"]


def test_a_new_network_on_a_host_subnet_is_refused_by_the_plan():
    with pytest.raises(ConflictError) as info:
        plan_pool({"name": "hv1", "networks": [{"name": "new", "cidr": "10.5.0.0/24"}]},
                  pool_seen(None, host_networks={"default": "10.5.0.0/16"}))
    assert info.value.field == "networks[0].cidr"


# --- host bridges ------------------------------------------------------------------------------------------------------

class Interface:
    def __init__(self, name, kind):
        self._name, self.kind = name, kind

    def name(self):
        return self._name

    def XMLDesc(self, _flags):  # pylint: disable=invalid-name
        return "<interface type='%s' name='%s'/>" % (self.kind, self._name)


class Device:
    def __init__(self, interface):
        self.interface = interface

    def name(self):
        return "net_%s_52_54_00_00_00_01" % self.interface

    def XMLDesc(self, _flags):  # pylint: disable=invalid-name
        return "<device><capability type='net'><interface>%s</interface></capability></device>" % self.interface


class Host:
    """A libvirt connection that knows interfaces (None: no interface driver) and node devices."""

    def __init__(self, interfaces=None, devices=()):
        self.interfaces, self.devices = interfaces, devices

    def listAllInterfaces(self, _flags):  # pylint: disable=invalid-name
        if self.interfaces is None:
            raise lv.libvirt.libvirtError("this function is not supported by the connection driver")
        return self.interfaces

    def listAllDevices(self, _flags):  # pylint: disable=invalid-name
        return [Device(name) for name in self.devices]


class Context:
    def __init__(self, conn):
        self.conn, self.name, self.uri = conn, "hv1", "qemu:///system"


def test_a_bridge_must_exist_on_the_host_and_be_a_bridge():
    host = Host([Interface("lo", "ethernet"), Interface("br0", "bridge")])
    assert host_bridge(Context(host), "br0", "f") == "br0"
    with pytest.raises(NotFoundError) as info:
        host_bridge(Context(host), "br-nope", "network_interfaces[0].bridge")
    assert info.value.field == "network_interfaces[0].bridge"
    assert "not a bridge" in refused("f", host_bridge, Context(host), "lo", "f")


def test_node_devices_answer_for_interfaces_netcf_does_not_list():
    assert host_bridge(Context(Host([], devices=["br1"])), "br1", "f") == "br1"
    assert host_bridge(Context(Host(None, devices=["br1"])), "br1", "f") == "br1"
    with pytest.raises(NotFoundError):
        host_bridge(Context(Host(None, devices=["eth0"])), "br1", "f")
    # a host whose libvirt can tell nothing is left to libvirt
    assert host_bridge(Context(Host(None)), "br1", "f") == "br1"


# --- cloud-init and scheduler specs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("config, field", [("version: 3", "cloud_init.network_config.version"),
                                           ({"ethernets": {}}, "cloud_init.network_config.version"),
                                           ({"network": {"version": True}}, "cloud_init.network_config.version"),
                                           ({"version": 1}, "cloud_init.network_config.config"),
                                           ({"version": 2, "ethernets": ["eth0"]}, "cloud_init.network_config.ethernets"),
                                           ("version: [", "cloud_init.network_config"), ("- 1", "cloud_init.network_config")])
def test_network_config_is_checked_as_cloud_init_reads_it(config, field):
    refused(field, seed.nocloud_files, "web-1", {"network_config": config})


def test_good_network_config_and_meta_data_are_written_as_given():
    files = seed.nocloud_files("web-1", {"network_config": "network:\n  version: 2\n  ethernets: {}\n",
                                         "meta_data": "instance-id: a\n"})
    assert files["network-config"].startswith(b"network:") and files["meta-data"] == b"instance-id: a\n"
    seed.check_network_config({"version": 1, "config": [{"type": "physical", "name": "eth0"}]})


def test_yaml_errors_name_the_line_not_the_secret():
    message = refused("cloud_init.user_data", seed.user_data_text, "#cloud-config\npasswords: [s3cret\n")
    assert "at line 3" in message and "s3cret" not in message
    assert "mapping" in refused("cloud_init.meta_data", seed.nocloud_files, "web-1", {"meta_data": "- a"})


def test_scheduler_specs_refuse_unknown_keys():
    assert "tolerance" in refused("terms[0]", normalize_machine, {"name": "a", "machine_class": "s", "tolerance": []})
    assert normalize_machine({"name": "a", "machine_class": "s", "image": "x"}, keys=None)["name"] == "a"
    refused("terms[0].tolerations[0]", normalize_machine,
            {"name": "a", "machine_class": "s", "tolerations": [{"key": "a", "opertor": "Exists"}]})


@pytest.mark.parametrize("toleration, field", [({"key": "a b"}, "key"), ({"key": "a", "value": 1}, "value"),
                                               ({"key": "a", "operator": "Exists", "value": "b"}, "value"),
                                               ({"operator": "Equal"}, "key")])
def test_tolerations_follow_kubernetes(toleration, field):
    refused("terms[0].tolerations[0]." + field, normalize_machine,
            {"name": "a", "machine_class": "s", "tolerations": [toleration]})


def test_selectors_are_labels():
    refused("terms[0].machine_pool_selector.ssd", normalize_machine,
            {"name": "a", "machine_class": "s", "machine_pool_selector": {"ssd": True}})
    assert normalize_machine({"name": "a", "machine_class": "s", "machine_pool_selector": {"ssd": "true"}})[
        "machine_pool_selector"] == {"ssd": "true"}


def test_a_new_volume_empty_or_of_an_image_can_be_encrypted_an_existing_one_cannot():
    def machine(volume):
        return {"name": "web-1", "cpu": 1, "memory": "128Mi", "network_interfaces": [],
                "volumes": [dict(volume, name="boot", encrypted=True, passphrase="correct horse")]}
    for volume in ({"size": "1Gi"}, {"image": "/images/a.qcow2"}, {"image": "/images/a.qcow2", "size": "2Gi"}):
        assert normalize_machine(machine(volume), keys=None)["volumes"][0]["encrypted"] is True
    assert "not an existing one" in refused("machines[0].volumes[0].encrypted", normalize_machine,
                                            machine({"volume": "shared-1"}), None)
    refused("machines[0].volumes[0].passphrase", normalize_machine,
            {"name": "web-1", "cpu": 1, "memory": "128Mi", "volumes": [{"name": "r", "image": "/i.qcow2",
                                                                        "encrypted": True}]}, None)
