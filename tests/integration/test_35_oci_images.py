"""OS images in an OCI registry (issue 39): the lab's registry (Debian's docker-registry, HTTPS with the lab CA,
basic authentication), an image pushed with lab.py push-image in IronCore's OS image format, then pulled by
machine (oci://, image_ca_file, image_pull_secret) and by an IronCore Machine document naming it by its bare
reference with an imagePullSecret; each boots. The pool's cache and the machine's record hold the layer digest;
refusals (no credentials, wrong ones, no CA) create nothing.

The IronCore documents follow ironcore-dev/ironcore at v0.4.3 (spec.image with spec.imagePullSecret,
api/compute/v1alpha1/machine_types.go; the ignition Secret of config/samples/e2e/bases/ignition/ at 0b3fd712);
the pull Secret is a kubernetes.io/dockerconfigjson Secret as kubectl create secret docker-registry writes it.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from conftest import REPO, first_pool, lab_file, load_lab, run_module
from test_45_firmware import secureboot_image

REF = "machinery/busybox:oci-test"


@pytest.fixture(scope="module")
def lab1(image, tmp_path_factory):
    data = load_lab()
    assert data.get("registry"), "the lab runs no registry (apt-get install docker-registry; lab.py up)"
    # a compressed copy of the busybox image: the same guest, bytes no other test caches, so the pull is real
    disk = str(tmp_path_factory.mktemp("oci") / "busybox-oci.qcow2")
    subprocess.run(["qemu-img", "convert", "-c", "-O", "qcow2", image, disk], check=True, timeout=300)
    pushed = subprocess.run(["python3", os.path.join(REPO, "lab", "lab.py"), "push-image", "--dir",
                             os.path.dirname(lab_file()), "--file", disk, "--ref", REF],
                            capture_output=True, text=True, check=True, timeout=300)
    with open(disk, "rb") as handle:
        layer = hashlib.sha256(handle.read()).hexdigest()

    def clean(pool):
        for name in ("oci-1", "oci-2", "oci-3", "oci-4", "oci-uefi"):
            run_module("machine", uri=pool.uri, name=name, state="absent", shutdown_timeout=2)
        run_module("volume", uri=pool.uri, name="oci-root", state="absent", force=True)
        run_module("volume", uri=pool.uri, name="oci-copy", state="absent", force=True)
        run_module("machine_image", pools=[pool.uri], name="oci-named", state="absent", force=True)
        storage = pool.conn.storagePoolLookupByName("machinery")
        storage.refresh(0)
        for suffix in (".qcow2.complete", ".qcow2"):  # an earlier run's cache of it: pulled again
            name = "image-%s%s" % (layer[:32], suffix)
            if name in storage.listVolumes():
                storage.storageVolLookupByName(name).delete(0)
        downloaded = os.path.join(images.cache_dir(), "images", layer)
        if os.path.exists(downloaded):
            os.unlink(downloaded)

    # a controller cache of this file's own: the pull and the checks of its file are this run's, whatever else
    # on the machine caches the same bytes
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("controller-cache")))
        with first_pool(clean) as pool:
            yield pool, data, layer, pushed.stdout.strip()


def machine_args(data, **extra):
    args = {"machine_class": "small", "image": "oci://%s/%s" % (data["registry"], REF),
            "image_ca_file": data["registry_ca"], "image_pull_secret": data["registry_credentials"],
            "network_interfaces": [{"name": "eth0", "network": "machinery"}]}
    args.update(extra)
    return args


def test_refusals_name_the_image_and_create_nothing(lab1):
    pool, data, _layer, _pinned = lab1
    no_credentials = run_module("machine", uri=pool.uri, name="oci-1",
                                **machine_args(data, image_pull_secret=None))
    assert no_credentials["failed"] and no_credentials["field"] == "image" and \
        "give image_pull_secret" in no_credentials["msg"], no_credentials
    wrong = run_module("machine", uri=pool.uri, name="oci-1", **machine_args(
        data, image_pull_secret={"username": "lab", "password": "not-it"}))
    assert wrong["failed"] and "refused the credentials" in wrong["msg"], wrong
    assert "not-it" not in json.dumps(wrong)
    untrusted = run_module("machine", uri=pool.uri, name="oci-1", **machine_args(data, image_ca_file=None))
    assert untrusted["failed"] and "image_ca_file" in untrusted["msg"], untrusted
    assert pool.domain("oci-1") is None


def test_machine_pulls_caches_by_digest_and_boots(lab1):
    pool, data, layer, pinned = lab1
    planned = run_module("machine", check=True, uri=pool.uri, name="oci-1", **machine_args(data))
    assert planned["changed"] and pool.domain("oci-1") is None, planned
    made = run_module("machine", uri=pool.uri, name="oci-1", **machine_args(data))
    assert not made.get("failed"), made
    assert data["registry_credentials"]["password"] not in json.dumps(made)
    record = pool.domain("oci-1").XMLDesc(2)
    assert layer in record  # the image's checksum in the record is its disk layer's digest
    assert "image-%s.qcow2" % layer[:32] in pool.volumes()  # cached on the pool by its digest, like any image
    assert os.path.isfile(os.path.join(images.cache_dir(), "images", layer))  # pulled from the registry
    pool.wait_console("oci-1", "MACHINERY-TEST-BOOT", timeout=120)
    again = run_module("machine", uri=pool.uri, name="oci-1", **machine_args(data))
    assert again["changed"] is False, again
    by_digest = run_module("machine", uri=pool.uri, name="oci-2", **machine_args(data, image=pinned))
    assert not by_digest.get("failed") and layer in pool.domain("oci-2").XMLDesc(2), by_digest


def test_an_ironcore_machine_names_it_by_bare_reference_with_its_pull_secret(lab1):
    pool, data, layer, _pinned = lab1
    registry = data["registry"]
    creds = data["registry_credentials"]
    auth = base64.b64encode(("%s:%s" % (creds["username"], creds["password"])).encode()).decode()
    dockerconfig = json.dumps({"auths": {registry: {"username": creds["username"], "password": creds["password"],
                                                    "auth": auth}}})
    documents = [
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
         "metadata": {"name": "lab-registry"},
         "data": {".dockerconfigjson": base64.b64encode(dockerconfig.encode()).decode()}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ignition"},
         "data": {"ignition.yaml": base64.b64encode(b'{"ignition": {"version": "3.3.0"}}').decode()}},
        # an OCI image boots UEFI by default (as on libvirt-provider); the lab's test image boots BIOS only, so the
        # Machine asks for the collection's firmware by its annotation
        {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine",
         "metadata": {"name": "oci-3", "annotations": {"machinery.compute/firmware": "bios"}},
         "spec": {"machineClassRef": {"name": "small"}, "image": "%s/%s" % (registry, REF),
                  "imagePullSecret": {"name": "lab-registry"}, "ignitionRef": {"name": "ignition"},
                  "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {
                      "spec": {"networkRef": {"name": "machinery"}}}}}]}},
    ]
    made = run_module("manifest", pools=[pool.uri], definition=documents, image_ca_file=data["registry_ca"])
    assert not made.get("failed"), made
    assert layer in pool.domain("oci-3").XMLDesc(2)
    console = pool.wait_console("oci-3", "MACHINERY-IGNITION-END", timeout=120)
    assert "3.3.0" in console
    again = run_module("manifest", pools=[pool.uri], definition=documents, image_ca_file=data["registry_ca"])
    assert again["changed"] is False, again


def test_machine_image_and_volume_take_the_reference_too(lab1):
    pool, data, layer, pinned = lab1
    registry = {"image_ca_file": data["registry_ca"], "image_pull_secret": data["registry_credentials"]}
    published = run_module("machine_image", pools=[pool.uri], name="oci-named", url=pinned, **registry)
    assert not published.get("failed"), published
    assert published["image"]["checksum"].endswith(layer), published["image"]
    again = run_module("machine_image", pools=[pool.uri], name="oci-named", url=pinned, **registry)
    assert again["changed"] is False, again
    copied = run_module("volume", uri=pool.uri, name="oci-copy", image=pinned, **registry)
    assert not copied.get("failed"), copied
    with open(os.path.join(images.cache_dir(), "images", layer), "rb") as handle:
        handle.seek(24)
        virtual = int.from_bytes(handle.read(8), "big")  # the qcow2 header's size field
    storage = pool.conn.storagePoolLookupByName("machinery")
    storage.refresh(0)
    assert storage.storageVolLookupByName("oci-copy").info()[1] >= virtual
    assert run_module("volume", uri=pool.uri, name="oci-copy", image=pinned, **registry)["changed"] is False


def test_an_ironcore_volume_from_the_reference_boots_its_machine(lab1):
    """The shape of ironcore-dev/ironcore config/samples/e2e/bases/machine-with-nonephemeral-resources/ (0b3fd712):
    a Volume filled from dataSource.osImage, a Machine booting from it by volumeRef."""
    pool, data, layer, _pinned = lab1
    documents = [
        {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "oci-root"},
         "spec": {"volumePoolRef": {"name": pool.name}, "resources": {"storage": "1Gi"},
                  "dataSource": {"osImage": {"image": "%s/%s" % (data["registry"], REF)}}}},
        {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine", "metadata": {"name": "oci-4"},
         "spec": {"machineClassRef": {"name": "small"}, "volumes": [{"name": "rootdisk",
                                                                     "volumeRef": {"name": "oci-root"}}],
                  "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {
                      "spec": {"networkRef": {"name": "machinery"}}}}}]}},
    ]
    registry = {"image_ca_file": data["registry_ca"], "image_pull_secret": data["registry_credentials"]}
    made = run_module("manifest", pools=[pool.uri], definition=documents, **registry)
    assert not made.get("failed"), made
    assert "oci-root" in pool.volumes() and pool.domain("oci-4").isActive()
    pool.wait_console("oci-4", "MACHINERY-TEST-BOOT", timeout=120)
    again = run_module("manifest", pools=[pool.uri], definition=documents, **registry)
    assert again["changed"] is False, again
    gone = run_module("manifest", pools=[pool.uri], definition=documents, state="absent", shutdown_timeout=2)
    assert not gone.get("failed") and pool.domain("oci-4") is None and "oci-root" not in pool.volumes(), gone


def test_check_mode_refuses_a_reference_its_registry_does_not_resolve(lab1):
    """IronCore's puller takes an untagged reference as :latest (issue 50): check mode looks it up in the lab's
    registry, where only :oci-test was pushed, and refuses it under the document's path, naming the reference it
    looked up; nothing is created."""
    pool, data, _layer, _pinned = lab1
    untagged = "%s/%s" % (data["registry"], REF.rsplit(":", 1)[0])
    documents = [{"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine", "metadata": {"name": "oci-5"},
                  "spec": {"machineClassRef": {"name": "small"}, "image": untagged,
                           "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {
                               "spec": {"networkRef": {"name": "machinery"}}}}}]}}]
    registry = {"image_ca_file": data["registry_ca"], "image_pull_secret": data["registry_credentials"]}
    planned = run_module("manifest", check=True, pools=[pool.uri], definition=documents, **registry)
    assert planned.get("failed"), planned
    said = "\n".join(planned.get("problems") or [planned.get("msg", "")])
    assert "Machine/oci-5: spec.image: the OCI image %s:latest cannot be resolved" % untagged in said, said
    assert pool.domain("oci-5") is None


def test_an_image_as_ironcores_tool_writes_it_copied_by_skopeo_boots_uefi_with_no_firmware_field(lab1, tmp_path):
    """Issue 50: a raw UEFI disk (the lab's Secure Boot image: Debian's shim and GRUB on a FAT disk) written as an
    OCI image layout in the shape ironcore-image's build gives (an index with the image's linux/amd64 platform, a
    config of IronCore's media type with the command line, the disk byte for byte as the rootfs layer, the kernel
    and the initramfs as theirs), copied to the lab's registry by
    an independent client (Debian's skopeo), then named by an IronCore Machine as IronCore names it (no scheme),
    with no firmware field: it boots UEFI, as on libvirt-provider, and the guest's console says it came up."""
    pool, data, _layer, _pinned = lab1
    assert shutil.which("skopeo"), "skopeo is missing (make deps installs Debian's package)"
    disk = str(tmp_path / "uefi.raw")
    subprocess.run(["qemu-img", "convert", "-O", "raw", secureboot_image(), disk], check=True, timeout=300)
    # its kernel and initramfs as the layers ironcore-image gives them beside the disk, its command line in the
    # config: the pull takes the disk layer, whatever else the image carries
    for name in ("vmlinuz", "initrd.gz"):
        subprocess.run(["mcopy", "-i", disk, "::/" + name, str(tmp_path / name)], check=True, timeout=60)
    layout = str(tmp_path / "layout")
    subprocess.run(["python3", os.path.join(REPO, "lab", "lab.py"), "push-image", "--file", disk,
                    "--kernel", str(tmp_path / "vmlinuz"), "--initramfs", str(tmp_path / "initrd.gz"),
                    "--cmdline", "console=ttyS0,115200 loglevel=3 panic=5", "--ref", "machinery/uefi:1.0", "--layout", layout],
                   check=True, capture_output=True, timeout=300)
    with open(os.path.join(layout, "index.json")) as handle:
        index_digest = json.load(handle)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs", "sha256", index_digest.split(":")[1])) as handle:
        manifest_digest = json.load(handle)["manifests"][0]["digest"]
    with open(os.path.join(layout, "blobs", "sha256", manifest_digest.split(":")[1])) as handle:
        assert [layer["mediaType"] for layer in json.load(handle)["layers"]] == [
            "application/vnd.ironcore.image.rootfs", "application/vnd.ironcore.image.initramfs",
            "application/vnd.ironcore.image.kernel"]
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copyfile(data["registry_ca"], str(certs / "ca.crt"))
    creds = data["registry_credentials"]
    subprocess.run(["skopeo", "copy", "--all", "--dest-creds", "%s:%s" % (creds["username"], creds["password"]),
                    "--dest-cert-dir", str(certs), "oci:%s:1.0" % layout,
                    "docker://%s/machinery/uefi:1.0" % data["registry"]], check=True, capture_output=True, timeout=300)
    with open(disk, "rb") as handle:
        layer = hashlib.sha256(handle.read()).hexdigest()
    documents = [
        {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "MachineClass", "metadata": {"name": "uefi-small"},
         "capabilities": {"cpu": "1000m", "memory": "384Mi"}},
        {"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "Machine", "metadata": {"name": "oci-uefi"},
         "spec": {"machineClassRef": {"name": "uefi-small"}, "image": "%s/machinery/uefi:1.0" % data["registry"]}},
    ]
    registry = {"image_ca_file": data["registry_ca"], "image_pull_secret": creds}
    try:
        made = run_module("manifest", pools=[pool.uri], definition=documents, **registry)
        assert not made.get("failed"), made
        xml = pool.domain("oci-uefi").XMLDesc(2)
        assert layer in xml  # the rootfs layer pulled through the index, cached by its digest
        assert "<os firmware='efi'>" in xml, xml  # no firmware field: UEFI, as libvirt-provider boots it
        pool.wait_console("oci-uefi", "MACHINERY-READY", timeout=600)  # its init, started by shim and GRUB
        again = run_module("manifest", pools=[pool.uri], definition=documents, **registry)
        assert again["changed"] is False, again
    finally:
        gone = run_module("manifest", pools=[pool.uri], definition=documents, state="absent", shutdown_timeout=0)
        assert not gone.get("failed"), gone
    assert pool.domain("oci-uefi") is None
