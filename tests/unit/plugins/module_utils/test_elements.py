# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The element builders and readers: round trips, awkward names and paths, units, and libvirt's own schemas."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import elements as el

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")

# Everything XML has to escape or encode: both quotes, both angle brackets, ampersands, spaces, other letters.
AWKWARD = ["Grüße", "日本", "d'abord", 'say "hi"', "a<b&c", "x > y", "tab\tand space",
           "all 'of' \"them\" <at> & once: ü 日本"]


def round_trip(element):
    """The element as libvirt would receive it, parsed back the way the collection reads libvirt's answers."""
    text = el.to_string(element)
    assert isinstance(text, str)
    assert el.to_string(el.parse(text.encode("utf-8"))) == text
    return el.parse(text)


def domain_with(*devices, name="probe-of-devices"):
    """A minimal domain holding ``devices``, built with lxml like everything else."""
    root = el.etree.Element("domain", type="qemu")
    el.etree.SubElement(root, "name").text = name
    el.etree.SubElement(root, "memory", unit="KiB").text = "131072"
    os_node = el.etree.SubElement(root, "os")
    el.etree.SubElement(os_node, "type", arch="x86_64", machine="q35").text = "hvm"
    holder = el.etree.SubElement(root, "devices")
    for device in devices:
        holder.append(device)
    return root


# --- round trips with ordinary values -------------------------------------------------------------------------

def test_disk_round_trip():
    node = round_trip(el.disk("/pool/web-1-root.qcow2", "qcow2", "vda", alias="ua-vol-root", boot_order=1))
    assert el.read_disk(node) == {"alias": "ua-vol-root", "device": "vda", "bus": "virtio",
                                  "path": "/pool/web-1-root.qcow2", "format": "qcow2", "type": "disk",
                                  "readonly": False, "shareable": False, "boot_order": 1,
                                  "serial": None, "iotune": {}, "secret": None}
    assert node.find("driver").attrib == {"name": "qemu", "type": "qcow2", "discard": "unmap"}
    assert [child.tag for child in node] == ["driver", "source", "target", "boot", "alias"]


def test_cdrom_is_readonly_and_never_discards():
    node = round_trip(el.disk("/pool/web-1-cidata.iso", "raw", "sda", "sata", "ua-cidata", device="cdrom",
                              readonly=True))
    assert el.read_disk(node) == {"alias": "ua-cidata", "device": "sda", "bus": "sata",
                                  "path": "/pool/web-1-cidata.iso", "format": "raw", "type": "cdrom",
                                  "readonly": True, "shareable": False, "boot_order": None,
                                  "serial": None, "iotune": {}, "secret": None}
    assert node.find("driver").attrib == {"name": "qemu", "type": "raw"}


def test_shareable_disk_bypasses_the_host_cache():
    node = round_trip(el.disk("/pool/shared.raw", "raw", "sdb", "scsi", "ua-vol-shared", shareable=True))
    assert node.find("driver").attrib == {"name": "qemu", "type": "raw", "cache": "none"}
    assert el.read_disk(node)["shareable"] is True
    assert [child.tag for child in node] == ["driver", "source", "target", "shareable", "alias"]


def test_disk_with_serial_limits_and_luks_secret():
    node = round_trip(el.disk("/pool/m-data.qcow2", "raw", "vdb", alias="ua-vol-data", serial="machinery-swap",
                              iotune={"total_iops_sec": 500, "total_bytes_sec": 0}, secret="0f0e-uuid"))
    disk = el.read_disk(node)
    assert (disk["serial"], disk["iotune"], disk["secret"]) == ("machinery-swap", {"total_iops_sec": 500}, "0f0e-uuid")
    assert node.find("source/encryption").get("format") == "luks"
    assert node.find("source/encryption/secret").attrib == {"type": "passphrase", "uuid": "0f0e-uuid"}


def test_disk_without_alias_has_none():
    node = round_trip(el.disk("/pool/a.raw", "raw", "vdc"))
    assert node.find("alias") is None
    assert el.read_disk(node)["alias"] is None


def test_read_disks_of_a_domain_with_missing_children():
    tree = domain_with(el.disk("/pool/a.qcow2", "qcow2", "vda", alias="ua-vol-a"),
                       el.parse("<disk type='block' device='disk'><target dev='vdb' bus='virtio'/></disk>"))
    assert el.read_disks(round_trip(tree)) == [
        {"alias": "ua-vol-a", "device": "vda", "bus": "virtio", "path": "/pool/a.qcow2", "format": "qcow2",
         "type": "disk", "readonly": False, "shareable": False, "boot_order": None, "serial": None, "iotune": {},
         "secret": None},
        {"alias": None, "device": "vdb", "bus": "virtio", "path": None, "format": None, "type": "disk",
         "readonly": False, "shareable": False, "boot_order": None, "serial": None, "iotune": {}, "secret": None}]


