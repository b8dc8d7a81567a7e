"""The 18 upstream vitistack example Machines, parsed and linked as the manifest module does.

The documents are written here in the shape of, and with the fields of:
- vitistack/crds commit 86c93d9312b89db74c47b1953656a13a31c66cf1, examples/machine-example.yaml (4 Machines: AWS,
  Azure, GCP, vSphere; the first generation: instanceType, providerConfig);
- vitistack/kubevirt-operator commit 63ee0ee41542f2cedf16aaccaccd54a7651e9efb, config/samples/sample-machine.yaml
  and examples/machine-boot-debian.yaml, machine-boot-talos.yaml, machine-boot-ubuntu.yaml,
  machine-custom-namespace.yaml, machine-disk-examples.yaml (3), machine-large.yaml,
  machine-medium-with-overrides.yaml, machine-medium.yaml, machine-small-with-overrides.yaml, machine-small.yaml,
  machine-with-disks.yaml (14 Machines; the current generation: machineClass, provider: kubevirt), with
  examples/machineclasses.yaml's MachineClass kind.
"""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine

VS = "vitistack.io/v1alpha1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f test@example"
SERVED = ["libvirt", "kubevirt", "aws", "azure", "gcp", "vsphere"]


def machine(name, spec, namespace=None, annotations=None):
    metadata = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": VS, "kind": "Machine", "metadata": metadata, "spec": spec}


def machine_class(name, cores, memory, default=False):
    return {"apiVersion": VS, "kind": "MachineClass", "metadata": {"name": name},
            "spec": {"enabled": True, "default": default, "category": "Standard", "displayName": name.title(),
                     "description": "%d cores, %s" % (cores, memory), "cpu": {"cores": cores, "sockets": 1, "threads": 1},
                     "memory": {"quantity": memory}, "machineProviders": ["kubevirt"]}}


CLASSES = [machine_class("small", 2, "8Gi"), machine_class("medium", 4, "16Gi", True),
           machine_class("large", 4, "32Gi"), machine_class("xlarge", 4, "48Gi")]
DATAVOLUME = {"kubevirt.io/boot-source": "datavolume", "kubevirt.io/boot-source-type": "http"}


def iso_machine(name, host, distribution, version, url, size):
    return machine(name, {"machineClass": "medium", "name": host, "provider": "kubevirt",
                          "os": {"family": "linux", "distribution": distribution, "version": version,
                                 "architecture": "amd64", "imageID": url},
                          "disks": [{"name": "root", "sizeGB": size, "boot": True, "type": "virtio",
                                     "encrypted": False}]}, annotations=DATAVOLUME)


KUBEVIRT = [
    machine("sample-machine", {"name": "test-vm"}, "default"),
    iso_machine("example-machine-iso-debian", "debian-iso-vm", "debian", "13.3",
                "https://cdimage.debian.org/debian-cd/current/amd64/iso-cd/debian-13.3.0-amd64-netinst.iso", 20),
    iso_machine("example-machine-iso-talos", "talos-iso-vm", "talos", "1.11.5",
                "https://github.com/siderolabs/talos/releases/download/v1.11.5/metal-amd64.iso", 50),
    iso_machine("example-machine-iso-ubuntu", "ubuntu-iso-vm", "ubuntu", "24.04",
                "https://releases.ubuntu.com/24.04.3/ubuntu-24.04.3-live-server-amd64.iso", 50),
    machine("test-machine", {"provider": "kubevirt", "machineClass": "small", "cpu": {"cores": 2},
                             "memory": 2147483648, "disks": [{"name": "root", "sizeGB": 20, "boot": True}]},
            "my-custom-namespace"),
    machine("simple-machine", {"machineClass": "small", "name": "simple-vm", "provider": "kubevirt"}, "default"),
    machine("single-disk-machine", {"machineClass": "medium", "name": "single-disk-vm", "provider": "kubevirt",
                                    "disks": [{"name": "root", "sizeGB": 30, "boot": True, "type": "virtio"}]},
            "default"),
    machine("multi-disk-machine", {
        "provider": "kubevirt", "machineClass": "large", "name": "multi-disk-vm", "memory": 8589934592,
        "cpu": {"cores": 4},
        "disks": [{"name": "root", "sizeGB": 40, "boot": True, "type": "virtio", "encrypted": False},
                  {"name": "data1", "sizeGB": 100, "boot": False, "type": "virtio", "encrypted": False},
                  {"name": "data2", "sizeGB": 200, "boot": False, "type": "sata", "encrypted": False},
                  {"name": "scratch", "sizeGB": 50, "boot": False, "type": "scsi", "encrypted": False,
                   "iops": 3000, "throughput": 500}]}, "default"),
    machine("example-machine-large", {"machineClass": "large", "name": "example-vm-large", "provider": "kubevirt"}),
    machine("example-machine-medium-with-overrides", {
        "machineClass": "medium", "name": "example-vm-medium-with-overrides", "provider": "kubevirt",
        "memory": 3221225472, "cpu": {"cores": 3}}),
    machine("example-machine-medium", {"machineClass": "medium", "name": "example-vm-medium",
                                       "provider": "kubevirt"}),
    machine("example-machine-small-ish", {"machineClass": "small", "provider": "kubevirt", "name": "example-vm-small",
                                          "cpu": {"cores": 4, "sockets": 4, "threadsPerCore": 2},
                                          "memory": 4294967296}),
    machine("example-machine-small", {"machineClass": "small", "name": "example-vm-small", "provider": "kubevirt"}),
    machine("example-machine-with-disks", {
        "machineClass": "medium", "name": "example-vm-with-disks", "provider": "kubevirt",
        "disks": [{"name": "root", "sizeGB": 20, "boot": True, "type": "virtio", "encrypted": False},
                  {"name": "data", "sizeGB": 50, "boot": False, "type": "virtio", "encrypted": False},
                  {"name": "logs", "sizeGB": 10, "boot": False, "type": "virtio", "encrypted": False}]}, "default"),
]

