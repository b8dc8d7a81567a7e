"""IronCore's own documents (issue 39): v0.4.3 and v0.5 fields read with IronCore's meaning, or refused with the
reason. Shapes: ironcore-dev/ironcore config/samples/e2e/bases/machine-with-ephemeral-resources/machine.yaml and
config/samples/e2e/bases/ignition/ignition-secret.yaml at 0b3fd712 (v0.5+), api/compute/v1alpha1/machine_types.go
at v0.4.3 (spec.image, spec.imagePullSecret); ironcore-dev/libvirt-provider at a17b53b for the device names
(internal/controllers/machine_controller_volumes.go, computeVirtioDiskTargetDeviceName).
"""

import copy

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine, ironcore

IC = "compute.ironcore.dev/v1alpha1"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ignition", "creationTimestamp": None},
          "data": {"ignition.yaml": "eyJpZ25pdGlvbiI6eyJ2ZXJzaW9uIjoiMy4zLjAifX0="}}
ROOT_DISK = {"name": "root-disk", "device": "oda", "ephemeral": {"volumeTemplate": {"spec": {
    "volumeClassRef": {"name": "volumeclass-sample"}, "resources": {"storage": "10Gi"},
    "dataSource": {"osImage": {"image": "my-image", "architecture": "amd64"}}}}}}
PRIMARY = {"name": "primary", "ephemeral": {"networkInterfaceTemplate": {"spec": {
    "ipFamilies": ["IPv4"], "networkRef": {"name": "machinery"}}}}}
MACHINE = {"apiVersion": IC, "kind": "Machine", "metadata": {"name": "machine-sample", "uid": "u-1"},
           "spec": {"machineClassRef": {"name": "small"}, "ignitionRef": {"name": "ignition"},
                    "guestConfig": {"hostname": "sample"},
                    "volumes": [ROOT_DISK, {"name": "scratch", "device": "odb", "localDisk": {"sizeLimit": "1Gi"}}],
                    "networkInterfaces": [PRIMARY]}}


class Pools:
    snapshots = [{"name": "pool1", "classes": {"small": {}}}]
    by_name = {"pool1": snapshots[0]}
    volumes = {"pool1": set()}
    images = {"pool1": {"my-image": {}}}

    def class_on(self, name):
        return ["pool1"]

    def volume_on(self, name):
        return []

    def networks_of(self, pool):
        return {"machinery"}


def check(*documents):
    problems = docs.Problems()
    objects = engine.parse([("definition[%d]" % i, d) for i, d in enumerate(documents)], problems)
    engine.link(objects, problems, Pools())
    return {obj.ref: obj for obj in objects}, problems


def test_the_e2e_sample_keeps_its_size_devices_hostname_and_ignition_yaml_key():
    objects, problems = check(SECRET, MACHINE)
    assert problems.errors == [], problems.errors
    params = objects["Machine/machine-sample"].params
    assert params["volumes"][0] == {"name": "root-disk", "device": "vda", "image": "my-image", "size": 10 * 2 ** 30,
                                    "ephemeral": True}
    assert params["volumes"][1] == {"name": "scratch", "device": "vdb", "size": 2 ** 30, "ephemeral": True}
    assert params["hostname"] == "sample" and params["ignition"] == {"ignition": {"version": "3.3.0"}}
    assert not any("resources.storage" in line for line in problems.warnings)


def test_the_seeds_ignition_key_is_read_too_and_a_missing_one_names_both():
    seed = copy.deepcopy(SECRET)
    seed["data"] = {"ignition": seed["data"]["ignition.yaml"]}
    objects, problems = check(seed, MACHINE)
    assert problems.errors == [] and objects["Machine/machine-sample"].params["ignition"]
    seed["data"] = {"other": "e30="}
    _objects, problems = check(seed, MACHINE)
    assert problems.errors == ["Machine/machine-sample: spec.ignitionRef.key: the secret has no key 'ignition.yaml'"]


@pytest.mark.parametrize("device, image, expected", [("oda", False, "vda"), ("odc", False, "vdc"),
                                                     ("oda", True, "vdb"), ("b", False, "vdb"), ("vde", False, "vde")])
def test_device_names_as_libvirt_provider_maps_them(device, image, expected):
    assert ironcore.virtio_device(device, image) == expected


