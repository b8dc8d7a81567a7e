"""The machine capabilities of issue 13 as pure functions: validation ranges, XML mapping, desired values."""

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import elements as el
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError

from conftest import refused

RECORD = {"spec": {"volumes": [{"name": "data", "device": "vdb"}, {"name": "logs", "device": "vdc"}],
                   "network_interfaces": [{"name": "eth0", "mac": "52:54:00:00:00:01", "network": "machinery"},
                                          {"name": "eth1", "mac": "52:54:00:00:00:02", "bridge": "br0"}]}}
DOMAIN = """<domain type='qemu'><name>m</name><vcpu>4</vcpu><devices>
<disk type='file' device='disk'><source file='/p/m-root.qcow2'/><target dev='vda' bus='virtio'/>
  <alias name='ua-vol-root'/></disk>
<disk type='file' device='disk'><source file='/p/m-data.qcow2'/><target dev='vdb' bus='virtio'/>
  <iotune><total_bytes_sec>200000000</total_bytes_sec><total_iops_sec>500</total_iops_sec>
  <read_bytes_sec_max>1</read_bytes_sec_max></iotune><alias name='ua-vol-data'/></disk>
<disk type='file' device='disk'><source file='/p/m-logs.qcow2'/><target dev='vdc' bus='virtio'/>
  <alias name='ua-vol-logs'/></disk>
</devices></domain>"""
NETWORK = {"cidr": "192.168.100.0/24", "dhcp_start": "192.168.100.10", "dhcp_end": "192.168.100.254",
           "dhcp_hosts": [{"mac": "52:54:00:aa:bb:cc", "ip": "192.168.100.50", "name": "db-1"}]}
MAC = "52:54:00:00:00:01"


@pytest.mark.parametrize("given, cpu, expected", [
    ({"sockets": 2}, 2, {"sockets": 2, "cores": 1, "threads": 1}),
    ({"sockets": 1, "cores": 2, "threads": 2}, 4, {"sockets": 1, "cores": 2, "threads": 2}),
    ({"sockets": 16, "cores": 16, "threads": 1}, 256, {"sockets": 16, "cores": 16, "threads": 1}),
    (None, 3, None),
])
def test_topology_within_ranges(given, cpu, expected):
    assert cap.topology(given, cpu) == expected


@pytest.mark.parametrize("given, cpu, field, words", [
    ({"cores": 257}, 257, "topology.cores", "between 1 and 256"),
    ({"threads": 9}, 9, "topology.threads", "between 1 and 8"),
    ({"sockets": 17}, 17, "topology.sockets", "between 1 and 16"),
    ({"sockets": 0}, 1, "topology.sockets", "between 1 and 16"),
    ({"sockets": 2, "cores": 2}, 2, "topology", "2 x 2 x 1 = 4, which must equal cpu (2)"),
    ({"dies": 2}, 2, "topology", "unknown key dies"),
    ("2x2", 4, "topology", "mapping"),
])
def test_topology_refused_naming_the_field(given, cpu, field, words):
    assert words in refused(field, cap.topology, given, cpu)


def test_topology_xml_round_trip_keeps_libvirt_dies():
    tree = el.parse(DOMAIN)
    record = {"spec": {}}
    assert cap.read_topology(tree) is None
    cap.write_topology(tree, record, {"sockets": 2, "cores": 2, "threads": 1})
    assert cap.read_topology(tree) == {"sockets": 2, "cores": 2, "threads": 1}
    tree.find("cpu/topology").set("dies", "1")
    cap.write_topology(tree, record, {"sockets": 1, "cores": 4, "threads": 1})
    assert tree.find("cpu/topology").attrib == {"sockets": "1", "cores": "4", "threads": "1", "dies": "1"}
    assert record["spec"]["topology"] == {"sockets": 1, "cores": 4, "threads": 1}


@pytest.mark.parametrize("given, expected", [(None, None), (0, None), ("0", None), ("1Gi", 2 ** 30),
                                             ("1.5Mi", 2 * 2 ** 20)])