CRDS = [
    machine("web-server-aws", {
        "name": "web-server-01", "instanceType": "t3.medium", "cpu": {"cores": 2, "threadsPerCore": 2},
        "memory": 4294967296,
        "disks": [{"name": "root", "sizeGB": 20, "type": "gp3", "boot": True, "encrypted": True, "iops": 3000,
                   "throughput": 125},
                  {"name": "data", "sizeGB": 100, "type": "gp3", "encrypted": True, "device": "/dev/sdf"}],
        "network": {"vpc": "vpc-12345678", "subnet": "subnet-87654321", "assignPublicIP": True,
                    "interfaces": [{"name": "eth0", "primary": True, "securityGroups": ["sg-web-server", "sg-common"]}]},
        "os": {"family": "linux", "distribution": "ubuntu", "version": "22.04", "architecture": "amd64",
               "imageID": "ami-0abcdef123456789"},
        "providerConfig": {"name": "aws", "region": "us-west-2", "zone": "us-west-2a",
                           "config": {"instanceProfile": "EC2-WebServer-Role", "placementGroup": "web-servers",
                                      "tenancy": "default"},
                           "credentialsRef": {"secretName": "aws-credentials", "namespace": "default"}},
        "sshKeys": [KEY], "userData": "#!/bin/bash\napt-get update\n",
        "tags": {"Environment": "production", "Team": "platform", "Project": "web-app", "CostCenter": "12345"},
        "securityGroups": ["sg-web-server", "sg-monitoring"], "monitoring": True,
        "backup": {"enabled": True, "schedule": "0 2 * * *", "retentionDays": 30}},
        "default", None),
    machine("app-server-azure", {
        "name": "app-server-01", "instanceType": "Standard_B2s",
        "os": {"family": "linux", "distribution": "ubuntu", "version": "20.04", "architecture": "amd64",
               "imageFamily": "ubuntu-server-20-04-lts"},
        "disks": [{"name": "root", "sizeGB": 30, "type": "Premium_LRS", "boot": True, "encrypted": True}],
        "network": {"vpc": "vnet-production", "subnet": "subnet-apps", "assignPublicIP": False},
        "providerConfig": {"name": "azure", "region": "westus2",
                           "config": {"resourceGroup": "rg-production", "availabilitySet": "as-app-servers"},
                           "credentialsRef": {"secretName": "azure-sp-credentials"}},
        "tags": {"environment": "production", "application": "api-server"}}, "production"),
    machine("db-server-gcp", {
        "name": "db-server-01", "instanceType": "n2-standard-4",
        "os": {"family": "linux", "distribution": "debian", "version": "11", "architecture": "amd64",
               "imageFamily": "debian-11"},
        "disks": [{"name": "boot", "sizeGB": 20, "type": "pd-ssd", "boot": True},
                  {"name": "database", "sizeGB": 500, "type": "pd-ssd", "device": "/dev/sdb"}],
        "network": {"vpc": "vpc-production", "subnet": "subnet-database", "assignPublicIP": False},
        "providerConfig": {"name": "gcp", "region": "us-central1", "zone": "us-central1-a",
                           "config": {"project": "my-gcp-project", "machineType": "n2-standard-4"},
                           "credentialsRef": {"secretName": "gcp-service-account-key"}},
        "securityGroups": ["database-firewall"], "monitoring": True}, "database"),
    machine("test-server-vsphere", {
        "name": "test-server-01", "instanceType": "medium", "cpu": {"cores": 4, "sockets": 2, "threadsPerCore": 1},
        "memory": 8589934592,
        "os": {"family": "linux", "distribution": "centos", "version": "8", "architecture": "amd64",
               "imageID": "centos8-template"},
        "disks": [{"name": "root", "sizeGB": 40, "type": "thin", "boot": True},
                  {"name": "app-data", "sizeGB": 200, "type": "thick"}],
        "network": {"interfaces": [{"name": "eth0", "primary": True, "subnet": "vlan-100-testing"}]},
        "providerConfig": {"name": "vsphere", "region": "vitistack-west",
                           "config": {"vcenter": "vcenter.example.com", "cluster": "Cluster-Test"},
                           "credentialsRef": {"secretName": "vsphere-credentials"}},
        "userData": "#cloud-config\npackages:\n  - docker\n"}, "testing"),
]


