"""volume_attach and nic_attach: lifecycle, hot-plug proven by the guest, ephemeral vs referenced, bad input."""

import libvirt

from conftest import assert_failed, warnings_of


def disks(pool, name, live=False):
    dom = pool.domain(name)
    xml = dom.XMLDesc(0 if live else libvirt.VIR_DOMAIN_XML_INACTIVE)
    return xml.count("<disk type='file' device='disk'>"), xml


def make(module, pool, image, name, **extra):
    module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
    result = module("machine", uri=pool.uri, name=name, machine_class="small", image=image,
                    **dict({"state": "present", "network_interfaces": []}, **extra))
    assert result["changed"], result
    return result


def test_volume_lifecycle_on_a_stopped_machine(pool, module, image):
    make(module, pool, image, "att-stopped")
    volume = "att-stopped-data.qcow2"
    args = dict(uri=pool.uri, machine="att-stopped", volume=volume, size="32Mi", ephemeral=True)
    try:
        planned = module("volume_attach", check=True, **args)
        assert planned["changed"] is True
        assert volume not in pool.volumes()
        assert disks(pool, "att-stopped")[0] == 1

        made = module("volume_attach", **args)
        assert made["changed"] is True and made["volume"]["device"] == "vdb"
        assert made["volume"]["state"] == "Attached"
        count, xml = disks(pool, "att-stopped")
        assert count == 2 and volume in xml and "ua-vol-att-stopped-data-qcow2" in xml
        assert volume in pool.volumes()
        assert module("volume_attach", **args)["changed"] is False

        grown = module("volume_attach", **dict(args, size="64Mi"))
        assert grown["changed"] is True
        assert grown["diff"] == {"before": {"size": "32Mi"}, "after": {"size": "64Mi"}}
        storage = pool.conn.storagePoolLookupByName("machinery")
        assert storage.storageVolLookupByName(volume).info()[1] == 64 * 2 ** 20
        shrink = module("volume_attach", **dict(args, size="16Mi"))
        assert shrink["changed"] is False and any("never shrunk" in w for w in warnings_of(shrink))

        detached = module("volume_attach", uri=pool.uri, machine="att-stopped", volume=volume, state="detached")
        assert detached["changed"] is True
        assert disks(pool, "att-stopped")[0] == 1
        assert volume not in pool.volumes()  # an ephemeral volume has no life apart from its machine
        assert module("volume_attach", uri=pool.uri, machine="att-stopped", volume=volume,
                      state="detached")["changed"] is False
    finally:
        module("machine", uri=pool.uri, name="att-stopped", state="absent")
        pool.conn.storagePoolLookupByName("machinery").refresh(0)
        if volume in pool.volumes():
            pool.conn.storagePoolLookupByName("machinery").storageVolLookupByName(volume).delete(0)


def test_hot_plug_proven_in_the_guest(registered, module, image):
    pool = registered[1]
    name = "att-live"
    made = make(module, pool, image, name, state="running", wait="address", wait_timeout=180,
                network_interfaces=[{"name": "eth0", "network": "machinery"}])
    try:
        pool.wait_console(name, "MACHINERY-READY", timeout=120)
        plugged = module("volume_attach", uri=pool.uri, machine=name, volume=name + "-hot.qcow2", size="64Mi",
                         ephemeral=True)
        assert plugged["changed"] is True and plugged["volume"]["state"] == "Attached"
        assert name + "-hot.qcow2" in disks(pool, name, live=True)[1]
        console = pool.wait_console(name, "MACHINERY-BLOCK-ADDED vdb 131072")

        nic = module("nic_attach", uri=pool.uri, machine=name, name="eth1", network="machinery", wait="address",
                     wait_timeout=120)
        assert nic["changed"] is True, nic
        assert nic["network_interface"]["state"] == "Attached"
        mac = nic["network_interface"]["mac"]
        address = nic["network_interface"]["ip_addresses"][0]
        console = pool.wait_console(name, "MACHINERY-NIC-ADDED eth1 %s" % mac)
        console = pool.wait_console(name, "MACHINERY-ADDRESS eth1 %s" % address)
        assert {lease["mac"]: lease["ipaddr"] for lease in pool.leases()}[mac] == address
        assert module("nic_attach", uri=pool.uri, machine=name, name="eth1", network="machinery")["changed"] is False

        unplugged = module("volume_attach", uri=pool.uri, machine=name, volume=name + "-hot.qcow2",
                           state="detached")
        assert unplugged["changed"] is True
        assert name + "-hot.qcow2" not in disks(pool, name, live=True)[1]
        pool.wait_console(name, "MACHINERY-BLOCK-REMOVED vdb")
        gone = module("nic_attach", uri=pool.uri, machine=name, name="eth1", state="detached")
        assert gone["changed"] is True
        assert mac not in pool.domain(name).XMLDesc(0)
        console = pool.wait_console(name, "MACHINERY-NIC-REMOVED eth1")
        assert made["machine"]["ip_addresses"][0] in console
    finally:
        module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=5)
    assert [v for v in pool.volumes() if v.startswith(name + "-")] == []