def test_swap_size(given, expected):
    assert cap.swap_bytes(given) == expected


@pytest.mark.parametrize("given", ["-1Gi", "1Ki", "lots"])
def test_swap_refused(given):
    refused("swap", cap.swap_bytes, given)


def test_swap_volume_is_found_by_its_serial():
    entry = cap.swap_volume("web-1", 2 ** 30)
    assert (entry["volume"], entry["serial"], entry["ephemeral"]) == ("web-1-swap.qcow2", "machinery-swap", True)


@pytest.mark.parametrize("key, value", [("iops", 99), ("iops", 64001), ("throughput", 124), ("throughput", 4001)])
def test_qos_ranges_are_declared_with_the_options(key, value):
    check = options.option(options.VOLUME, key).check
    refused("volumes[0].%s" % key, check, value, "volumes[0].%s" % key)
    low, high = check.range
    assert check(low, key) == low and check(high, key) == high


def test_disk_qos_read_and_written_in_place():
    tree = el.parse(DOMAIN)
    record = {"spec": {"volumes": [dict(vol) for vol in RECORD["spec"]["volumes"]]}}
    assert cap.read_disk_qos(tree, record) == {"data": {"iops": 500, "throughput": 200}}
    cap.write_disk_qos(tree, record, {"data": {"iops": None, "throughput": 300}, "logs": {"iops": 100,
                                                                                          "throughput": None}})
    assert cap.read_disk_qos(tree, record) == {"data": {"iops": None, "throughput": 300},
                                               "logs": {"iops": 100, "throughput": None}}
    data = tree.find("devices/disk[2]/iotune")
    assert data.findtext("read_bytes_sec_max") == "1"  # a limit of libvirt's own stays
    assert data.find("total_iops_sec") is None
    assert record["spec"]["volumes"][1] == {"name": "logs", "device": "vdc", "iops": 100, "throughput": None}
    cap.write_disk_qos(tree, record, {})
    assert cap.read_disk_qos(tree, record) == {} and tree.find("devices/disk[3]/iotune") is None


def test_desired_qos_lays_the_listed_volumes_over_the_current():
    volumes = RECORD["spec"]["volumes"]
    current = {"data": {"iops": 500, "throughput": 200}}
    assert cap.desired_disk_qos(volumes, None, current) == current
    assert cap.desired_disk_qos(volumes, [{"name": "data", "iops": 700}], current) == {
        "data": {"iops": 700, "throughput": 200}}
    assert cap.desired_disk_qos(volumes, [{"name": "logs", "throughput": 125}, {"name": "gone", "iops": 100}],
                                current) == dict(current, logs={"iops": None, "throughput": 125})
    wanted = cap.desired_disk_qos([{"name": "a", "iops": 100}, {"name": "b"}])
    assert wanted == {"a": {"iops": 100, "throughput": None}}
    assert cap.changed_disks(current, {"data": {"iops": 700, "throughput": 200}}) == ["data"]
    assert cap.iotune_values({"iops": None, "throughput": 125}) == {"total_iops_sec": 0,
                                                                    "total_bytes_sec": 125 * 10 ** 6}


def test_reservation_inside_the_range_and_free():
    assert cap.check_reservation("192.168.100.20", MAC, "machinery", NETWORK, [], "ip") == "192.168.100.20"
    # the NIC's own reservation and lease are no conflict
    assert cap.check_reservation("192.168.100.50", "52:54:00:aa:bb:cc", "machinery", NETWORK,
                                 [("52:54:00:aa:bb:cc", "192.168.100.50", None)], "ip") == "192.168.100.50"