def test_classes_with_other_resources_are_refused_and_fractional_cpus_taken():
    gpu = {"apiVersion": IC, "kind": "MachineClass", "metadata": {"name": "gpu"},
           "capabilities": {"cpu": 2, "memory": "4Gi", "nvidia.com/gpu": 1}}
    half = {"apiVersion": IC, "kind": "MachineClass", "metadata": {"name": "half"},
            "capabilities": {"cpu": "500m", "memory": "1Gi"}}
    two = {"apiVersion": IC, "kind": "MachineClass", "metadata": {"name": "two"},
           "capabilities": {"cpu": "2000m", "memory": "1Gi"}}
    objects, problems = check(gpu, half, two)
    said = "\n".join(problems.errors)
    assert "MachineClass/gpu: capabilities.nvidia.com/gpu: a libvirt machine here is sized by cpu and memory" in said
    assert not any(line.startswith(("MachineClass/half", "MachineClass/two")) for line in problems.errors)
    assert objects["MachineClass/half"].data["cpu"] == 0.5  # a CFS quota on one vCPU (issue 50)
    assert objects["MachineClass/two"].data["cpu"] == 2 and isinstance(objects["MachineClass/two"].data["cpu"], int)


def test_volume_claims_unclaimable_and_uids_are_checked():
    volume = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "data"},
              "spec": {"resources": {"storage": "1Gi"}, "claimRef": {"name": "other", "uid": "u-9"}}}
    machine = copy.deepcopy(MACHINE)
    machine["spec"]["volumes"].append({"name": "data", "volumeRef": {"name": "data"}})
    _objects, problems = check(SECRET, machine, volume)
    assert any("spec.volumes[2].volumeRef.name: Volume 'data' is claimed by Machine 'other'" in line
               for line in problems.errors), problems.errors
    volume["spec"]["claimRef"] = {"name": "machine-sample", "uid": "u-9"}
    _objects, problems = check(SECRET, machine, volume)
    assert any(line.startswith("Volume/data: spec.claimRef.uid: 'u-9' is not the uid of Machine machine-sample")
               for line in problems.errors), problems.errors
    volume["spec"] = {"resources": {"storage": "1Gi"}, "unclaimable": True}
    _objects, problems = check(SECRET, machine, volume)
    assert any("Volume 'data' is unclaimable" in line for line in problems.errors), problems.errors


def test_snapshots_and_standalone_encryption_are_refused_pull_secrets_and_nic_attributes_warned():
    volume = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "data"},
              "spec": {"resources": {"storage": "1Gi"}, "dataSource": {"volumeSnapshotRef": {"name": "s"}},
                       "encryption": {"secretRef": {"name": "k"}}}}
    nic = {"apiVersion": "networking.ironcore.dev/v1alpha1", "kind": "NetworkInterface", "metadata": {"name": "n"},
           "spec": {"networkRef": {"name": "machinery"}, "providerID": "x", "attributes": {"a": "b"},
                    "machineRef": {"name": "machine-sample", "uid": "u-1"}}}
    machine = copy.deepcopy(MACHINE)
    machine["spec"].update(image="my-image", imagePullSecret={"name": "pull"})
    machine["spec"]["networkInterfaces"] = [{"name": "primary", "networkInterfaceRef": {"name": "n"}}]
    pull = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}, "stringData": {
        ".dockerconfigjson": '{"auths": {"registry.example.com": {"username": "u", "password": "p"}}}'}}
    _objects, problems = check(SECRET, machine, volume, nic, pull)
    said = "\n".join(problems.errors + problems.warnings)
    for line in ("Volume/data: spec.dataSource.volumeSnapshotRef: volume snapshots are not supported",
                 "Volume/data: spec.encryption.secretRef.name: a standalone volume",
                 "Machine/machine-sample: spec.imagePullSecret.name: the Machine's images are no OCI references",
                 "NetworkInterface/n: spec.providerID: set by the provider",
                 "NetworkInterface/n: spec.attributes.a: attributes pass settings"):
        assert line in said, line
    assert not any(line.startswith("NetworkInterface/n: spec.machineRef") for line in problems.errors)


def test_bare_oci_references_and_their_pull_secret():
    """IronCore's references carry no scheme: one whose first part is a registry host is an oci:// image, and
    spec.imagePullSecret's .dockerconfigjson entry for that registry is the machine's image_pull_secret."""
    assert ironcore.oci_image("ghcr.io/ironcore-dev/os-images/gardenlinux:1443.3") == \
        "oci://ghcr.io/ironcore-dev/os-images/gardenlinux:1443.3"
    assert ironcore.oci_image("127.0.0.1:5000/os/debian@sha256:" + "a" * 64).startswith("oci://127.0.0.1:5000/")
    for kept in ("my-image", "./disk.qcow2", "/srv/disk.qcow2", "https://x/y.qcow2"):
        assert ironcore.oci_image(kept) == kept
    # no registry host: Docker Hub, as IronCore's puller (containerd) reads it
    assert ironcore.oci_image("gardenlinux:rootfs-image") == "oci://docker.io/library/gardenlinux:rootfs-image"
    pull = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": "eyJhdXRocyI6IHsicmVnaXN0cnkuZXhhbXBsZS5jb20iOiB7ImF1dGgiOiAiZFhObGNqcHdZWE56In19fQ=="}}
    machine = copy.deepcopy(MACHINE)
    machine["spec"].update(image="registry.example.com/os/debian:12", imagePullSecret={"name": "pull"})
    machine["spec"]["volumes"] = [machine["spec"]["volumes"][1]]
    objects, problems = check(SECRET, machine, pull)
    params = objects["Machine/machine-sample"].params
    assert problems.errors == [], problems.errors
    assert params["image"] == "oci://registry.example.com/os/debian:12"
    assert params["image_pull_secret"] == {"username": "user", "password": "pass"}


