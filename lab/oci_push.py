"""Push a disk image to an OCI registry in IronCore's OS image format, for the lab (standard library only).

The image is one OCI image manifest: a config of media type application/vnd.ironcore.image.config.v1+json and
one layer, the disk itself, of media type application/vnd.ironcore.image.rootfs (ironcore-dev/ironcore-image's
RootFSLayerMediaType). Blobs go up monolithically (POST an upload, PUT it with its digest), as the OCI
distribution specification allows; the registry is reached over HTTPS with the lab CA and basic authentication.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import ssl
import urllib.error
import urllib.request

CONFIG_MEDIA_TYPE = "application/vnd.ironcore.image.config.v1+json"
ROOTFS_MEDIA_TYPE = "application/vnd.ironcore.image.rootfs"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


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


def push_disk_image(registry: str, ref: str, path: str, ca_file: str, credentials: dict) -> str:
    """Push ``path`` as ``ref`` (REPOSITORY:TAG); returns the manifest's digest."""
    repository, tag = _split(ref)
    session = Session(registry, ca_file, credentials)
    layer_digest, layer_size = _file_digest(path), os.path.getsize(path)
    with open(path, "rb") as handle:
        session.push_blob(repository, layer_digest, handle, layer_size)
    config = json.dumps({"commandLine": ""}, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    session.push_blob(repository, config_digest, config, len(config))
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": ROOTFS_MEDIA_TYPE, "digest": layer_digest, "size": layer_size,
                    "annotations": {"org.opencontainers.image.title": os.path.basename(path)}}],
        "annotations": {"architecture": "amd64", "variant": "virtualization"},
    }, separators=(",", ":")).encode()
    session.call("PUT", f"/v2/{repository}/manifests/{tag}", body=manifest,
                 headers={"Content-Type": MANIFEST_MEDIA_TYPE})
    return "sha256:" + hashlib.sha256(manifest).hexdigest()
