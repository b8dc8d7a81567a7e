"""IronCore image references as IronCore's puller reads them (issue 50): normalized as containerd normalizes them,
refused by check mode when they cannot be normalized or resolved, with the normalized reference in the message
and in the export. No registry is reached: the answers are given by a fake oci.resolve."""

import pytest
from test_ironcore_upstream import Pools

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.machines import oci
from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine, ironcore

IC = "compute.ironcore.dev/v1alpha1"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("written, normalized", [
    ("gardenlinux:rootfs-image", "docker.io/library/gardenlinux:rootfs-image"),
    ("gardenlinux", "docker.io/library/gardenlinux:latest"),
    ("foo/bar", "docker.io/foo/bar:latest"),
    ("foo/bar:1.0", "docker.io/foo/bar:1.0"),
    ("docker.io/ubuntu", "docker.io/library/ubuntu:latest"),
    ("index.docker.io/foo/bar", "docker.io/foo/bar:latest"),
    ("ghcr.io/ironcore-dev/os-images/virtualization/gardenlinux",
     "ghcr.io/ironcore-dev/os-images/virtualization/gardenlinux:latest"),
    ("oci://ghcr.io/ironcore-dev/os-images/gardenlinux", "ghcr.io/ironcore-dev/os-images/gardenlinux:latest"),
    ("localhost/os/debian", "localhost/os/debian:latest"),
    ("localhost:5000/os/debian:12", "localhost:5000/os/debian:12"),
    ("127.0.0.1:5000/os/debian@" + DIGEST, "127.0.0.1:5000/os/debian@" + DIGEST),
    ("ubuntu:22.04@" + DIGEST, "docker.io/library/ubuntu:22.04@" + DIGEST),
    ("ubuntu@" + DIGEST, "docker.io/library/ubuntu@" + DIGEST),
    ("Registry.Example.com/os/debian", "Registry.Example.com/os/debian:latest"),  # a host's case is its own
])
def test_references_are_normalized_as_containerd_does(written, normalized):
    assert oci.normalize(written) == normalized
    assert oci.normalize(normalized) == normalized  # once normalized, it stays


@pytest.mark.parametrize("written, said", [
    ("foo/Bar", "must be lower case"),
    ("gardenlinux:-rc", "its tag '-rc'"),
    ("gardenlinux@sha256:abc", "its digest"),
    ("a" * 64, "an image ID"),
    ("foo//bar", "its repository"),
    ("foo/bar:a:b", "its repository"),
])
def test_references_that_cannot_be_normalized_are_refused_naming_why(written, said):
    with pytest.raises(ValidationError) as info:
        oci.normalize(written, "spec.image")
    assert info.value.field == "spec.image" and said in info.value.message, info.value.message


def test_docker_hub_is_reached_at_its_api_host():
    assert oci.api_host("docker.io") == "registry-1.docker.io"
    assert oci.api_host("ghcr.io") == "ghcr.io"
    assert oci.Registry("docker.io").base == "https://registry-1.docker.io"


def machine(name, image):
    return {"apiVersion": IC, "kind": "Machine", "metadata": {"name": name},
            "spec": {"machineClassRef": {"name": "small"}, "image": image,
                     "networkInterfaces": [{"name": "primary", "ephemeral": {"networkInterfaceTemplate": {
                         "spec": {"networkRef": {"name": "machinery"}}}}}]}}


@pytest.fixture
def registry(monkeypatch):
    """A registry that has ghcr.io/ironcore-dev/os-images/gardenlinux:latest and nothing else; every lookup kept."""
    asked = []

    def resolve(source, ca_file=None, credentials=None, field="image"):
        asked.append(source)
        if source != "oci://ghcr.io/ironcore-dev/os-images/gardenlinux:latest":
            raise MachineryError("/v2/%s/manifests/%s: not found in the registry" % tuple(
                source[len("oci://"):].split("/", 1)[1].rsplit(":", 1)), field)
        return {"source": source, "checksum": "ab" * 32}
    monkeypatch.setattr(oci, "resolve", resolve)
    return asked