class Pools:
    """The pools as the examples need them: the images their os names published, their vpcs as networks."""

    def __init__(self):
        self.snapshots = [{"name": "pool1", "classes": {}}]
        self.by_name = {"pool1": self.snapshots[0]}
        self.volumes = {"pool1": set()}
        self.images = {"pool1": {
            "ami-0abcdef123456789": {}, "centos8-template": {},
            "ubuntu-20-04": {"os": {"family": "linux", "distribution": "ubuntu", "version": "20.04",
                                    "architecture": "amd64"}},
            "debian-11": {"os": {"family": "linux", "distribution": "debian", "version": "11",
                                 "architecture": "amd64"}}}}
        self.machines = []

    def class_on(self, name):
        """The first generation's instance types, published by the operator beforehand."""
        return ["pool1"] if name in ("t3.medium", "standard-b2s", "n2-standard-4", "medium") else []

    def volume_on(self, name):
        return []

    def networks_of(self, pool):
        return {"vpc-12345678", "vnet-production", "vpc-production"}


def check(documents, providers=tuple(SERVED)):
    problems = docs.Problems()
    try:
        objects, warnings = engine.check_documents([("d[%d]" % i, doc) for i, doc in enumerate(documents)],
                                                   Pools(), providers=providers)
    except docs.ManifestError as exc:
        return None, exc.problems, []
    return {obj.ref: obj for obj in objects}, problems.errors, warnings


def test_there_are_eighteen_examples():
    assert len(KUBEVIRT) == 14 and len(CRDS) == 4


@pytest.mark.parametrize("doc", KUBEVIRT, ids=[doc["metadata"]["name"] for doc in KUBEVIRT])
def test_every_kubevirt_example_applies_with_kubevirt_served(doc):
    objects, errors, _warnings = check(copy.deepcopy(CLASSES) + [copy.deepcopy(doc)])
    assert errors == []
    params = objects["Machine/" + doc["metadata"]["name"]].params
    assert params.get("hostname") == doc["spec"].get("name")
    assert params.get("machine_class") == doc["spec"].get("machineClass")


@pytest.mark.parametrize("doc", KUBEVIRT[1:], ids=[doc["metadata"]["name"] for doc in KUBEVIRT[1:]])
def test_a_kubevirt_example_is_refused_naming_the_providers_option_when_kubevirt_is_not_served(doc):
    _objects, errors, _warnings = check(copy.deepcopy(CLASSES) + [copy.deepcopy(doc)], providers=["libvirt"])
    assert errors == ["Machine/%s: spec.provider: provider 'kubevirt' is not served by this run (the manifest "
                      "option providers is [libvirt]); add kubevirt to providers to run this machine as a QEMU "
                      "machine on these pools" % doc["metadata"]["name"]]


