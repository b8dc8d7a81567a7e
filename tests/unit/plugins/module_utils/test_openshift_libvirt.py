"""OpenShift's own libvirt providerSpec (issue 39): LibvirtMachineProviderConfig read with the provider's meaning,
and the address allocation of networkInterfaceAddress.

The documents follow the shape openshift/installer writes (pkg/asset/machines/libvirt/machinesets.go at
3c28bc3c21c20e261490b6e6bc1c3c1da53c4112) and the Go type of openshift/cluster-api-provider-libvirt
(pkg/apis/libvirtproviderconfig/v1beta1/libvirtmachineproviderconfig_types.go at a336f0b5).
"""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine
from ansible_collections.machinery.compute.plugins.module_utils.manifests import openshift_libvirt as upstream

OS = "machine.openshift.io/v1beta1"
CLUSTER = "ocp-7xk2p"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "worker-user-data",
                                                             "namespace": "openshift-machine-api"},
          "type": "Opaque", "stringData": {"disableTemplating": "true", "userData": '{"ignition": {"config": '
                                           '{"merge": [{"source": "https://api-int:22623/config/worker"}]}, '
                                           '"version": "3.2.0"}}'}}
PROVIDER = {"apiVersion": "libvirtproviderconfig.openshift.io/v1beta1", "kind": "LibvirtMachineProviderConfig",
            "domainMemory": 8192, "domainVcpu": 4, "ignition": {"userDataSecret": "worker-user-data"},
            "volume": {"poolName": CLUSTER, "baseVolumeID": CLUSTER + "-base"},
            "networkInterfaceName": CLUSTER, "networkInterfaceAddress": "192.168.126.0/24", "autostart": False,
            "uri": "qemu+tcp://192.168.122.1/system"}
LABELS = {"machine.openshift.io/cluster-api-machineset": CLUSTER + "-worker-0",
          "machine.openshift.io/cluster-api-cluster": CLUSTER}
MACHINE_SET = {"apiVersion": OS, "kind": "MachineSet",
               "metadata": {"name": CLUSTER + "-worker-0", "namespace": "openshift-machine-api",
                            "labels": {"machine.openshift.io/cluster-api-cluster": CLUSTER}},
               "spec": {"replicas": 2, "selector": {"matchLabels": LABELS},
                        "template": {"metadata": {"labels": dict(LABELS)},
                                     "spec": {"providerSpec": {"value": PROVIDER}}}}}


def parse(*documents):
    problems = docs.Problems()
    objects = engine.parse([("definition[%d]" % i, d) for i, d in enumerate(documents)], problems)
    by_key = {obj.key: obj for obj in objects}
    for obj in objects:
        if obj.role in ("machine", "set"):
            obj.dialect.link(obj, by_key, docs.Fields(problems, obj.ref), None)
    return {obj.ref: obj for obj in objects}, problems


def test_the_installers_machine_set_reads_with_the_providers_meaning():
    objects, problems = parse(MACHINE_SET, SECRET)
    assert problems.errors == []
    template = objects["MachineSet/%s-worker-0" % CLUSTER].params["template"]
    assert template["memory"] == "8192Mi" and template["cpu"] == 4
    assert template["image"] == "volume:%s/%s-base" % (CLUSTER, CLUSTER)
    assert template["root_size"] == upstream.DEFAULT_VOLUME_SIZE
    assert template["network_interfaces"] == [{"name": "eth0", "network": CLUSTER, "ip_address": "192.168.126.0/24"}]
    assert template["ignition"]["ignition"]["version"] == "3.2.0"
    assert objects["MachineSet/%s-worker-0" % CLUSTER].refs["libvirt"]["autostart"] is False


def test_the_providers_required_fields_are_required_and_named():
    value = {"kind": "LibvirtMachineProviderConfig", "volume": {"poolName": "default"}}
    doc = {"apiVersion": OS, "kind": "Machine", "metadata": {"name": "m"}, "spec": {"providerSpec": {"value": value}}}
    _objects, problems = parse(doc)
    said = "\n".join(problems.errors)
    for path in ("domainMemory: required value", "domainVcpu: required value", "volume.baseVolumeID: required",
                 "spec.providerSpec.value: give ignition, ignKey or cloudInit"):
        assert path in said


def test_a_single_address_for_a_set_is_refused_and_a_second_boot_source_warned():
    doc = copy.deepcopy(MACHINE_SET)
    value = doc["spec"]["template"]["spec"]["providerSpec"]["value"]
    value.update(networkInterfaceAddress="192.168.126.12", cloudInit={"sshAccess": True})
    _objects, problems = parse(doc, SECRET)
    assert any("value.networkInterfaceAddress: must be a network in CIDR form" in line for line in problems.errors)
    assert any("value.cloudInit: ignition is given too" in line for line in problems.warnings)


def test_cloud_init_user_data_is_run_as_the_providers_script_with_ssh_as_cloud_config():
    assert upstream.cloud_config_script("echo hi", False) == "#!/bin/bash\necho hi"
    assert upstream.cloud_config_script("#cloud-config\n", False) == "#cloud-config\n"
    both = upstream.cloud_config_script("echo hi", True)
    assert both.startswith("Content-Type: multipart/mixed") and "ssh_deletekeys: true" in both
    assert "Content-Type: text/x-shellscript" in both and "#!/bin/bash\necho hi" in both