def check(*documents):
    return engine.check_documents([("definition[%d]" % i, d) for i, d in enumerate(documents)], Pools())


def test_an_untagged_reference_is_latest_and_resolved_once_by_check_mode(registry):
    objects, _warnings = check(machine("a", "ghcr.io/ironcore-dev/os-images/gardenlinux"),
                               machine("b", "oci://ghcr.io/ironcore-dev/os-images/gardenlinux"))
    assert {obj.params["image"] for obj in objects} == {"oci://ghcr.io/ironcore-dev/os-images/gardenlinux:latest"}
    assert registry == ["oci://ghcr.io/ironcore-dev/os-images/gardenlinux:latest"]  # once for both machines


def test_a_reference_that_cannot_be_resolved_is_refused_by_check_mode_in_its_normalized_form(registry):
    volume = {"apiVersion": "storage.ironcore.dev/v1alpha1", "kind": "Volume", "metadata": {"name": "root"},
              "spec": {"resources": {"storage": "10Gi"}, "dataSource": {"osImage": {"image": "foo/bar"}}}}
    with pytest.raises(docs.ManifestError) as info:
        check(machine("web", "gardenlinux:rootfs-image"), volume)
    said = "\n".join(info.value.problems)
    assert ("Machine/web: spec.image: the OCI image docker.io/library/gardenlinux:rootfs-image cannot be resolved: "
            "/v2/library/gardenlinux/manifests/rootfs-image: not found in the registry") in said
    assert "Volume/root: spec.dataSource.osImage.image: the OCI image docker.io/foo/bar:latest cannot be " \
           "resolved" in said


def test_a_reference_that_cannot_be_normalized_is_refused_under_its_path_and_not_looked_up(registry):
    with pytest.raises(docs.ManifestError) as info:
        check(machine("web", "Gardenlinux/Rootfs"))
    assert info.value.problems == ["Machine/web: spec.image: 'Gardenlinux/Rootfs' is no OCI reference: its "
                                   "repository 'Rootfs' must be lower case"]
    assert registry == []


def test_a_published_name_a_path_and_a_url_are_no_oci_references(registry):
    assert ironcore.oci_image("my-image") == "my-image"
    assert ironcore.oci_image("/srv/images/disk.qcow2") == "/srv/images/disk.qcow2"
    assert ironcore.oci_image("https://images.example.com/disk.qcow2") == "https://images.example.com/disk.qcow2"
    objects, _warnings = check(machine("web", "my-image"))
    assert objects[0].params["image"] == "my-image" and registry == []


def test_the_export_writes_the_normalized_reference_as_ironcore_does():
    exported = ironcore.export({"name": "web", "image": "oci://docker.io/library/gardenlinux:rootfs-image",
                                "pool": "pool1", "power_state": "running"}, {"volumes": [], "network_interfaces": []})
    image = exported[0]["spec"]["image"]
    assert image == "docker.io/library/gardenlinux:rootfs-image"
    assert ironcore.oci_image(image) == "oci://docker.io/library/gardenlinux:rootfs-image"  # a re-apply: the same


def test_a_docker_hub_pull_secret_is_found_under_the_name_docker_login_writes():
    import base64
    import json
    config = {"auths": {"https://index.docker.io/v1/": {"auth": base64.b64encode(b"me:pw").decode()}}}
    secret = {"stringData": {".dockerconfigjson": json.dumps(config)}}
    problems = docs.Problems()
    found = ironcore.pull_credentials(docs.Fields(problems, "Machine/m"), secret, "docker.io", "spec.imagePullSecret")
    assert found == {"username": "me", "password": "pw"} and problems.errors == []


def test_a_delete_looks_no_image_up(registry):
    objects, _warnings = engine.check_documents([("d", machine("web", "gardenlinux:rootfs-image"))], Pools(),
                                                resolve=False)
    assert objects and registry == []  # deleting the documents pulls nothing, so needs no registry


