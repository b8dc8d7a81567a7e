"""Manifests as pure functions: every dialect's documents checked and translated, every problem reported at once
with its object and field path (no libvirt: the pools are a stand-in)."""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine, ironcore

IC = "compute.ironcore.dev/v1alpha1"
OS = "machine.openshift.io/v1beta1"
KS = "kupenstack.io/v1alpha1"
VS = "vitistack.io/v1alpha1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f test@example"


class FakePools:
    """What link() reads of the pools: names, published classes, volumes, named images."""

    def __init__(self):
        self.snapshots = [{"name": "pool1", "classes": {"small": {}}}, {"name": "pool2", "classes": {"small": {}}}]
        self.by_name = {s["name"]: s for s in self.snapshots}
        self.volumes = {"pool1": {"boot-vol"}, "pool2": set()}
        self.images = {"pool1": {"debian-12": {"os": {"family": "linux", "distribution": "debian", "version": "12"}},
                                 "my-image": {}},
                       "pool2": {"my-image": {}}}

    def class_on(self, name):
        return [s["name"] for s in self.snapshots if name in s["classes"]]

    def volume_on(self, name):
        return sorted(pool for pool, names in self.volumes.items() if name in names)

    def networks_of(self, pool):
        return {"machinery", "default", "net-db", "net-backend"}


def problems_of(*documents):
    with pytest.raises(docs.ManifestError) as info:
        engine.check_documents([("definition[%d]" % i, d) for i, d in enumerate(documents)], FakePools())
    return info.value.problems


def objects_of(*documents):
    objects, warnings = engine.check_documents([("definition[%d]" % i, d) for i, d in enumerate(documents)],
                                               FakePools())
    return {obj.ref: obj for obj in objects}, warnings


# --- valid documents and their translation --------------------------------------------------------------------

IC_CLASS = {"apiVersion": IC, "kind": "MachineClass", "metadata": {"name": "machineclass-sample"},
            "capabilities": {"cpu": 4, "memory": "16Gi"}}
IC_VOLUME = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "my-volume"},
             "spec": {"resources": {"storage": "10Gi"}}}
IC_NIC = {"apiVersion": "networking.ironcore.dev/v1alpha1", "kind": "NetworkInterface",
          "metadata": {"name": "networkinterface-sample"}, "spec": {"networkRef": {"name": "machinery"}}}
IC_SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "my-ignition-secret"},
             "data": {"ignition": "eyJpZ25pdGlvbiI6IHsidmVyc2lvbiI6ICIzLjQuMCJ9fQ=="}}
IC_MACHINE = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "machine-sample", "labels": {"app": "web"}},
              "spec": {"machineClassRef": {"name": "machineclass-sample"}, "image": "my-image",
                       "volumes": [{"name": "rootdisk", "volumeRef": {"name": "my-volume"}},
                                   {"name": "scratch", "emptyDisk": {"sizeLimit": "1Gi"}}],
                       "networkInterfaces": [{"name": "primary",
                                              "networkInterfaceRef": {"name": "networkinterface-sample"}}],
                       "ignitionRef": {"name": "my-ignition-secret"}}}
OS_SET = {"apiVersion": OS, "kind": "MachineSet", "metadata": {"name": "workers"},
          "spec": {"replicas": 2, "selector": {"matchLabels": {"set": "workers"}},
                   "template": {"metadata": {"labels": {"set": "workers"}},
                                "spec": {"providerSpec": {"value": {
                                    "kind": "LibvirtMachineProviderSpec", "machineClass": "small",
                                    "image": "my-image"}}}}}}
OS_MHC = {"apiVersion": OS, "kind": "MachineHealthCheck", "metadata": {"name": "workers"},
          "spec": {"selector": {"matchLabels": {"set": "workers"}},
                   "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "300s"}],
                   "maxUnhealthy": "40%"}}
KS_VM = {"apiVersion": KS, "kind": "VirtualMachine", "metadata": {"name": "sample-vm"},
         "spec": {"running": True, "vcpu": 3, "memory": "500Mi", "publicKey": KEY,
                  "virtualNetworks": ["net-db", "net-backend"], "diskAttachments": [{"name": "boot-vol"}]}}
VS_MACHINE = {"apiVersion": VS, "kind": "Machine", "metadata": {"name": "vm-1"},
              "spec": {"name": "vm-1", "instanceType": "small",
                       "os": {"family": "linux", "distribution": "debian", "version": 12},
                       "providerConfig": {"name": "libvirt", "region": "west"},
                       "cpu": {"cores": 2}, "memory": 536870912,
                       "disks": [{"name": "root", "sizeGB": 20, "boot": True}, {"name": "data", "sizeGB": 1}],
                       "network": {"vpc": "machinery"}, "tags": {"team": "platform"}, "monitoring": True}}


def test_ironcore_volume_from_an_image():
    for spec in ({"image": "debian-12"}, {"dataSource": {"osImage": "debian-12"}},
                 {"image": "debian-12", "dataSource": {"osImage": "debian-12"}, "resources": {"storage": "1Gi"}}):
        objects, warnings = objects_of(dict(IC_VOLUME, spec=spec))
        data = objects["Volume/my-volume"].data
        assert data["image"] == "debian-12" and data["pool"] is None and warnings == []
        assert data["image_path"] == ("spec.dataSource.osImage" if "dataSource" in spec else "spec.image")
        assert data["size"] == (2 ** 30 if "resources" in spec else None)


def test_ironcore_sample_translates_to_machine_options():
    objects, warnings = objects_of(IC_CLASS, IC_VOLUME, IC_NIC, IC_SECRET, IC_MACHINE)
    machine = objects["Machine/machine-sample"].params
    assert machine["machine_class"] == "machineclass-sample" and machine["image"] == "my-image"
    assert machine["volumes"] == [{"name": "rootdisk", "volume": "my-volume"}, {"name": "scratch", "size": 2 ** 30}]
    assert machine["network_interfaces"] == [{"name": "primary", "network": "machinery", "ephemeral": False}]
    assert machine["ignition"] == {"ignition": {"version": "3.4.0"}}
    assert machine["machine_pool"] == "pool1"  # where its volume is made
    assert objects["Volume/my-volume"].data == {"name": "my-volume", "size": 10 * 2 ** 30, "pool": "pool1",
                                                "unclaimable": False, "claim": None,
                                                "image": None, "image_path": None}
    published = {"name": "machineclass-sample", "cpu": 4, "memory": 16 * 2 ** 30}
    assert objects["MachineClass/machineclass-sample"].data == published
    assert warnings == []