def test_the_kubevirt_operators_sizes_and_disks():
    objects, _errors, warnings = check(copy.deepcopy(CLASSES) + copy.deepcopy(KUBEVIRT))
    small = objects["Machine/example-machine-small-ish"].params
    topology = {"sockets": 4, "cores": 4, "threads": 2}
    assert (small["cpu"], small["topology"], small["memory"]) == (32, topology, 4 * 2 ** 30)
    sample = objects["Machine/sample-machine"].params
    assert (sample["cpu"], sample["memory"], sample["machine_class"]) == (2, 2 * 2 ** 30, None)
    assert sample["volumes"] == [{"name": "boot", "size": 10 * 2 ** 30}] and "image" not in sample
    disks = objects["Machine/multi-disk-machine"].params["volumes"]
    assert [(vol["name"], vol.get("bus", "virtio")) for vol in disks] == [
        ("boot", "virtio"), ("data1", "virtio"), ("data2", "sata"), ("scratch", "scsi")]
    assert (disks[3]["iops"], disks[3]["throughput"]) == (3000, 500)
    iso = objects["Machine/example-machine-iso-talos"].params
    assert iso["image"].endswith("/metal-amd64.iso") and iso["root_size"] == 50 * 2 ** 30
    assert any(line.startswith("Machine/sample-machine: spec.os: no image") for line in warnings)
    classes = {ref: obj.data for ref, obj in objects.items() if ref.startswith("MachineClass/")}
    assert classes["MachineClass/medium"] == {"name": "medium", "cpu": 4, "memory": 16 * 2 ** 30}


def test_the_crds_examples_apply_their_encrypted_image_boot_disks_as_luks_copies():
    """The first generation's examples, their providers served: the encrypted boot disk of an image (AWS, Azure)
    is a volume of the image, encrypted (a full LUKS copy, with a random key), booted; an interface with no vpc
    (vSphere) has no network, refused naming it; with the vpc given they all apply, the AWS boot disk with its
    iops and throughput."""
    _objects, errors, _warnings = check(copy.deepcopy(CRDS))
    assert errors == ["Machine/test-server-vsphere: spec.network.interfaces: an interface joins a libvirt network, "
                      "and spec.network.vpc names none: give spec.network.vpc (a network of the pools)"]
    fixed = copy.deepcopy(CRDS)
    fixed[3]["spec"]["network"]["vpc"] = "vpc-production"
    objects, errors, warnings = check(fixed)
    assert errors == []
    azure = objects["Machine/app-server-azure"].params
    boot = azure["volumes"][0]
    assert "image" not in azure and boot["encrypted"] is True and boot["image"] and len(boot.pop("passphrase")) >= 32
    # the same documents again: a new random key each time, never in the params' other fields
    again = check(copy.deepcopy(fixed))[0]["Machine/app-server-azure"].params["volumes"][0]
    assert again.pop("passphrase") and again == boot
    aws = objects["Machine/web-server-aws"].params
    assert (aws["machine_class"], aws["hostname"], aws["cpu"]) == ("t3.medium", "web-server-01", 4)
    # the boot disk's iops and throughput: it is a volume of the image, booted, with limits of its own, encrypted
    assert aws["volumes"][0].pop("passphrase")
    assert "image" not in aws and aws["volumes"][0] == {"name": "boot", "size": 20 * 2 ** 30, "iops": 3000,
                                                        "throughput": 125, "encrypted": True,
                                                        "image": "ami-0abcdef123456789"}
    # /dev/sdf on a cloud volume type (gp3, so the virtio bus) is no virtio device name: warned, assigned in order
    assert "device" not in aws["volumes"][1]
    assert any(line.startswith("Machine/web-server-aws: spec.disks[1].device: '/dev/sdf' is not a virtio device")
               for line in warnings)
    assert objects["Machine/app-server-azure"].params["machine_class"] == "standard-b2s"
    assert objects["Machine/db-server-gcp"].params["image"] == "debian-11"
    said = "\n".join(warnings)
    for path in ("spec.providerConfig.config", "spec.network.assignPublicIP", "spec.os.imageFamily",
                 "spec.disks[0].type", "spec.monitoring", "spec.backup"):
        assert path in said