@pytest.mark.parametrize("media_type", ["application/vnd.ironcore.image.rootfs",
                                        "application/vnd.onmetal.image.rootfs.v1alpha1.rootfs"])
def test_the_older_onmetal_media_type_is_read_as_the_disk(monkeypatch, media_type):
    """onmetal-image's RootFSLayerMediaType, as older gardenlinux pushes and oras guides write it."""
    import hashlib
    import json
    layer = "sha256:" + "c" * 64
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "layers": [{"mediaType": "application/vnd.onmetal.image.vmlinuz.v1alpha1.vmlinuz",
                                       "digest": "sha256:" + "d" * 64, "size": 1},
                                      {"mediaType": media_type, "digest": layer, "size": 42}]}).encode()

    def manifest_of(self, repository, reference):
        return "sha256:" + hashlib.sha256(manifest).hexdigest(), json.loads(manifest)
    monkeypatch.setattr(oci.Registry, "manifest", manifest_of)
    found = oci.resolve("oci://registry.example.com/os/debian:12")
    assert found["checksum"] == "c" * 64 and found["oci"]["size"] == 42


def serve(monkeypatch, documents):
    """Registry.manifest answering from ``documents`` ({reference: manifest}), with the references asked."""
    import hashlib
    import json
    asked = []

    def manifest_of(self, repository, reference):
        asked.append(reference)
        body = json.dumps(documents[reference]).encode()
        return "sha256:" + hashlib.sha256(body).hexdigest(), json.loads(body)
    monkeypatch.setattr(oci.Registry, "manifest", manifest_of)
    return asked


def artifact(variant, disk):
    """An artifact manifest as ironcore-image's OCI-SPEC.md writes one."""
    layers = [{"mediaType": "application/vnd.ironcore.osboot.kernel", "digest": "sha256:" + "1" * 64, "size": 1}]
    if disk:
        layers.insert(0, {"mediaType": "application/vnd.ironcore.osboot.disk.img", "digest": "sha256:" + disk * 64,
                          "size": 9})
    return {"schemaVersion": 2, "mediaType": "application/vnd.ironcore.osboot.artifacts.v1+json", "layers": layers,
            "annotations": {"variant": variant, "architecture": "amd64"}}


def entry(digest, architecture="amd64", **annotations):
    found = {"mediaType": "application/vnd.ironcore.osboot.artifacts.v1+json", "digest": digest, "size": 1,
             "platform": {"architecture": architecture, "os": "linux"}}
    if annotations:
        found["annotations"] = annotations
    return found


def test_an_index_gives_its_amd64_virtualization_image_not_the_metal_one(monkeypatch):
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [entry("arm", "arm64"), entry("metal"), entry("virt")]}
    serve(monkeypatch, {"1.0": index, "metal": artifact("metal", None), "virt": artifact("virtualization", "e"),
                        "arm": artifact("virtualization", "f")})
    found = oci.resolve("oci://ghcr.io/ironcore-dev/os-images/gardenlinux:1.0")
    assert found["checksum"] == "e" * 64


def test_an_index_entrys_own_variant_is_read_first(monkeypatch):
    index = {"schemaVersion": 2, "manifests": [entry("metal", variant="metal"), entry("virt", variant="virtualization")]}
    asked = serve(monkeypatch, {"1.0": index, "virt": artifact("virtualization", "e"), "metal": artifact("metal", None)})
    assert oci.resolve("oci://ghcr.io/x/y:1.0")["checksum"] == "e" * 64
    assert asked == ["1.0", "virt"]  # the metal entry is not fetched


def test_a_metal_image_alone_is_refused_naming_why(monkeypatch):
    serve(monkeypatch, {"1.0": {"schemaVersion": 2, "manifests": [entry("metal")]}, "metal": artifact("metal", None)})
    with pytest.raises(ValidationError) as info:
        oci.resolve("oci://ghcr.io/x/y:1.0")
    assert "is a metal boot image" in info.value.message