def test_openshift_set_and_check_translate_to_their_cores():
    objects, _warnings = objects_of(OS_SET, OS_MHC)
    workers = objects["MachineSet/workers"].params
    assert workers["replicas"] == 2 and workers["selector"] == {"match_labels": {"set": "workers"}}
    assert workers["template"] == {"labels": {"set": "workers"}, "machine_class": "small", "image": "my-image"}
    check = objects["MachineHealthCheck/workers"].params
    assert check["unhealthy_conditions"] == [{"type": "NodeReady", "status": "False", "timeout": 300.0}]
    assert check["max_unhealthy"] == "40%"


def test_kupenstack_vm_boots_from_its_first_volume():
    objects, _warnings = objects_of(KS_VM)
    vm = objects["VirtualMachine/sample-vm"].params
    assert "image" not in vm and vm["volumes"] == [{"name": "boot-vol", "volume": "boot-vol", "ephemeral": False}]
    assert vm["cpu"] == 3 and vm["memory"] == 500 * 2 ** 20 and vm["machine_pool"] == "pool1"
    assert [nic["network"] for nic in vm["network_interfaces"]] == ["net-db", "net-backend"]
    assert vm["ssh_authorized_keys"] == [KEY]


def test_vitistack_machine_resolves_its_os_and_warns_of_what_libvirt_lacks():
    objects, warnings = objects_of(VS_MACHINE)
    vm = objects["Machine/vm-1"].params
    assert vm["image"] == "debian-12" and vm["cpu"] == 2 and vm["memory"] == 512 * 2 ** 20
    assert vm["root_size"] == 20 * 2 ** 30 and vm["volumes"] == [{"name": "data", "size": 2 ** 30}]
    assert vm["machine_pool_selector"] == {"topology.kubernetes.io/region": "west"}
    assert vm["labels"] == {"team": "platform"}
    assert warnings == ["Machine/vm-1: spec.monitoring: has no meaning on libvirt pools and is ignored"]


def test_capability_fields_map_onto_the_machine_options():
    doc = copy.deepcopy(VS_MACHINE)
    doc["spec"]["cpu"] = {"cores": 2, "sockets": 2}
    objects, _warnings = objects_of(doc)
    assert objects["Machine/vm-1"].params["topology"] == {"sockets": 2, "cores": 2, "threads": 1}
    assert objects["Machine/vm-1"].params["cpu"] == 4


def test_all_problems_of_all_documents_at_once():
    bad_class = dict(IC_CLASS, capabilities={"cpu": 0, "memory": "1Ki"})
    bad_vm = copy.deepcopy(VS_MACHINE)
    bad_vm["spec"]["cpu"] = {"cores": 257}
    found = problems_of(bad_class, bad_vm)
    assert found == [
        "MachineClass/machineclass-sample: capabilities.cpu: must be between 1 and 256, got 0",
        found[1],
        "Machine/vm-1: spec.cpu.cores: must be between 1 and 256"]
    assert found[1].startswith("MachineClass/machineclass-sample: capabilities.memory: ")