def test_a_volume_from_a_bare_oci_reference_is_left_to_its_registry():
    volume = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "root"},
              "spec": {"resources": {"storage": "10Gi"},
                       "dataSource": {"osImage": {"image": "ghcr.io/ironcore-dev/os-images/gardenlinux:1443.3"}}}}
    objects, problems = check(volume)
    assert problems.errors == [], problems.errors
    assert objects["Volume/root"].data["image"] == "oci://ghcr.io/ironcore-dev/os-images/gardenlinux:1443.3"


# libvirt-provider's localdisk plugin (internal/plugins/volume/localdisk/localdisk.go at a17b53b): a disk filled
# from an image is the image's rootfs copied as it is; an empty one is sizeLimit large, 500Mi when it is unset or 0
def _local(disk):
    machine = copy.deepcopy(MACHINE)
    machine["spec"]["volumes"] = [ROOT_DISK, {"name": "scratch", "device": "odb", "localDisk": disk}]
    objects, problems = check(SECRET, machine)
    problems.warnings = [line for line in problems.warnings if "spec.volumes[1]" in line]  # the sample's others
    return objects["Machine/machine-sample"].params["volumes"][1], problems


@pytest.mark.parametrize("disk", [{}, {"sizeLimit": "0"}, {"sizeLimit": 0}, {"sizeLimit": "0Gi"}])
def test_an_empty_local_disk_of_no_size_limit_is_libvirt_providers_500mi(disk):
    volume, problems = _local(disk)
    assert problems.errors == [] and problems.warnings == [], (problems.errors, problems.warnings)
    assert volume == {"name": "scratch", "device": "vdb", "size": 500 * 2 ** 20, "ephemeral": True}


def test_a_local_disk_from_an_image_is_the_image_as_it_is_and_its_size_limit_is_warned():
    volume, problems = _local({"sizeLimit": "10Gi", "image": "my-image"})
    assert problems.errors == []
    assert volume == {"name": "scratch", "device": "vdb", "image": "my-image", "ephemeral": True}  # no size
    assert problems.warnings == ["Machine/machine-sample: spec.volumes[1].localDisk.sizeLimit: "
                                 + ironcore.LOCAL_DISK_LIMIT]
    volume, problems = _local({"image": "my-image"})
    assert problems.errors == [] and problems.warnings == [] and "size" not in volume


def test_a_bad_size_limit_is_refused_under_its_own_path_even_beside_an_image():
    for disk in ({"sizeLimit": "ten", "image": "my-image"}, {"sizeLimit": "ten"}, {"sizeLimit": "-1Gi"}):
        _volume, problems = _local(disk)
        assert [error.split(": ")[1] for error in problems.errors] == ["spec.volumes[1].localDisk.sizeLimit"], disk


def test_the_export_of_a_local_disk_from_an_image_gives_no_size_limit_and_reapplies_unchanged():
    labels = {ironcore.VOLUME_MARK + "scratch": "local", ironcore.VOLUME_MARK + "empty": "local"}
    exported = ironcore.export({"name": "machine-sample", "pool": "pool1", "power_state": "running",
                                "machine_class": "small", "labels": labels},
                               {"volumes": [{"name": "scratch", "source": "image", "size": 3 * 2 ** 30,
                                             "image": {"source": "my-image"}},
                                            {"name": "empty", "source": "empty", "size": 500 * 2 ** 20}],
                                "network_interfaces": []})[0]
    assert exported["spec"]["volumes"] == [{"name": "scratch", "localDisk": {"image": "my-image"}},
                                           {"name": "empty", "localDisk": {"sizeLimit": "500Mi"}}]
    objects, problems = check(exported)
    assert problems.errors == [] and problems.warnings == [], (problems.errors, problems.warnings)
    assert [(v["name"], v.get("size"), v.get("image")) for v in objects["Machine/machine-sample"].params["volumes"]] \
        == [("scratch", None, "my-image"), ("empty", 500 * 2 ** 20, None)]
