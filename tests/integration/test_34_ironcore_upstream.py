"""IronCore's own Machine on the lab (issue 39): the e2e sample's shape with its ignition Secret (key
ignition.yaml), applied on one pool, booted, re-applied and its export re-applied as no-ops, deleted; every effect
read from libvirt and from the guest's console.

Shapes: ironcore-dev/ironcore at 0b3fd712, config/samples/e2e/bases/machine-with-ephemeral-resources/machine.yaml
(a root disk as an ephemeral volumeTemplate: resources.storage filled from dataSource.osImage, an ephemeral NIC)
and config/samples/e2e/bases/ignition/ignition-secret.yaml (data key ignition.yaml), with v0.5's
spec.guestConfig.hostname and the device name oda that IronCore's admission assigns. The OS image is the lab's
busybox image published under a name (the sample's is an OCI reference), the size 2Gi instead of 10Gi.
"""

import base64
import json
import xml.etree.ElementTree as ET

import pytest

from conftest import first_pool, run_module

IC = "compute.ironcore.dev/v1alpha1"
IGNITION = {"ignition": {"version": "3.3.0"},
            "storage": {"files": [{"path": "/etc/ironcore-lab", "contents": {"source": "data:,ironcore-upstream"}}]}}


def documents():
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ignition", "creationTimestamp": None},
              "data": {"ignition.yaml": base64.b64encode(json.dumps(IGNITION).encode()).decode()}}
    machine_class = {"apiVersion": IC, "kind": "MachineClass", "metadata": {"name": "ic-tiny"},
                     "capabilities": {"cpu": 1, "memory": "128Mi"}}
    machine = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "ic-sample", "labels": {"app": "ic-up"}},
               "spec": {"machineClassRef": {"name": "ic-tiny"}, "ignitionRef": {"name": "ignition"},
                        "guestConfig": {"hostname": "ic-sample"},
                        "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {"spec": {
                            "ipFamilies": ["IPv4"], "networkRef": {"name": "machinery"}}}}}],
                        "volumes": [{"name": "root-disk", "device": "oda", "ephemeral": {"volumeTemplate": {"spec": {
                            "volumeClassRef": {"name": "volumeclass-sample"}, "resources": {"storage": "2Gi"},
                            "dataSource": {"osImage": {"image": "ic-rootfs"}}}}}}]}}
    return [secret, machine_class, machine]


@pytest.fixture(scope="module")
def lab1(image):
    def clean(pool):
        run_module("manifest", pools=[pool.uri], definition=documents(), state="absent", shutdown_timeout=2)

    with first_pool(clean) as pool:
        published = run_module("machine_image", pools=[pool.uri], name="ic-rootfs", path=image)
        assert not published.get("failed"), published
        yield pool


def test_the_e2e_sample_boots_with_its_sized_root_and_ignition_yaml(lab1):
    pool = lab1
    made = run_module("manifest", pools=[pool.uri], definition=documents())
    assert not made.get("failed"), made
    dom = pool.domain("ic-sample")
    assert dom is not None and dom.isActive()
    disks = {disk.find("target").get("dev"): disk.find("source").get("file")
             for disk in ET.fromstring(dom.XMLDesc(0)).findall("devices/disk[@device='disk']")}
    root = pool.conn.storageVolLookupByPath(disks["vda"])
    assert root.info()[1] == 2 * 2 ** 30  # the volumeTemplate's resources.storage, filled from the OS image
    console = pool.wait_console("ic-sample", "MACHINERY-IGNITION-END", timeout=120)
    assert "ironcore-upstream" in console and "ic-sample" in console

    again = run_module("manifest", pools=[pool.uri], definition=documents())
    assert again["changed"] is False and again["actions"] == [], again

    exported = run_module("manifest_info", pools=[pool.uri], dialect="ironcore", name=["ic-sample"])
    machine = next(doc for doc in exported["documents"] if doc["kind"] == "Machine")
    template = machine["spec"]["volumes"][0]["ephemeral"]["volumeTemplate"]["spec"]
    assert template["resources"]["storage"] == "2Gi", machine
    reapplied = run_module("manifest", pools=[pool.uri], definition=exported["documents"])
    assert reapplied["changed"] is False and not reapplied.get("failed"), reapplied


def qos_documents(pool):
    """A Machine whose volume template names its pool and limits its disk (resources.iops and tps), and whose NIC
    template names its Machine: IronCore VolumeSpec and NetworkInterfaceSpec fields (issue 50)."""
    secret, machine_class, _machine = documents()
    machine = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "ic-qos"},
               "spec": {"machineClassRef": {"name": "ic-tiny"}, "power": "Off", "image": "ic-rootfs",
                        "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {"spec": {
                            "networkRef": {"name": "machinery"}, "machineRef": {"name": "ic-qos"}}}}}],
                        "volumes": [{"name": "data", "ephemeral": {"volumeTemplate": {"spec": {
                            "volumePoolRef": {"name": pool.name},
                            "resources": {"storage": "1Gi", "iops": "1000", "tps": "150M"}}}}}]}}
    return [secret, machine_class, machine]


def test_a_templates_pool_and_disk_limits_are_applied(lab1):
    pool = lab1
    made = run_module("manifest", pools=[pool.uri], definition=qos_documents(pool))
    try:
        assert not made.get("failed"), made
        dom = pool.domain("ic-qos")
        disks = {disk.find("target").get("dev"): disk for disk in
                 ET.fromstring(dom.XMLDesc(2)).findall("devices/disk[@device='disk']")}
        tune = disks["vdb"].find("iotune")
        assert tune.findtext("total_iops_sec") == "1000" and tune.findtext("total_bytes_sec") == "150000000"
        assert disks["vda"].find("iotune") is None  # the root disk has no limits of its own
        again = run_module("manifest", pools=[pool.uri], definition=qos_documents(pool))
        assert again["changed"] is False and again["actions"] == [], again
    finally:
        run_module("manifest", pools=[pool.uri], definition=qos_documents(pool)[2:], state="absent",
                   shutdown_timeout=2)  # the Machine only: the class and Secret are the sample's too


def test_deleting_it_leaves_nothing(lab1):
    pool = lab1
    gone = run_module("manifest", pools=[pool.uri], definition=documents(), state="absent", shutdown_timeout=2)
    assert gone["changed"] and pool.domain("ic-sample") is None, gone
    assert not [name for name in pool.volumes() if name.startswith("ic-sample-")]