def test_ephemeral_goes_with_the_machine_referenced_survives(pool, module, image):
    make(module, pool, image, "att-a")
    make(module, pool, image, "att-b")
    shared = "att-referenced.raw"
    try:
        assert module("volume_attach", uri=pool.uri, machine="att-a", volume="att-a-scratch.qcow2", size="16Mi",
                      ephemeral=True)["changed"]
        assert module("volume_attach", uri=pool.uri, machine="att-a", volume=shared, size="16Mi",
                      format="raw")["changed"]
        taken = module("volume_attach", uri=pool.uri, machine="att-b", volume=shared)
        assert_failed(taken, "volume", "att-a", "shareable")
        assert disks(pool, "att-b")[0] == 1
        both = module("volume_attach", uri=pool.uri, machine="att-b", volume=shared, shareable=True)
        assert both["changed"] is True and "<shareable/>" in disks(pool, "att-b")[1]

        assert module("machine", uri=pool.uri, name="att-a", state="absent")["changed"]
        volumes = pool.volumes()
        assert "att-a-scratch.qcow2" not in volumes
        assert [v for v in volumes if v.startswith("att-a-")] == []
        assert shared in volumes
        assert module("machine", uri=pool.uri, name="att-b", state="absent")["changed"]
        assert shared in pool.volumes()
        make(module, pool, image, "att-c")
        again = module("volume_attach", uri=pool.uri, machine="att-c", volume=shared)
        assert again["changed"] is True and shared in disks(pool, "att-c")[1]
    finally:
        for name in ("att-a", "att-b", "att-c"):
            module("machine", uri=pool.uri, name=name, state="absent")
        storage = pool.conn.storagePoolLookupByName("machinery")
        storage.refresh(0)
        if shared in storage.listVolumes():
            storage.storageVolLookupByName(shared).delete(0)


def test_bad_input_changes_nothing(pool, module, image):
    make(module, pool, image, "att-bad", network_interfaces=[{"name": "eth0", "network": "machinery"}])
    make(module, pool, image, "att-other", network_interfaces=[{"name": "eth0", "network": "machinery"}])
    other_mac = pool.domain("att-other").XMLDesc(0).split("<mac address='")[1].split("'")[0]
    assert module("volume_attach", uri=pool.uri, machine="att-bad", volume="att-bad-d.qcow2", size="16Mi",
                  ephemeral=True)["changed"]
    xml = pool.domain("att-bad").XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    volumes = pool.volumes()
    try:
        cases = [
            ("volume_attach", dict(machine="no-such", volume="x.qcow2", size="1Gi"), "machine"),
            ("volume_attach", dict(machine="att-bad", volume="missing.qcow2"), "volume"),
            ("volume_attach", dict(machine="att-bad", volume="new.qcow2", size="1Gi", device="vdb"), "device"),
            ("volume_attach", dict(machine="att-bad", volume="new.qcow2", size="lots"), "size"),
            ("volume_attach", dict(machine="att-bad", volume="new.qcow2", size="-1Gi"), "size"),
            ("volume_attach", dict(machine="att-bad", volume="../etc/passwd", size="1Gi"), "volume"),
            ("nic_attach", dict(machine="att-bad", name="eth1", network="no-such-net"), "network"),
            ("nic_attach", dict(machine="att-bad", name="eth1", network="machinery", mac=other_mac), "mac"),
            ("nic_attach", dict(machine="att-bad", name="Eth 1", network="machinery"), "name"),
            ("nic_attach", dict(machine="no-such", name="eth1", network="machinery"), "machine"),
        ]
        for module_name, args, field in cases:
            assert_failed(module(module_name, uri=pool.uri, **args), field)
            assert pool.domain("att-bad").XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE) == xml, (module_name, args)
            assert pool.volumes() == volumes, (module_name, args)
    finally:
        for name in ("att-bad", "att-other"):
            module("machine", uri=pool.uri, name=name, state="absent")