def test_readers_of_the_xml_libvirt_gives_back():
    with open(os.path.join(GOLDEN, "web-1-libvirt.xml"), "rb") as handle:
        tree = el.parse(handle.read())
    disks = {disk["alias"]: disk for disk in el.read_disks(tree)}
    assert disks["ua-vol-root"]["boot_order"] == 1
    assert disks["ua-vol-root"]["path"] == "/pool/web-1-root.qcow2"
    assert disks["ua-cidata"]["readonly"] is True
    assert disks["ua-cidata"]["type"] == "cdrom"
    assert el.read_interfaces(tree)[0]["alias"] == "ua-nic-eth0"


def test_interface_round_trip():
    on_network = el.interface("52:54:00:01:02:03", network="machinery", alias="ua-nic-eth0")
    on_bridge = el.interface("52:54:00:01:02:04", "e1000e", bridge="br0", alias="ua-nic-eth1")
    tree = round_trip(domain_with(on_network, on_bridge))
    assert el.read_interfaces(tree) == [
        {"alias": "ua-nic-eth0", "mac": "52:54:00:01:02:03", "network": "machinery", "bridge": None,
         "model": "virtio", "type": "network", "filterref": None},
        {"alias": "ua-nic-eth1", "mac": "52:54:00:01:02:04", "network": None, "bridge": "br0",
         "model": "e1000e", "type": "bridge", "filterref": None}]
    assert [child.tag for child in on_network] == ["mac", "source", "model", "alias"]


def test_interface_filterref_set_and_removed():
    guarded = el.interface("52:54:00:01:02:03", network="machinery", alias="ua-nic-eth0", filterref="f1")
    assert [child.tag for child in guarded] == ["mac", "source", "model", "filterref", "alias"]
    assert el.read_interface(guarded)["filterref"] == "f1"
    el.set_filterref(guarded, "f2")
    assert [child.tag for child in guarded] == ["mac", "source", "model", "filterref", "alias"]
    assert el.read_interface(guarded)["filterref"] == "f2"
    el.set_filterref(guarded, None)
    assert el.read_interface(guarded)["filterref"] is None


def test_nwfilter_round_trip():
    rules = [{"action": "accept", "direction": "in", "priority": 500, "statematch": None, "protocol": "tcp",
              "match": {"dstportstart": "80", "comment": "c"}},
             {"action": "drop", "direction": "out", "priority": 1000, "statematch": "false", "protocol": "all",
              "match": {"comment": "c"}}]
    node = round_trip(el.nwfilter("f<&>", rules, ["inc"], uuid="u"))
    assert el.read_nwfilter(node) == {"name": "f<&>", "uuid": "u", "rules": rules, "filterrefs": ["inc"]}


@pytest.mark.parametrize("where", [{}, {"network": "machinery", "bridge": "br0"}, {"network": "", "bridge": None}])
def test_interface_needs_exactly_one_of_network_or_bridge(where):
    with pytest.raises(ValueError, match="exactly one of network or bridge"):
        el.interface("52:54:00:01:02:03", **where)


@pytest.mark.parametrize("args, attrib", [
    (("pci", "pcie-root", 0), {"type": "pci", "index": "0", "model": "pcie-root"}),
    (("pci", "pcie-root-port"), {"type": "pci", "model": "pcie-root-port"}),
    (("usb", "none"), {"type": "usb", "model": "none"}),
    (("scsi", "virtio-scsi"), {"type": "scsi", "model": "virtio-scsi"}),
    (("sata",), {"type": "sata"}),
])
def test_controller(args, attrib):
    node = round_trip(el.controller(*args))
    assert node.tag == "controller"
    assert dict(node.attrib) == attrib
    assert len(node) == 0


def test_storage_pool_round_trip():
    tree = round_trip(el.storage_pool("machinery", "/var/lib/machinery"))
    assert el.read_storage_pool(tree) == {"name": "machinery", "type": "dir", "path": "/var/lib/machinery",
                                          "mode": "0711"}
    assert el.read_storage_pool(round_trip(el.storage_pool("registry", "/srv/reg", mode="0700")))["mode"] == "0700"