def _set(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is DELETE:
        node.pop(keys[-1], None)
    elif isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return doc


DELETE = object()
POOL9_MACHINE = _set(_set(_set(_set(IC_MACHINE, "spec.volumes", []), "spec.networkInterfaces", []), "spec.ignitionRef",
                          DELETE), "spec.machinePoolRef", {"name": "pool9"})

# (id, documents, the problem expected: its start)
CORPUS = [
    # envelopes
    ("not-a-mapping", ["just text"], "definition[0]: must be a mapping"),
    ("no-apiversion", [_set(IC_CLASS, "apiVersion", DELETE)], "MachineClass/machineclass-sample: apiVersion: "
                                                              "required value"),
    ("unknown-apiversion", [_set(IC_CLASS, "apiVersion", "compute.example.com/v1")],
     "MachineClass/machineclass-sample: apiVersion: unknown apiVersion"),
    ("unknown-kind", [_set(IC_CLASS, "kind", "MachineFlavor")], "MachineFlavor/machineclass-sample: kind: no kind"),
    ("no-kind", [_set(IC_CLASS, "kind", DELETE)], "<no kind>/machineclass-sample: kind: required value"),
    ("no-metadata", [_set(IC_CLASS, "metadata", DELETE)], "MachineClass/definition[0]: metadata: required value"),
    ("bad-name", [_set(IC_CLASS, "metadata.name", "Big_Name")], "MachineClass/Big_Name: metadata.name: 'Big_Name' is "
                                                                "not a DNS-1123 subdomain"),
    ("bad-label", [_set(IC_CLASS, "metadata.labels", {"app": "a b"})], "MachineClass/machineclass-sample: "
                                                                       "metadata.labels"),
    ("duplicate", [IC_CLASS, IC_CLASS], "MachineClass/machineclass-sample: metadata.name: duplicate MachineClass"),
    ("unknown-field", [_set(IC_CLASS, "spec", {})], "MachineClass/machineclass-sample: spec: unknown field"),
    # IronCore
    ("ic-class-cpu-0", [_set(IC_CLASS, "capabilities.cpu", 0)], "MachineClass/machineclass-sample: capabilities.cpu: "
                                                                "must be between 1 and 256"),
    ("ic-class-cpu-257", [_set(IC_CLASS, "capabilities.cpu", 257)], "MachineClass/machineclass-sample: "
                                                                    "capabilities.cpu: must be between 1 and 256"),
    ("ic-class-no-memory", [_set(IC_CLASS, "capabilities.memory", DELETE)],
     "MachineClass/machineclass-sample: capabilities.memory: required value"),
    ("ic-class-memory-word", [_set(IC_CLASS, "capabilities.memory", "lots")],
     "MachineClass/machineclass-sample: capabilities.memory:"),
    ("ic-machine-no-class", [_set(IC_MACHINE, "spec.machineClassRef", DELETE)],
     "Machine/machine-sample: spec.machineClassRef: required value"),
    ("ic-machine-dangling-class", [_set(IC_MACHINE, "spec.machineClassRef.name", "nope"), IC_VOLUME, IC_NIC, IC_SECRET],
     "Machine/machine-sample: spec.machineClassRef.name: MachineClass 'nope' is neither"),
    ("ic-machine-dangling-volume", [IC_CLASS, IC_NIC, IC_SECRET, IC_MACHINE],
     "Machine/machine-sample: spec.volumes[0].volumeRef.name: Volume 'my-volume' is neither"),
    ("ic-machine-dangling-nic", [IC_CLASS, IC_VOLUME, IC_SECRET, IC_MACHINE],
     "Machine/machine-sample: spec.networkInterfaces[0].networkInterfaceRef.name: NetworkInterface "),
    ("ic-machine-dangling-secret", [IC_CLASS, IC_VOLUME, IC_NIC, IC_MACHINE],
     "Machine/machine-sample: spec.ignitionRef.name: Secret 'my-ignition-secret' is not among"),
    ("ic-secret-no-key", [IC_CLASS, IC_VOLUME, IC_NIC, _set(IC_SECRET, "data", {"other": "e30="}), IC_MACHINE],
     "Machine/machine-sample: spec.ignitionRef.key: the secret has no key 'ignition.yaml'"),
    ("ic-secret-bad-base64", [IC_CLASS, IC_VOLUME, IC_NIC, _set(IC_SECRET, "data.ignition", "%%%"), IC_MACHINE],
     "Machine/machine-sample: spec.ignitionRef.key: data.ignition of the secret is not valid base64"),
    ("ic-power", [_set(IC_MACHINE, "spec.power", "Maybe")], "Machine/machine-sample: spec.power: unsupported value"),
    # YAML 1.1 reads an unquoted On (and Off, yes, no) as a boolean: say so, and how to write it
    ("ic-power-unquoted-on", [_set(IC_MACHINE, "spec.power", True)],
     'Machine/machine-sample: spec.power: must be a string, and YAML read the boolean true here: an unquoted On is '
     'one; write power: "On"'),
    ("ic-power-unquoted-off", [_set(IC_MACHINE, "spec.power", False)],
     'Machine/machine-sample: spec.power: must be a string, and YAML read the boolean false here: an unquoted Off is '
     'one; write power: "Off"'),
    ("ic-volume-two-sources", [_set(IC_MACHINE, "spec.volumes.1.volumeRef", {"name": "x"})],
     "Machine/machine-sample: spec.volumes[1]: give exactly one of volumeRef, emptyDisk, localDisk or ephemeral"),
    ("ic-volume-duplicate", [_set(IC_MACHINE, "spec.volumes.1.name", "rootdisk")],
     "Machine/machine-sample: spec.volumes[1].name: duplicate name"),
    ("ic-volume-not-list", [_set(IC_MACHINE, "spec.volumes", "rootdisk")],
     "Machine/machine-sample: spec.volumes: must be a list"),
    ("ic-volume-size", [_set(IC_VOLUME, "spec.resources.storage", "-1Gi")], "Volume/my-volume: spec.resources.storage"),
    ("ic-volume-image-unpublished", [_set(IC_VOLUME, "spec.image", "nope")],
     "Volume/my-volume: spec.image: no image named 'nope' is published on pool pool1"),
    ("ic-volume-os-image-unpublished", [_set(IC_VOLUME, "spec.dataSource", {"osImage": "no-such-image"})],
     "Volume/my-volume: spec.dataSource.osImage: no image named 'no-such-image' is published on pool pool1"),
    ("ic-volume-two-images", [_set(_set(IC_VOLUME, "spec.image", "debian-12"), "spec.dataSource",
                                   {"osImage": "other"})],
     "Volume/my-volume: spec.dataSource.osImage: differs from spec.image"),
    ("ic-volume-snapshot", [_set(IC_VOLUME, "spec.dataSource", {"snapshotRef": {"name": "s"}})],
     "Volume/my-volume: spec.dataSource.snapshotRef: volume snapshots are not supported"),
    ("ic-volume-image-not-string", [_set(IC_VOLUME, "spec.image", 42)], "Volume/my-volume: spec.image: must be"),
    ("ic-volume-no-resources", [_set(IC_VOLUME, "spec.resources", DELETE)],
     "Volume/my-volume: spec.resources: required value"),
    ("ic-nic-no-network", [_set(IC_NIC, "spec.networkRef", DELETE)],
     "NetworkInterface/networkinterface-sample: spec.networkRef: required value"),
    ("ic-pool-unknown", [{"apiVersion": IC, "kind": "MachinePool", "metadata": {"name": "pool9"}}],
     "MachinePool/pool9: metadata.name: no pool named 'pool9'"),
    ("ic-pool-ref-unknown", [IC_CLASS, POOL9_MACHINE],
     "Machine/machine-sample: spec.machinePoolRef.name: no pool named 'pool9'"),
    # OpenShift
    ("os-provider-kind", [_set(OS_SET, "spec.template.spec.providerSpec.value.kind", "AWSMachineProviderConfig")],
     "MachineSet/workers: spec.template.spec.providerSpec.value.kind: must be LibvirtMachineProviderSpec"),
    ("os-replicas-negative", [_set(OS_SET, "spec.replicas", -1)], "MachineSet/workers: spec.replicas: must be at "
                                                                  "least 0"),
    ("os-replicas-text", [_set(OS_SET, "spec.replicas", "two")], "MachineSet/workers: spec.replicas: must be an "
                                                                 "integer"),
    ("os-selector-mismatch", [_set(OS_SET, "spec.selector.matchLabels", {"set": "other"})],
     "MachineSet/workers: spec.selector: selector does not match"),
    ("os-no-size", [_set(OS_SET, "spec.template.spec.providerSpec.value.machineClass", DELETE)],
     "MachineSet/workers: spec.template.spec.providerSpec.value.machineClass: give machineClass, or both cpu"),
    ("os-dangling-class", [_set(OS_SET, "spec.template.spec.providerSpec.value.machineClass", "huge")],
     "MachineSet/workers: spec.template.spec.providerSpec.value.machineClass: MachineClass 'huge' is neither"),
    ("os-delete-policy", [_set(OS_SET, "spec.deletePolicy", "Youngest")],
     "MachineSet/workers: spec.deletePolicy: unsupported value"),
    ("os-mhc-condition", [_set(OS_MHC, "spec.unhealthyConditions.0.status", "Maybe")],
     "MachineHealthCheck/workers: spec.unhealthyConditions[0].status: unsupported value"),
    ("os-mhc-timeout", [_set(OS_MHC, "spec.unhealthyConditions.0.timeout", "soon")],
     "MachineHealthCheck/workers: spec.unhealthyConditions[0].timeout:"),
    ("os-mhc-no-selector", [_set(OS_MHC, "spec.selector", DELETE)], "MachineHealthCheck/workers: spec.selector: "
                                                                    "required value"),
    ("os-dangling-secret", [_set(OS_SET, "spec.template.spec.providerSpec.value.userDataSecret",
                                 {"name": "worker-user-data"})],
     "MachineSet/workers: spec.template.spec.providerSpec.value.userDataSecret.name: Secret 'worker-user-data'"),
    ("os-bad-mac", [_set(OS_SET, "spec.template.spec.providerSpec.value.networkInterfaces",
                         [{"name": "eth0", "network": "machinery", "mac": "zz"}])],
     "MachineSet/workers: spec.template.spec.providerSpec.value.networkInterfaces[0].mac:"),
    # KupenStack
    ("ks-no-vcpu", [_set(KS_VM, "spec.vcpu", DELETE)], "VirtualMachine/sample-vm: spec.vcpu: required value"),
    ("ks-vcpu-text", [_set(KS_VM, "spec.vcpu", "three")], "VirtualMachine/sample-vm: spec.vcpu: must be an integer"),
    ("ks-vcpu-0", [_set(KS_VM, "spec.vcpu", 0)], "VirtualMachine/sample-vm: spec.vcpu: must be between 1 and 256"),
    ("ks-no-memory", [_set(KS_VM, "spec.memory", DELETE)], "VirtualMachine/sample-vm: spec.memory: required value"),
    ("ks-memory-small", [_set(KS_VM, "spec.memory", "1Mi")], "VirtualMachine/sample-vm: spec.memory:"),
    ("ks-no-disks", [_set(KS_VM, "spec.diskAttachments", DELETE)], "VirtualMachine/sample-vm: spec.diskAttachments: "
                                                                   "required value"),
    ("ks-empty-disks", [_set(KS_VM, "spec.diskAttachments", [])], "VirtualMachine/sample-vm: spec.diskAttachments: "
                                                                  "needs at least one volume"),
    ("ks-dangling-volume", [_set(KS_VM, "spec.diskAttachments", [{"name": "vol-nowhere"}])],
     "VirtualMachine/sample-vm: spec.diskAttachments[0].name: Volume 'vol-nowhere' is neither"),
    ("ks-running-text", [_set(KS_VM, "spec.running", "yes")], "VirtualMachine/sample-vm: spec.running: must be true "
                                                              "or false"),
    ("ks-networks-twice", [_set(KS_VM, "spec.virtualNetworks", ["net-db", "net-db"])],
     "VirtualMachine/sample-vm: spec.virtualNetworks[1]: network 'net-db' is listed twice"),
    # vitistack: every range at both edges, required fields, provider
    ("vs-cores-0", [_set(VS_MACHINE, "spec.cpu.cores", 0)], "Machine/vm-1: spec.cpu.cores: must be between 1 and 256"),
    ("vs-cores-257", [_set(VS_MACHINE, "spec.cpu.cores", 257)], "Machine/vm-1: spec.cpu.cores: must be between 1 and "
                                                                "256"),
    ("vs-threads-0", [_set(VS_MACHINE, "spec.cpu.threadsPerCore", 0)], "Machine/vm-1: spec.cpu.threadsPerCore: must "
                                                                       "be between 1 and 8"),
    ("vs-threads-9", [_set(VS_MACHINE, "spec.cpu.threadsPerCore", 9)], "Machine/vm-1: spec.cpu.threadsPerCore: must "
                                                                       "be between 1 and 8"),
    ("vs-sockets-0", [_set(VS_MACHINE, "spec.cpu.sockets", 0)], "Machine/vm-1: spec.cpu.sockets: must be between 1 "
                                                                "and 16"),
    ("vs-sockets-17", [_set(VS_MACHINE, "spec.cpu.sockets", 17)], "Machine/vm-1: spec.cpu.sockets: must be between 1 "
                                                                  "and 16"),
    ("vs-size-0", [_set(VS_MACHINE, "spec.disks.1.sizeGB", 0)], "Machine/vm-1: spec.disks[1].sizeGB: must be between "
                                                                "1 and 65536"),
    ("vs-size-65537", [_set(VS_MACHINE, "spec.disks.1.sizeGB", 65537)], "Machine/vm-1: spec.disks[1].sizeGB: must be "
                                                                        "between 1 and 65536"),
    ("vs-iops-99", [_set(VS_MACHINE, "spec.disks.1.iops", 99)], "Machine/vm-1: spec.disks[1].iops: must be between "
                                                                "100 and 64000"),
    ("vs-iops-64001", [_set(VS_MACHINE, "spec.disks.1.iops", 64001)], "Machine/vm-1: spec.disks[1].iops: must be "
                                                                      "between 100 and 64000"),
    ("vs-throughput-124", [_set(VS_MACHINE, "spec.disks.1.throughput", 124)], "Machine/vm-1: spec.disks[1].throughput: "
                                                                              "must be between 125 and 4000"),
    ("vs-throughput-4001", [_set(VS_MACHINE, "spec.disks.1.throughput", 4001)],
     "Machine/vm-1: spec.disks[1].throughput: must be between 125 and 4000"),
    ("vs-memory-negative", [_set(VS_MACHINE, "spec.memory", -1)], "Machine/vm-1: spec.memory: must be at least 0"),
    ("vs-os-family", [_set(VS_MACHINE, "spec.os.family", "beos")], "Machine/vm-1: spec.os.family: unsupported value"),
    ("vs-os-arch", [_set(VS_MACHINE, "spec.os.architecture", "sparc")], "Machine/vm-1: spec.os.architecture: "
                                                                        "unsupported value"),
    # the first generation requires nothing: no provider is vitistack's default, kubevirt, not served by default
    ("vs-no-provider", [_set(VS_MACHINE, "spec.providerConfig", DELETE)], "Machine/vm-1: spec (no provider: "
                                                                          "vitistack's default, kubevirt): provider "
                                                                          "'kubevirt' is not served by this run"),
    ("vs-provider-aws", [_set(VS_MACHINE, "spec.providerConfig.name", "aws")],
     "Machine/vm-1: spec.providerConfig.name: provider 'aws' is not served by this run (the manifest option "
     "providers is [libvirt]); add aws to providers"),
    # the current generation requires spec.provider
    ("vs-current-no-provider", [_set(_set(VS_MACHINE, "spec.providerConfig", DELETE), "spec.machineClass", "small")],
     "Machine/vm-1: spec.provider: required value"),
    ("vs-two-providers", [_set(VS_MACHINE, "spec.provider", "kubevirt")], "Machine/vm-1: spec.providerConfig.name: "
                                                                          "names provider 'libvirt', spec.provider "
                                                                          "'kubevirt': give one"),
    ("vs-two-classes", [_set(VS_MACHINE, "spec.machineClass", "medium")], "Machine/vm-1: spec.instanceType: names "
                                                                          "class 'small', spec.machineClass 'medium'"),
    ("vs-config-drive", [_set(VS_MACHINE, "spec.cloudInit", {"type": "configDrive"})],
     "Machine/vm-1: spec.cloudInit.type: configDrive is not built"),
    ("vs-cloud-init-twice", [_set(VS_MACHINE, "spec.cloudInit", {"userData": "#cloud-config\n",
                                                                 "userDataBase64": "I2Nsb3VkLWNvbmZpZwo="})],
     "Machine/vm-1: spec.cloudInit.userDataBase64: give userData once"),
    ("vs-cloud-init-secret-missing", [_set(VS_MACHINE, "spec.cloudInit", {"userDataSecretRef": {"name": "gone"}})],
     "Machine/vm-1: spec.cloudInit.userDataSecretRef.name: Secret 'gone' is not among the documents"),
    ("vs-iso-not-url", [_set(VS_MACHINE, "spec.os.isoUri", "debian.iso")], "Machine/vm-1: spec.os.isoUri: "
                                                                           "'debian.iso' is no http(s) URL"),
    ("vs-image-and-iso", [_set(_set(VS_MACHINE, "spec.os.isoUri", "https://x.example/a.iso"), "spec.os.imageID",
                               "debian-12")], "Machine/vm-1: spec.os.isoUri: the machine boots one image"),
    ("vs-two-boot-disks", [_set(VS_MACHINE, "spec.disks.1.boot", True)], "Machine/vm-1: spec.disks[1].boot: only one "
                                                                         "disk can be the boot disk"),
    ("vs-name-not-a-host-name", [_set(VS_MACHINE, "spec.name", "Web Server")], "Machine/vm-1: spec.name: 'Web Server' "
                                                                               "is not a host name"),
    ("vs-no-image", [_set(VS_MACHINE, "spec.os.version", "13")], "Machine/vm-1: spec.os: no image published"),
    ("vs-private-ip", [_set(VS_MACHINE, "spec.network.privateIP", "10.0.0.300")], "Machine/vm-1: "
                                                                                  "spec.network.privateIP:"),
    ("vs-backup-schedule", [_set(VS_MACHINE, "spec.backup", {"enabled": True, "schedule": "daily"})],
     "Machine/vm-1: spec.backup.schedule: 'daily' is not a cron schedule"),
    ("vs-backup-retention", [_set(VS_MACHINE, "spec.backup", {"enabled": True, "retentionDays": 0})],
     "Machine/vm-1: spec.backup.retentionDays: must be at least 1"),
    ("vs-tags", [_set(VS_MACHINE, "spec.tags", {"bad key!": "x"})], "Machine/vm-1: spec.tags"),
]


@pytest.mark.parametrize("documents,expected", [case[1:] for case in CORPUS], ids=[case[0] for case in CORPUS])
def test_invalid_document(documents, expected):
    found = problems_of(*documents)
    assert any(problem.startswith(expected) for problem in found), found


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 40


def test_sources_from_files_dirs_and_text(tmp_path):
    (tmp_path / "a.yml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: one}\n---\n")
    (tmp_path / "b.yaml").write_text("kind: List\nitems:\n  - {apiVersion: v1, kind: Secret, metadata: {name: two}}\n")
    (tmp_path / "notes.txt").write_text("ignored")
    found, problems = docs.load_sources(str(tmp_path), "apiVersion: v1\nkind: Secret\nmetadata: {name: three}\n")
    assert [doc["metadata"]["name"] for _origin, doc in found] == ["one", "two", "three"] and problems == []
    _found, problems = docs.load_sources([str(tmp_path / "missing.yml")], None)
    assert problems == ["src: %s: no such file or directory" % (tmp_path / "missing.yml")]


def test_a_key_given_twice_is_refused_with_its_path(tmp_path):
    (tmp_path / "web.yml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: one}\n---\n"
        "apiVersion: compute.ironcore.dev/v1alpha1\nkind: Machine\nmetadata:\n  name: web-1\nspec:\n"
        "  machineClassRef: {name: small}\n  power: On\n  machineClassRef: {name: large}\n  power: Off\n"
        "  volumes:\n    - {name: a, name: b}\n")
    _found, problems = docs.load_sources(str(tmp_path), None)
    where = tmp_path / "web.yml"
    assert problems == [
        "src: %s#2: spec.machineClassRef: the key machineClassRef is given twice (lines 10 and 12); give it once"
        % where,
        "src: %s#2: spec.power: the key power is given twice (lines 11 and 13); give it once" % where,
        "src: %s#2: spec.volumes[0].name: the key name is given twice (lines 15 and 15); give it once" % where]
    _found, problems = docs.load_sources(None, "kind: Machine\nkind: Machine\n")
    assert problems == ["definition#1: kind: the key kind is given twice (lines 1 and 2); give it once"]
    # YAML merge keys are no duplicates
    found, problems = docs.load_sources(None, "base: &b {a: 1}\nmerged:\n  <<: *b\n  c: 2\n")
    assert problems == [] and found[0][1]["merged"] == {"a": 1, "c": 2}


def alias_bomb(levels):
    """A Machine of a few hundred bytes whose annotations, their aliases expanded, hold 10**levels strings."""
    lines = ["apiVersion: compute.ironcore.dev/v1alpha1", "kind: MachineClass", "metadata:", "  name: bomb",
             "  annotations:", "    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += ["    l%d: &l%d [%s]" % (level, level, ", ".join(["*l%d" % (level - 1)] * 10))
              for level in range(1, levels)]
    return "\n".join(lines + ["capabilities: {cpu: 1, memory: 128Mi}"]) + "\n"


def test_an_alias_bomb_is_refused_naming_its_document(tmp_path):
    """Ten levels stand for 10**10 nodes: the document is refused from its 150 or so written nodes, each visited
    once; six levels (a million) are refused too, and nothing of either document is built."""
    (tmp_path / "bomb.yml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: one}\n---\n" + alias_bomb(10))
    found, problems = docs.load_sources(str(tmp_path), alias_bomb(6))
    assert [origin for origin, _doc in found] == ["%s#1" % (tmp_path / "bomb.yml")]
    assert len(problems) == 2
    assert problems[0].startswith("src: %s#2: its YAML aliases expand it to " % (tmp_path / "bomb.yml"))
    assert problems[1].startswith("definition#1: its YAML aliases expand it to ")
    assert "(the anchor at line 10 is one they repeat)" in problems[0]  # the file's second document
    assert "(the anchor at line 6 is one they repeat)" in problems[1]
    assert all(problem.endswith("write the repeated parts out") for problem in problems)


def test_an_alias_naming_a_node_around_it_is_refused():
    _found, problems = docs.load_sources(None, "kind: Machine\nspec: &spec\n  again: *spec\n")
    assert problems == ["definition#1: an alias names the anchor at line 2, whose node holds the alias itself: the "
                        "document would never end; write it without that alias"]


def test_aliases_that_repeat_a_block_are_read_and_checked_once():
    """Shared labels on many machines are what aliases are for: read as written, a duplicate key in the shared
    block reported once, where it is written."""
    text = ("kind: List\nitems:\n" + "  - {kind: Secret, metadata: {name: base, labels: &labels {app: web, tier: a}}}\n"
            + "".join("  - {kind: Secret, metadata: {name: s%d, labels: *labels}}\n" % index for index in range(300)))
    found, problems = docs.load_sources(None, text)
    assert problems == [] and len(found) == 301
    assert found[-1][1]["metadata"]["labels"] == {"app": "web", "tier": "a"}
    _found, problems = docs.load_sources(None, "a: &x {k: 1, k: 2}\nb: *x\nc: [*x, *x]\n")
    assert problems == ["definition#1: a.k: the key k is given twice (lines 1 and 1); give it once"]


def test_a_document_nested_thousands_deep_is_refused(tmp_path):
    (tmp_path / "deep.yml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    found, problems = docs.load_sources(str(tmp_path), "a: " + "{b: " * 5000 + "}" * 5000)
    assert found == [] and problems == ["src: %s: %s" % (tmp_path / "deep.yml", docs.TOO_DEEP),
                                        "definition: %s" % docs.TOO_DEEP]


def test_a_symlink_out_of_the_src_directory_is_refused(tmp_path):
    outside = tmp_path / "secret.yml"
    outside.write_text("root: secret\n")
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a.yml").write_text("apiVersion: v1\nkind: Secret\nmetadata: {name: one}\n")
    (manifests / "b.yml").symlink_to(manifests / "a.yml")
    (manifests / "shadow.yml").symlink_to(outside)
    found, problems = docs.load_sources(str(manifests), None)
    refused = "src: %s: a symlink to %s, outside %s; refused" % (manifests / "shadow.yml", outside, manifests)
    assert problems == [refused]
    assert [origin for origin, _doc in found] == ["%s#1" % (manifests / name) for name in ("a.yml", "b.yml")]


def test_vitistack_status_speaks_vitistack():
    from ansible_collections.machinery.compute.plugins.module_utils.manifests import vitistack

    def condition(kind, ok, reason="r"):
        return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": ""}
    machine = {"name": "vm-1", "phase": "Shutdown", "uuid": "u-1", "pool": "hv1", "cpu": 2, "memory": "256Mi",
               "ip_addresses": [], "network_interfaces": [{"name": "eth0", "network": "default"}], "volumes": [],
               "conditions": [condition("Ready", False, "Shutdown"), condition("VolumesReady", True, "Attached"),
                              condition("NetworkInterfacesReady", True, "Attached"),
                              condition("BootstrapReady", False, "NotRunning")],
               "guest": None, "created": "2026-01-01T00:00:00+00:00", "last_error": None}
    shown = vitistack.status(None, {"machine": machine})
    assert shown["phase"] == "Stopped" and shown["memory"] == 256 * 2 ** 20 and shown["providerID"] == "libvirt://hv1/u-1"
    assert {item["type"]: item["status"] for item in shown["conditions"]} == {
        "Ready": "False", "InfrastructureReady": "True", "NetworkReady": "False", "BootstrapReady": "False",
        "DrainReady": "True", "BackupReady": "False"}
    running = dict(machine, phase="Running", ip_addresses=["10.0.0.5"],
                   conditions=[condition("Ready", True), condition("VolumesReady", True),
                               condition("NetworkInterfacesReady", True), condition("BootstrapReady", True)],
                   guest={"hostname": "vm-1.lab", "os": {"name": "Debian GNU/Linux", "version": "12", "machine": "x86_64"},
                          "kernel": {"release": "6.1.0-26-amd64"}, "boot_time": "2026-01-01T00:01:00+00:00"})
    backups = {"machine": "vm-1", "backups": [{"name": "b1", "created": "2026-01-01T02:00:00+00:00"},
                                              {"name": "b2", "created": "2026-01-02T02:00:00+00:00"}]}
    shown = vitistack.status(None, {"machine": running, "backups": backups})
    assert shown["phase"] == "Running" and all(item["status"] == "True" for item in shown["conditions"])
    assert shown["conditions"][-1]["message"] == "newest backup b2 taken 2026-01-02T02:00:00+00:00"
    pinned = dict(running, volumes=[{"name": "secret", "encrypted": True, "state": "Attached"}])
    drain = vitistack.status(None, {"machine": pinned})["conditions"][-2]
    assert (drain["type"], drain["status"], drain["reason"]) == ("DrainReady", "False", "EncryptedVolumes")
    fixed = dict(running, network_interfaces=[{"name": "eth0", "network": "default", "ip_address": "10.0.0.5"}])
    assert vitistack.status(None, {"machine": fixed})["conditions"][-2]["reason"] == "FixedAddresses"
    assert (shown["hostname"], shown["operatingSystem"], shown["operatingSystemVersion"], shown["kernelVersion"]) == (
        "vm-1.lab", "Debian GNU/Linux", "12", "6.1.0-26-amd64")
    assert vitistack.status(None, {"machine": dict(machine, phase="Terminating")})["phase"] == "Stopping"


# --- errors speak the document's language; deletion phases; Unknown conditions ---------------------------------

def test_core_problems_name_the_documents_own_path():
    ironcore = copy.deepcopy(IC_MACHINE)
    ironcore["spec"]["volumes"][1]["emptyDisk"]["sizeLimit"] = "1Ki"
    openshift = copy.deepcopy(OS_SET)
    openshift["spec"]["template"]["spec"]["providerSpec"]["value"]["volumes"] = [
        {"name": "d", "size": "1Gi", "device": "vdb"}, {"name": "e", "size": "1Gi", "device": "vdb"}]
    found = problems_of(IC_CLASS, IC_VOLUME, IC_NIC, IC_SECRET, ironcore, openshift)
    assert any(line.startswith("Machine/machine-sample: spec.volumes[1].emptyDisk.sizeLimit: ") for line in found)
    assert any(line.startswith("MachineSet/workers: spec.template.spec.providerSpec.value.volumes[0].device: ")
               for line in found), found
    assert not any("machines[" in line or ": volumes[" in line for line in found)


def test_health_check_problems_and_unknown_conditions():
    """Upstream's meaning (issue 39): Ready is the guest's readiness (NodeReady); Unknown is its own status, and
    also the pool's silence (the lost-pool timeout); Node conditions libvirt cannot see are warned with why;
    nodeStartupTimeout "0" disables the startup check; timeouts are Go durations."""
    bad = copy.deepcopy(OS_MHC)
    bad["spec"]["maxUnhealthy"] = "140%"
    assert problems_of(bad) == ["MachineHealthCheck/workers: spec.maxUnhealthy: must be between 0% and 100%, got 140%"]
    unknown = copy.deepcopy(OS_MHC)
    unknown["spec"]["unhealthyConditions"] = [{"type": "Ready", "status": "False", "timeout": "300s"},
                                              {"type": "Ready", "status": "Unknown", "timeout": "1.5h"},
                                              {"type": "Ready", "status": "Unknown", "timeout": "1h2m3s"},
                                              {"type": "Terminating", "status": "True", "timeout": "0s"},
                                              {"type": "DiskPressure", "status": "True", "timeout": "300ms"}]
    unknown["spec"]["nodeStartupTimeout"] = "0"
    objects, warnings = objects_of(unknown)
    params = objects["MachineHealthCheck/workers"].params
    assert params["unhealthy_conditions"] == [{"type": "NodeReady", "status": "False", "timeout": 300.0},
                                              {"type": "NodeReady", "status": "Unknown", "timeout": 3723.0}]
    assert params["unreachable_timeout"] == 3723.0 and params["node_startup_timeout"] == 0.0
    assert params["startup_condition"] == "NodeReady"
    assert any(line.startswith("MachineHealthCheck/workers: spec.unhealthyConditions[3].type: Terminating: ")
               for line in warnings), warnings
    assert any(line.startswith("MachineHealthCheck/workers: spec.unhealthyConditions[4].type: DiskPressure: ")
               for line in warnings), warnings


@pytest.mark.parametrize("text, expected", [("300ms", 0.3), ("1.5h", 5400.0), ("1h2m3s", 3723.0), ("0", 0.0),
                                            ("2h45m", 9900.0), (".5s", 0.5), ("1us", 1e-6)])
def test_go_durations(text, expected):
    from ansible_collections.machinery.compute.plugins.module_utils.manifests.openshift import go_duration
    assert go_duration(text, "t") == pytest.approx(expected)


@pytest.mark.parametrize("text", ["5", "-1s", "1d", "s", "1h 2m", ""])
def test_bad_go_durations_are_refused(text):
    from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
    from ansible_collections.machinery.compute.plugins.module_utils.manifests.openshift import go_duration
    with pytest.raises(ValidationError):
        go_duration(text, "t")


def test_a_nic_on_a_network_no_pool_has_is_refused_before_anything_is_written():
    vm = copy.deepcopy(KS_VM)
    vm["spec"]["virtualNetworks"] = ["net-db", "no-such-net"]
    assert problems_of(vm) == ["VirtualMachine/sample-vm: spec.virtualNetworks[1]: no libvirt network 'no-such-net' "
                               "on pool pool1"]


def test_an_image_no_pool_publishes_is_refused_under_the_documents_path():
    ironcore = _set(_set(IC_MACHINE, "spec.image", "no-such-image"), "spec.machinePoolRef", {"name": "pool2"})
    found = problems_of(IC_CLASS, IC_VOLUME, IC_NIC, IC_SECRET, ironcore)
    assert "Machine/machine-sample: spec.image: no image named 'no-such-image' is published on pool pool2 " \
           "(publish it with machinery.compute.machine_image)" in found, found
    assert problems_of(_set(OS_SET, "spec.template.spec.providerSpec.value.image", "/no/such/disk.qcow2")) == [
        "MachineSet/workers: spec.template.spec.providerSpec.value.image: '/no/such/disk.qcow2' is neither an image "
        "published on a pool of this run nor a file"]
    unplaced = _set(VS_MACHINE, "spec.os.imageID", "gone")
    assert [line for line in problems_of(unplaced) if "spec.os" in line] == [
        "Machine/vm-1: spec.os.imageID: no image named 'gone' is published on any pool of this run (pool1, pool2) "
        "(publish it with machinery.compute.machine_image)"]
    # published on one pool of two: the scheduler places the machine there
    objects, _warnings = objects_of(_set(OS_SET, "spec.template.spec.providerSpec.value.image", "debian-12"))
    assert objects["MachineSet/workers"].params["template"]["image"] == "debian-12"


def test_kupenstack_namespace_is_kept_and_a_second_namespace_is_refused():
    objects, _warnings = objects_of(KS_VM)
    assert objects["VirtualMachine/sample-vm"].params["labels"] == {"kupenstack.io/namespace": "default"}
    pools = FakePools()
    pools.machines = [{"name": "sample-vm", "pool": "pool1", "labels": {"kupenstack.io/namespace": "team-a"}}]
    with pytest.raises(docs.ManifestError) as info:
        engine.check_documents([("definition[0]", KS_VM)], pools)
    assert info.value.problems[0].startswith("VirtualMachine/sample-vm: metadata.namespace: VirtualMachine sample-vm "
                                             "exists in namespace 'team-a'")
    bad_key = _set(KS_VM, "spec.publicKey", "ssh-rsa not-base64!")
    assert problems_of(bad_key)[0].startswith("VirtualMachine/sample-vm: spec.publicKey: ")


@pytest.mark.parametrize("dialect, kind, deleting, gone", [
    ("ironcore", "Machine", {"state": "Terminating"}, {}),
    ("openshift", "Machine", {"phase": "Deleting"}, {}),
    ("kupenstack", "VirtualMachine", {"phase": "Terminating"}, {}),
    ("vitistack", "Machine", "Terminating", "Terminated")])
def test_deletion_reports_the_dialects_own_phases(dialect, kind, deleting, gone):
    module = getattr(engine, dialect)
    obj = docs and type("Obj", (), {"kind": kind, "params": {}})()
    shown = module.status(obj, {"machine": None, "deletion": "deleting"})
    after = module.status(obj, {"machine": None, "deletion": "gone"})
    if dialect == "vitistack":
        assert (shown["phase"], after["phase"]) == (deleting, gone)
    else:
        assert (shown, after) == (deleting, gone)


def test_vitistack_instance_types_keys_with_a_script_and_encrypted_disks():
    import email
    doc = copy.deepcopy(VS_MACHINE)
    doc["spec"].update(instanceType="t3.medium", sshKeys=[KEY], userData="#!/bin/sh\necho hi\n")
    doc["spec"]["disks"][1]["encrypted"] = True
    vm = engine.parse([("d", doc)], docs.Problems())[0].params
    # a class is named as the user wrote it (a DNS-1123 subdomain)
    assert vm["machine_class"] == "t3.medium" and "ssh_authorized_keys" not in vm
    message = email.message_from_string(vm["cloud_init"]["user_data"])
    parts = [(part.get_content_type(), part.get_payload()) for part in message.walk() if not part.is_multipart()]
    assert parts[0][0] == "text/cloud-config" and KEY in parts[0][1]
    assert parts[1] == ("text/x-shellscript", "#!/bin/sh\necho hi\n")
    again = engine.parse([("d", copy.deepcopy(doc))], docs.Problems())[0].params
    assert again["cloud_init"] == vm["cloud_init"]  # the same text on every apply
    assert vm["volumes"][0]["encrypted"] is True and len(vm["volumes"][0]["passphrase"]) >= 32
    assert again["volumes"][0]["passphrase"] != vm["volumes"][0]["passphrase"]
    bad = _set(VS_MACHINE, "spec.instanceType", "t3 medium!")
    assert problems_of(bad)[0].startswith("Machine/vm-1: spec.instanceType: ")


def test_ironcore_machine_pool_status_has_capacity_and_allocatable_per_class():
    pool = {"state": "Ready", "allocatable": {"cpu": 32, "memory": "16Gi"}, "allocated": {"cpu": 3, "memory": "1Gi"},
            "available_machine_classes": [{"name": "small", "cpu": 1, "memory": "512Mi", "capacity": 32,
                                           "allocatable": 29},
                                          {"name": "large", "cpu": 8, "memory": "8Gi", "capacity": 2,
                                           "allocatable": 1}]}
    assert ironcore.pool_status(pool) == {
        "state": "Ready", "availableMachineClasses": [{"name": "small"}, {"name": "large"}],
        "capacity": {"cpu": "32", "memory": "16Gi", "class/machine.small": "32", "class/machine.large": "2"},
        "allocatable": {"cpu": "29", "memory": "15Gi", "class/machine.small": "29", "class/machine.large": "1"}}
    assert ironcore.pool_status({"state": "Offline", "allocatable": {"cpu": 0, "memory": "0"},
                                 "available_machine_classes": []}) == {"state": "Offline"}
    assert ironcore.pool_status({}) == {"state": "Unknown"}


def test_a_kind_of_several_projects_gets_a_table_per_group():
    """IronCore's and vitistack's Machines in one run keep their own columns; a kind of one project keeps its name."""
    rows = {("Machine", "compute.ironcore.dev"): (("NAME", "STATE"), [("a", "Running")]),
            ("Machine", "vitistack.io"): (("NAME", "PHASE", "PROVIDER"), [("b", "Running", "kubevirt")]),
            ("MachineClass", "vitistack.io"): (("NAME", "CPU"), [("small", 1)])}
    tables = engine.tables_of(rows)
    assert sorted(tables) == ["Machine.compute.ironcore.dev", "Machine.vitistack.io", "MachineClass"]
    assert tables["Machine.vitistack.io"][0].split() == ["NAME", "PHASE", "PROVIDER"]
    assert tables["MachineClass"] == ["NAME    CPU", "small   1"]


@pytest.mark.parametrize("strategy, power, on", [
    ("always", "off", True), ("halted", "running", False), ("manual", "off", False), ("manual", "running", True),
    ("on_failure", "paused", True), (None, "off", False), (None, "running", True)])
def test_an_export_says_on_what_the_strategy_keeps_on(strategy, power, on):
    """A machine applied off and never booted (phase Pending, strategy halted or manual) exports off in every
    dialect: exported on, a re-apply would start it."""
    assert docs.powered_on({"phase": "Pending", "run_strategy": strategy, "power_state": power}) is on
