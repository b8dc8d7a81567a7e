"""Push a disk image to an OCI registry in IronCore's OS image format, for the lab (standard library only).

What ironcore-dev/ironcore-image's ``build`` writes (cmd/build/build.go at 807be33): an image manifest per
architecture, tagged ``TAG-amd64``, whose config is of media type application/vnd.ironcore.image.config.v1+json
(``{"commandLine": ...}``) and whose layers are the root disk (application/vnd.ironcore.image.rootfs, the file as
it is: IronCore's images carry a raw disk, libvirt-provider copies it byte for byte) and, when given, the
initramfs and the kernel; then an image index tagged ``TAG`` that lists that manifest with its platform
(linux/amd64). Blobs go up monolithically (POST an upload, PUT it with its digest), as the OCI distribution
specification allows; the registry is reached over HTTPS with the lab CA and basic authentication.

``write_layout`` writes the same image as an OCI image layout directory instead (oci-layout, index.json,
blobs/sha256/), for an independent client (skopeo) to copy to a registry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import ssl
import urllib.error
import urllib.request

CONFIG_MEDIA_TYPE = "application/vnd.ironcore.image.config.v1+json"
ROOTFS_MEDIA_TYPE = "application/vnd.ironcore.image.rootfs"
INITRAMFS_MEDIA_TYPE = "application/vnd.ironcore.image.initramfs"
KERNEL_MEDIA_TYPE = "application/vnd.ironcore.image.kernel"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
ARCHITECTURE = "amd64"


class PushError(Exception):
    pass


def _split(ref: str) -> tuple[str, str]:
    repository, _sep, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        raise PushError(f"--ref {ref!r} must be REPOSITORY:TAG")
    return repository, tag


class Session:
    def __init__(self, registry: str, ca_file: str, credentials: dict):
        self.base = f"https://{registry}"
        self.context = ssl.create_default_context(cafile=ca_file)
        self.headers = {}
        if credentials.get("username"):
            token = base64.b64encode(f"{credentials['username']}:{credentials['password']}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"

    def call(self, method: str, url: str, body=None, headers: dict | None = None, length: int | None = None):
        request = urllib.request.Request(url if url.startswith("http") else self.base + url, data=body,
                                         method=method, headers=dict(self.headers, **(headers or {})))
        if length is not None:
            request.add_header("Content-Length", str(length))
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=120) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            raise PushError(f"{method} {url}: HTTP {exc.code} {exc.read()[:300]!r}") from None

    def has_blob(self, repository: str, digest: str) -> bool:
        try:
            self.call("HEAD", f"/v2/{repository}/blobs/{digest}")
            return True
        except PushError:
            return False

    def push_blob(self, repository: str, digest: str, source, size: int) -> None:
        if self.has_blob(repository, digest):
            return
        _status, headers, _body = self.call("POST", f"/v2/{repository}/blobs/uploads/", body=b"")
        location = headers.get("Location") or headers.get("location")
        if not location:
            raise PushError("the registry gave no upload location")
        if not location.startswith("http"):
            location = self.base + location
        separator = "&" if "?" in location else "?"
        self.call("PUT", f"{location}{separator}digest={digest}", body=source,
                  headers={"Content-Type": "application/octet-stream"}, length=size)


def _file_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Image:
    """The blobs of one image as ironcore-image builds it: ``files`` {digest: path} (the layers), ``documents``
    {digest: bytes} (the config and the manifest), the index, and the manifest's and the index's digests."""

    def __init__(self, disk: str, kernel: str | None = None, initramfs: str | None = None, cmdline: str = ""):
        config = _json({"commandLine": cmdline})
        self.files, layers = {}, []
        for path, media_type in ((disk, ROOTFS_MEDIA_TYPE), (initramfs, INITRAMFS_MEDIA_TYPE),
                                 (kernel, KERNEL_MEDIA_TYPE)):
            if path:
                digest = _file_digest(path)
                self.files[digest] = path
                layers.append({"mediaType": media_type, "digest": digest, "size": os.path.getsize(path)})
        self.manifest = _json({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                               "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": _digest(config),
                                          "size": len(config)},
                               "layers": layers})
        self.manifest_digest = _digest(self.manifest)
        self.index = _json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [
            {"mediaType": MANIFEST_MEDIA_TYPE, "digest": self.manifest_digest, "size": len(self.manifest),
             "platform": {"architecture": ARCHITECTURE, "os": "linux"}}]})
        self.index_digest = _digest(self.index)
        self.documents = {_digest(config): config}


def push_disk_image(registry: str, ref: str, path: str, ca_file: str, credentials: dict, kernel: str | None = None,
                    initramfs: str | None = None, cmdline: str = "") -> str:
    """Push ``path`` (and the kernel and initramfs when given) as ``ref`` (REPOSITORY:TAG) the way ironcore-image
    does; returns the index's digest."""
    repository, tag = _split(ref)
    session = Session(registry, ca_file, credentials)
    image = Image(path, kernel, initramfs, cmdline)
    for digest, source in image.files.items():
        with open(source, "rb") as handle:
            session.push_blob(repository, digest, handle, os.path.getsize(source))
    for digest, data in image.documents.items():
        session.push_blob(repository, digest, data, len(data))
    session.call("PUT", f"/v2/{repository}/manifests/{tag}-{ARCHITECTURE}", body=image.manifest,
                 headers={"Content-Type": MANIFEST_MEDIA_TYPE})
    session.call("PUT", f"/v2/{repository}/manifests/{tag}", body=image.index,
                 headers={"Content-Type": INDEX_MEDIA_TYPE})
    return image.index_digest


def write_layout(directory: str, tag: str, path: str, kernel: str | None = None, initramfs: str | None = None,
                 cmdline: str = "") -> str:
    """Write the image as an OCI image layout in ``directory`` (its index.json names the image index ``tag``);
    returns the index's digest."""
    image = Image(path, kernel, initramfs, cmdline)
    blobs = os.path.join(directory, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)
    for digest, source in image.files.items():
        shutil.copyfile(source, os.path.join(blobs, digest.split(":", 1)[1]))
    documents = dict(image.documents, **{image.manifest_digest: image.manifest, image.index_digest: image.index})
    for digest, data in documents.items():
        with open(os.path.join(blobs, digest.split(":", 1)[1]), "wb") as handle:
            handle.write(data)
    with open(os.path.join(directory, "oci-layout"), "wb") as handle:
        handle.write(_json({"imageLayoutVersion": "1.0.0"}))
    with open(os.path.join(directory, "index.json"), "wb") as handle:
        handle.write(_json({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [
            {"mediaType": INDEX_MEDIA_TYPE, "digest": image.index_digest, "size": len(image.index),
             "annotations": {"org.opencontainers.image.ref.name": tag}}]}))
    return image.index_digest