def test_volume_round_trip():
    tree = round_trip(el.volume("web-1-root.qcow2", 10 * 2 ** 30, "qcow2", mode="0644",
                                backing=("/pool/image-abc.qcow2", "qcow2")))
    assert el.read_volume(tree) == {"name": "web-1-root.qcow2", "capacity": 10 * 2 ** 30, "allocation": 0,
                                    "format": "qcow2", "path": None, "mode": "0644",
                                    "backing": "/pool/image-abc.qcow2", "mtime": None}
    assert tree.find("backingStore/format").get("type") == "qcow2"


def test_plain_volume_has_no_permissions_or_backing():
    tree = round_trip(el.volume("seed.iso", 1, allocation=1))
    assert tree.find("target/permissions") is None
    assert tree.find("backingStore") is None
    assert el.read_volume(tree) == {"name": "seed.iso", "capacity": 1, "allocation": 1, "format": "raw",
                                    "path": None, "mode": None, "backing": None, "mtime": None}


def test_read_volume_as_libvirt_describes_it():
    tree = el.parse(b"""<volume type='file'>
  <name>lock</name>
  <key>/pool/lock</key>
  <capacity unit='bytes'>1</capacity>
  <allocation unit='bytes'>4096</allocation>
  <physical unit='bytes'>1</physical>
  <target>
    <path>/pool/lock</path>
    <format type='raw'/>
    <permissions><mode>0600</mode><owner>0</owner><group>0</group></permissions>
    <timestamps>
      <atime>1700000000.250000000</atime>
      <mtime>1700000001.500000000</mtime>
    </timestamps>
  </target>
</volume>""")
    assert el.read_volume(tree) == {"name": "lock", "capacity": 1, "allocation": 4096, "format": "raw",
                                    "path": "/pool/lock", "mode": "0600", "backing": None, "mtime": 1700000001.5}


@pytest.mark.parametrize("unit, factor", [
    (None, 1), ("b", 1), ("bytes", 1),
    ("k", 2 ** 10), ("K", 2 ** 10), ("KiB", 2 ** 10), ("KB", 10 ** 3),
    ("M", 2 ** 20), ("MiB", 2 ** 20), ("MB", 10 ** 6),
    ("G", 2 ** 30), ("GiB", 2 ** 30), ("GB", 10 ** 9),
    ("T", 2 ** 40), ("TiB", 2 ** 40), ("TB", 10 ** 12),
])
def test_read_volume_units(unit, factor):
    tree = el.parse("<volume><name>v</name><capacity%s>3</capacity><allocation unit='KiB'>2</allocation></volume>"
                    % ("" if unit is None else " unit='%s'" % unit))
    volume = el.read_volume(tree)
    assert volume["capacity"] == 3 * factor
    assert volume["allocation"] == 2048


def test_read_volume_rejects_an_unknown_unit():
    with pytest.raises(ValueError, match="furlong"):
        el.read_volume(el.parse("<volume><name>v</name><capacity unit='furlong'>3</capacity></volume>"))


def test_read_volume_with_missing_sizes():
    assert el.read_volume(el.parse("<volume><name>v</name></volume>")) == {
        "name": "v", "capacity": None, "allocation": None, "format": None, "path": None, "mode": None,
        "backing": None, "mtime": None}


def test_network_round_trip():
    tree = round_trip(el.network("machinery", "192.168.100.0/24"))
    assert el.read_network(tree) == {"name": "machinery", "mode": "nat", "cidr": "192.168.100.0/24",
                                     "gateway": "192.168.100.1", "dhcp_start": "192.168.100.10",
                                     "dhcp_end": "192.168.100.254", "dhcp_hosts": [], "bridge": None}
    assert tree.find("forward").attrib == {"mode": "nat"}


def test_isolated_network_has_no_forward():
    tree = round_trip(el.network("inner", "10.1.0.0/28", mode="isolated"))
    assert tree.find("forward") is None
    network = el.read_network(tree)
    assert (network["mode"], network["cidr"], network["dhcp_start"], network["dhcp_end"]) == \
        ("isolated", "10.1.0.0/28", "10.1.0.10", "10.1.0.14")


def test_tiny_network_starts_dhcp_at_the_second_last_host():
    network = el.read_network(round_trip(el.network("tiny", "10.2.0.0/29")))
    assert (network["gateway"], network["dhcp_start"], network["dhcp_end"]) == ("10.2.0.1", "10.2.0.5", "10.2.0.6")