NETWORK = {"cidr": "192.168.126.0/24", "dhcp_start": "192.168.126.2", "dhcp_end": "192.168.126.254",
           "dhcp_hosts": [{"mac": "52:54:00:aa:bb:cc", "ip": "192.168.126.51", "name": "other"}]}


def test_addresses_come_from_host_51_skipping_held_ones_and_stay_with_their_mac():
    leases = [("52:54:00:aa:bb:dd", "192.168.126.52", None)]
    first = cap.allocate_address("192.168.126.0/24", "52:54:00:00:00:01", "net", NETWORK, leases, "f", pool="t1")
    assert first == "192.168.126.53"
    second = cap.allocate_address("192.168.126.0/24", "52:54:00:00:00:02", "net", NETWORK, leases, "f", pool="t1")
    assert second == "192.168.126.54"  # the first one's claim is held for it in this run
    again = cap.allocate_address("192.168.126.0/24", "52:54:00:00:00:01", "net", NETWORK, leases, "f", pool="t1")
    assert again == first
    held = dict(NETWORK, dhcp_hosts=NETWORK["dhcp_hosts"] + [{"mac": "52:54:00:00:00:09", "ip": "192.168.126.60"}])
    assert cap.allocate_address("192.168.126.0/24", "52:54:00:00:00:09", "net", held, [], "f", pool="t2") == \
        "192.168.126.60"


def test_allocation_refuses_a_network_too_small_or_full():
    with pytest.raises(ValidationError) as small:
        cap.address_range("10.0.0.0/27", "f")
    assert "no host 51" in small.value.message
    full = dict(NETWORK, dhcp_end="192.168.126.51")
    with pytest.raises(ConflictError):
        cap.allocate_address("192.168.126.0/24", "52:54:00:00:00:07", "net", full, [], "f", pool="t3")


def test_an_oc_get_export_applies_with_what_the_server_set_warned():
    """A List as ``oc get machines,machinesets -n openshift-machine-api -o yaml`` prints it (the fields the API server
    and the machine controllers set: openshift/api machine/v1beta1 types_machine.go and types_machineset.go)."""
    owner = {"apiVersion": "machine.openshift.io/v1beta1", "kind": "MachineSet", "name": CLUSTER + "-worker-0",
             "uid": "8f0e7f43-9c55-4a8e-a2d2-1b9e0f1f7d10", "controller": True, "blockOwnerDeletion": True}
    server = {"creationTimestamp": "2026-11-01T10:00:00Z", "generation": 1, "resourceVersion": "48213",
              "uid": "0c7a2f0e-5d7b-4c8f-9a52-6f3e1d2b9c01", "finalizers": ["machine.machine.openshift.io"],
              "managedFields": [{"manager": "machineset-controller", "operation": "Update"}]}
    machine = {"apiVersion": OS, "kind": "Machine",
               "metadata": dict(server, name=CLUSTER + "-worker-0-x7k2p", namespace="openshift-machine-api",
                                generateName=CLUSTER + "-worker-0-", ownerReferences=[owner], labels=dict(LABELS),
                                annotations={"machine.openshift.io/instance-state": "Running"}),
               "spec": {"lifecycleHooks": {}, "metadata": {}, "providerID": "libvirt:///pool1/u",
                        "authoritativeAPI": "MachineAPI", "providerSpec": {"value": copy.deepcopy(PROVIDER)}},
               "status": {"phase": "Running", "addresses": [{"type": "InternalIP", "address": "192.168.126.51"}],
                          "providerStatus": {"instanceID": "u", "instanceState": "Running"}}}
    machine_set = copy.deepcopy(MACHINE_SET)
    machine_set["metadata"].update(server)
    machine_set["spec"]["authoritativeAPI"] = "MachineAPI"
    machine_set["spec"]["template"]["metadata"].update(name="", generateName="", namespace="openshift-machine-api",
                                                       ownerReferences=[])
    machine_set["status"] = {"replicas": 2, "readyReplicas": 2, "observedGeneration": 1}
    exported = {"apiVersion": "v1", "kind": "List", "items": [machine, machine_set, SECRET]}
    documents, load_problems = docs.load_sources(definition=[exported])
    objects, problems = parse(*[doc for _origin, doc in documents])
    assert load_problems == [] and problems.errors == [], problems.errors
    said = "\n".join(problems.warnings)
    for path in ("metadata.finalizers", "metadata.ownerReferences", "metadata.generateName", "metadata.uid",
                 "metadata.resourceVersion", "metadata.managedFields", "metadata.creationTimestamp", "status",
                 "spec.authoritativeAPI", "spec.template.metadata.namespace"):
        assert "%s: " % path in said, path
    assert len(objects) == 3
    member = objects["Machine/%s-worker-0-x7k2p" % CLUSTER]
    assert member.role == "member"  # its set makes the members: applying the export makes no third machine
    assert "spec.providerSpec.value.uri" not in said