@pytest.mark.parametrize("ip, leases, error, words", [
    ("10.0.0.5", [], ValidationError, "outside the DHCP range 192.168.100.10-192.168.100.254"),
    ("192.168.100.1", [], ValidationError, "outside the DHCP range"),
    ("192.168.100.255", [], ValidationError, "outside the DHCP range"),
    ("not-an-ip", [], ValidationError, "not an IPv4 address"),
    ("192.168.100.50", [], ConflictError, "reserved on network machinery for db-1"),
    ("192.168.100.60", [("52:54:00:99:99:99", "192.168.100.60", None)], ConflictError,
     "leased on network machinery to MAC 52:54:00:99:99:99; a lease outlives its guest"),
    # the lease's end, in UTC, when libvirt tells it
    ("192.168.100.60", [("52:54:00:99:99:99", "192.168.100.60", 1795000000)], ConflictError,
     "to MAC 52:54:00:99:99:99 until 2026-11-18T11:06:40Z;"),
])
def test_reservation_refused(ip, leases, error, words):
    with pytest.raises(error) as raised:
        cap.check_reservation(ip, MAC, "machinery", NETWORK, leases, "network_interfaces[0].ip_address")
    assert raised.value.field == "network_interfaces[0].ip_address" and words in raised.value.message


def test_reservations_desired_and_recorded():
    nics = [dict(nic) for nic in RECORD["spec"]["network_interfaces"]]
    nics[0]["ip_address"] = "192.168.100.20"
    assert cap.desired_reservations(nics) == {"eth0": "192.168.100.20"}
    assert cap.desired_reservations(nics, [{"name": "eth0", "ip_address": "192.168.100.21"}],
                                    {"eth0": "192.168.100.20"}) == {"eth0": "192.168.100.21"}
    record = {"spec": {"network_interfaces": nics}}
    cap.write_reservations(None, record, {"eth0": "192.168.100.30"})
    assert cap.read_reservations(None, record) == {"eth0": "192.168.100.30"}
    assert cap.host_entry(MAC, "192.168.100.30", "m") == '<host mac="%s" ip="192.168.100.30" name="m"/>' % MAC


def test_passphrase_never_empty_and_secret_is_private():
    refused("volumes[1].passphrase", cap.passphrase, "", "volumes[1].passphrase")
    xml = el.parse(cap.secret_xml("/p/m-secure.luks", "m"))
    assert xml.attrib == {"ephemeral": "no", "private": "yes"}
    assert xml.find("usage").get("type") == "volume" and xml.findtext("usage/volume") == "/p/m-secure.luks"


def test_luks_volume_xml_carries_only_the_secret_uuid():
    node = el.volume("m-secure.luks", 2 ** 20, "raw", secret="1234-uuid")
    assert node.find("target/encryption").get("format") == "luks"
    assert node.find("target/encryption/secret").attrib == {"type": "passphrase", "uuid": "1234-uuid"}


def test_passphrase_is_no_log_and_found_in_lists():
    assert ("volumes", "passphrase") in options.secret_paths(options.MACHINE)


def test_a_machine_with_pool_bound_capabilities_does_not_move():
    from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import unmovable
    unmovable("m", {"spec": {"volumes": [{"name": "data"}], "network_interfaces": [{"name": "eth0"}]}})
    with pytest.raises(ConflictError) as error:
        unmovable("m", {"spec": {"volumes": [{"name": "secure", "encrypted": True}]}})
    assert "secure" in error.value.message and error.value.field == "machine"
    with pytest.raises(ConflictError):
        unmovable("m", {"spec": {"network_interfaces": [{"name": "eth0", "ip_address": "192.168.100.20"}]}})


def test_hide_secrets_walks_the_volumes_of_a_batch_machine():
    from types import SimpleNamespace
    from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
    holder = SimpleNamespace(module=SimpleNamespace(no_log_values=set()))
    machine = {"name": "m", "volumes": [{"name": "a", "passphrase": "first secret"}, {"name": "b"},
                                        {"name": "c", "passphrase": "second secret"}],
               "cloud_init": {"user_data": "#!/bin/sh\necho hidden"}}
    MachineryModule.hide_secrets(holder, machine)
    assert {"first secret", "second secret", "#!/bin/sh\necho hidden"} <= holder.module.no_log_values