def test_network_with_dhcp_hosts():
    hosts = [{"mac": "52:54:00:0a:0b:0c", "ip": "192.168.100.20", "name": "web-1"},
             {"mac": "52:54:00:0a:0b:0d", "ip": "192.168.100.21"}]
    tree = round_trip(el.network("machinery", "192.168.100.0/24", dhcp_hosts=hosts))
    assert el.read_network(tree)["dhcp_hosts"] == [
        {"mac": "52:54:00:0a:0b:0c", "ip": "192.168.100.20", "name": "web-1"},
        {"mac": "52:54:00:0a:0b:0d", "ip": "192.168.100.21", "name": None}]
    assert [node.tag for node in tree.find("ip/dhcp")] == ["range", "host", "host"]


@pytest.mark.parametrize("cidr, mode", [("192.168.100.0/24", "bridge"), ("fd00::/64", "nat"),
                                        ("192.168.100.1/24", "nat")])
def test_network_rejects_what_it_cannot_build(cidr, mode):
    with pytest.raises(ValueError):
        el.network("machinery", cidr, mode=mode)


def test_read_network_as_libvirt_describes_it():
    tree = el.parse("""<network>
  <name>default</name>
  <uuid>5a0c6d3e-1b2c-4d3e-8f90-a1b2c3d4e5f6</uuid>
  <forward/>
  <bridge name='virbr0' stp='on' delay='0'/>
  <mac address='52:54:00:aa:bb:cc'/>
  <ip family='ipv6' address='fd00::1' prefix='64'/>
  <ip address='192.168.122.1' prefix='24'>
    <dhcp>
      <range start='192.168.122.2' end='192.168.122.254'/>
      <host mac='52:54:00:00:00:09' name='db' ip='192.168.122.9'/>
    </dhcp>
  </ip>
</network>""")
    assert el.read_network(tree) == {"name": "default", "mode": "nat", "cidr": "192.168.122.0/24",
                                     "gateway": "192.168.122.1", "dhcp_start": "192.168.122.2",
                                     "dhcp_end": "192.168.122.254", "bridge": "virbr0",
                                     "dhcp_hosts": [{"mac": "52:54:00:00:00:09", "ip": "192.168.122.9",
                                                     "name": "db"}]}


def test_read_network_other_forward_modes_and_no_ip():
    network = el.read_network(el.parse("<network><name>r</name><forward mode='route'/></network>"))
    assert network == {"name": "r", "mode": "route", "cidr": None, "gateway": None, "dhcp_start": None,
                       "dhcp_end": None, "dhcp_hosts": [], "bridge": None}


def test_probe_domain():
    tree = round_trip(el.probe_domain("machinery-kvm-probe", "/boot/vmlinuz", "/pool/machinery-kvm-probe.log"))
    assert tree.get("type") == "kvm"
    assert tree.findtext("name") == "machinery-kvm-probe"
    assert (tree.find("memory").get("unit"), tree.findtext("memory")) == ("MiB", "128")
    assert tree.find("os/type").attrib == {"arch": "x86_64", "machine": "q35"}
    assert tree.findtext("os/kernel") == "/boot/vmlinuz"
    assert tree.findtext("os/cmdline") == "console=ttyS0 panic=-1"
    assert tree.findtext("on_reboot") == "destroy"
    assert tree.find("devices/serial").get("type") == "file"
    assert tree.find("devices/serial/source").get("path") == "/pool/machinery-kvm-probe.log"
    assert tree.find("devices/memballoon").get("model") == "none"
    assert el.probe_domain("p", "/k", "/l", memory_mib=256).findtext("memory") == "256"


def test_parse_accepts_str_and_bytes_and_expands_no_entities():
    assert el.parse("<name>日本</name>").text == "日本"
    assert el.parse("<name>日本</name>".encode("utf-8")).text == "日本"
    tree = el.parse(b"<!DOCTYPE n [<!ENTITY e SYSTEM 'file:///nonexistent'>]><n>&e;</n>")
    assert not (tree.text or "").strip()


# --- names and paths with every character XML cares about -----------------------------------------------------

@pytest.mark.parametrize("text", AWKWARD)
def test_disk_carries_any_text(text):
    path = "/pool/%s/disk one.qcow2" % text
    node = round_trip(el.disk(path, text, text, bus=text, alias=text, device=text, readonly=True, shareable=True))
    assert el.read_disk(node) == {"alias": text, "device": text, "bus": text, "path": path, "format": text,
                                  "type": text, "readonly": True, "shareable": True, "boot_order": None,
                                  "serial": None, "iotune": {}, "secret": None}
    assert el.read_disks(round_trip(domain_with(el.disk(path, "raw", "vda"), name=text)))[0]["path"] == path


@pytest.mark.parametrize("text", AWKWARD)
@pytest.mark.parametrize("kind", ["network", "bridge"])
def test_interface_carries_any_text(text, kind):
    node = round_trip(domain_with(el.interface(text, model=text, alias=text, **{kind: text})))
    other = "bridge" if kind == "network" else "network"
    assert el.read_interfaces(node) == [{"alias": text, "mac": text, kind: text, other: None, "model": text,
                                         "type": kind, "filterref": None}]


@pytest.mark.parametrize("text", AWKWARD)
def test_controller_carries_any_text(text):
    assert dict(round_trip(el.controller(text, model=text, index=text)).attrib) == \
        {"type": text, "index": text, "model": text}


@pytest.mark.parametrize("text", AWKWARD)
def test_storage_pool_carries_any_text(text):
    path = "/srv/%s/pool" % text
    assert el.read_storage_pool(round_trip(el.storage_pool(text, path, mode=text))) == \
        {"name": text, "type": "dir", "path": path, "mode": text}


@pytest.mark.parametrize("text", AWKWARD)
def test_volume_carries_any_text(text):
    backing = "/pool/%s.qcow2" % text
    tree = round_trip(el.volume(text, 5, fmt=text, mode=text, backing=(backing, text)))
    assert el.read_volume(tree) == {"name": text, "capacity": 5, "allocation": 0, "format": text, "path": None,
                                    "mode": text, "backing": backing, "mtime": None}
    assert tree.find("backingStore/format").get("type") == text


@pytest.mark.parametrize("text", AWKWARD)
def test_network_carries_any_text(text):
    hosts = [{"mac": text, "ip": text, "name": text}]
    network = el.read_network(round_trip(el.network(text, "10.3.0.0/24", dhcp_hosts=hosts)))
    assert network["name"] == text
    assert network["dhcp_hosts"] == hosts


@pytest.mark.parametrize("text", AWKWARD)
def test_probe_domain_carries_any_text(text):
    kernel, log_path = "/boot/%s/vmlinuz" % text, "/pool/%s.log" % text
    tree = round_trip(el.probe_domain(text, kernel, log_path))
    assert (tree.findtext("name"), tree.findtext("os/kernel"), tree.find("devices/serial/source").get("path")) == \
        (text, kernel, log_path)


# --- libvirt's own schemas ------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("virt-xml-validate") is None or shutil.which("xmllint") is None,
                    reason="virt-xml-validate (libvirt-clients) or the xmllint it runs (libxml2-utils) is absent")
@pytest.mark.parametrize("text", ["plain", AWKWARD[-1]])
def test_libvirt_schemas_accept_what_the_builders_make(tmp_path, text):
    """Names and paths take any text; aliases, bridges and MACs have patterns of their own, so they stay plain."""
    devices = [el.controller("pci", "pcie-root", 0), el.controller("pci", "pcie-root-port"),
               el.controller("usb", "none"), el.controller("scsi", "virtio-scsi"),
               el.disk("/pool/%s/root.qcow2" % text, "qcow2", "vda", alias="ua-vol-root", boot_order=1),
               el.disk("/pool/%s/shared.raw" % text, "raw", "sdb", "scsi", "ua-vol-shared", shareable=True),
               el.disk("/pool/%s/cidata.iso" % text, "raw", "sda", "sata", "ua-cidata", device="cdrom",
                       readonly=True),
               el.interface("52:54:00:01:02:03", network=text, alias="ua-nic-eth0"),
               el.interface("52:54:00:01:02:04", "e1000e", bridge="br0", alias="ua-nic-eth1")]
    documents = [
        ("domain", domain_with(*devices, name=text)),
        ("domain", el.probe_domain(text, "/boot/%s/vmlinuz" % text, "/pool/%s.log" % text)),
        ("storagepool", el.storage_pool(text, "/srv/%s" % text)),
        ("storagevol", el.volume(text, 2 ** 30, "qcow2", mode="0600", backing=("/pool/%s.img" % text, "raw"))),
        ("network", el.network(text, "192.168.100.0/24",
                               dhcp_hosts=[{"mac": "52:54:00:01:02:03", "ip": "192.168.100.20", "name": text},
                                           {"mac": "52:54:00:01:02:04", "ip": "192.168.100.21"}])),
        ("network", el.network(text, "10.4.0.0/28", mode="isolated")),
    ]
    for number, (schema, element) in enumerate(documents):
        path = tmp_path / ("%d-%s.xml" % (number, schema))
        path.write_text(el.to_string(element), encoding="utf-8")
        result = subprocess.run(["virt-xml-validate", str(path), schema], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, "%s\n%s%s" % (el.to_string(element), result.stdout, result.stderr)
