# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OS images in OCI registries, in IronCore's OS image format: a small client of the OCI distribution API.

An image is named ``oci://<registry>/<repository>:<tag>`` or ``...@sha256:<digest>``. Its manifest (an image
index is narrowed to its linux/amd64 manifest) carries the disk as one layer of media type
``application/vnd.ironcore.image.rootfs`` (ironcore-dev/ironcore-image; its older
``...rootfs.v1alpha1.rootfs``, the specification's ``application/vnd.ironcore.image.disk.img`` and the onmetal
project's ``application/vnd.onmetal.image.rootfs.v1alpha1.rootfs`` too). That
layer's digest is the image's checksum: the pools cache it by it like any image, and the machine's record keeps
it. Resolving reads the manifest only (check mode does it too); the layer is downloaded, its sha256 verified on
the way in, when a pool needs it.

Authentication as registries ask for it: none, Basic with ``image_pull_secret``, or a Bearer token fetched from
the realm the registry names (with those credentials when given). HTTPS is verified against the system's
certificates, or against ``image_ca_file``. The standard library does it all; a client library would bring
dependencies to every controller and execution environment for a few requests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError

SCHEME = "oci://"
# IronCore's, its specification's, and the older onmetal name still in older gardenlinux pushes and in guides
# that push with oras (onmetal-image's RootFSLayerMediaType)
ROOTFS_MEDIA_TYPES = ("application/vnd.ironcore.image.rootfs", "application/vnd.ironcore.image.rootfs.v1alpha1.rootfs",
                      "application/vnd.ironcore.image.disk.img", "application/vnd.ironcore.osboot.disk.img",
                      "application/vnd.onmetal.image.rootfs.v1alpha1.rootfs")
# the artifact manifest of ironcore-image's OCI-SPEC.md, and its annotation that tells a virtualization boot (a
# disk) from a metal one (kernel, initramfs and squashfs only)
ARTIFACT_TYPES = ("application/vnd.ironcore.osboot.artifacts.v1+json",)
VARIANT_ANNOTATION = "variant"
VIRTUALIZATION, METAL = "virtualization", "metal"
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(MANIFEST_TYPES + ARTIFACT_TYPES + INDEX_TYPES)
_REFERENCE = re.compile(r"^(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)/(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
                        r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
TIMEOUT = 60
CHUNK = 1 << 20
# containerd's normalization of a reference with no registry host or no tag (distribution's reference package,
# what IronCore's puller reads references with): Docker Hub, its official images under library/, tag latest
DEFAULT_REGISTRY = "docker.io"
LEGACY_REGISTRY = "index.docker.io"
OFFICIAL_NAMESPACE = "library"
DEFAULT_TAG = "latest"
# the host a registry's API is at when it is not the registry's name (containerd's docker resolver)
API_HOSTS = {DEFAULT_REGISTRY: "registry-1.docker.io"}
_DOMAIN = re.compile(r"^(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
                     r"(?:\.(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9]))*(?::[0-9]+)?$")
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
MAX_NAME = 255


def is_oci(source):
    return isinstance(source, str) and source.startswith(SCHEME)


def parse(source, field):
    """(registry, repository, reference) of ``oci://<registry>/<repository>:<tag>`` (or ``@sha256:...``)."""
    match = _REFERENCE.match(source[len(SCHEME):]) if is_oci(source) else None
    if match is None or not (match.group("tag") or match.group("digest")):
        raise ValidationError("%r is not an OCI reference such as oci://registry.example.com/os/debian:12 or "
                              "oci://registry.example.com/os/debian@sha256:<digest>" % (source,), field)
    return match.group("registry"), match.group("repository"), match.group("digest") or match.group("tag")


def normalize(reference, field="image"):
    """The full reference (``<registry>/<repository>:<tag>`` or ``...@sha256:<digest>``, no scheme) of a reference
    as containerd normalizes it, and so IronCore's puller: a first part that is no host (no dot, no port, not
    ``localhost``, all lower case) means Docker Hub (``docker.io``; ``index.docker.io`` is its old name), where a
    one-part name is an official image under ``library/``; no tag and no digest is the tag ``latest``.
    ``gardenlinux:rootfs-image`` is ``docker.io/library/gardenlinux:rootfs-image``, ``foo/bar``
    ``docker.io/foo/bar:latest``. A reference that cannot be read so is refused naming what is wrong."""
    text = reference[len(SCHEME):] if is_oci(reference) else reference
    if not isinstance(text, str) or not text:
        raise ValidationError("must be a non-empty OCI reference", field)
    if re.match(r"^[0-9a-f]{64}$", text):
        raise ValidationError("%r is an image ID (64 hex digits), not a reference a registry serves" % text, field)
    name, _at, digest = text.partition("@")
    tag = None
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    first, sep, rest = name.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost" and first == first.lower()):
        registry, repository = DEFAULT_REGISTRY, name
    else:
        registry, repository = first, rest
    if registry == LEGACY_REGISTRY:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in repository:
        repository = "%s/%s" % (OFFICIAL_NAMESPACE, repository)
    problem = None
    if repository != repository.lower():
        problem = "its repository %r must be lower case" % repository
    elif not _DOMAIN.match(registry):
        problem = "%r is no registry host" % registry
    elif not all(_PATH_COMPONENT.match(part) for part in repository.split("/")):
        problem = ("its repository %r is not one or more lower-case components of letters and digits separated "
                   "by '/', each joined by '.', '_', '__' or '-'" % repository)
    elif tag is not None and not _TAG.match(tag):
        problem = "its tag %r is not 1 to 128 letters, digits, '_', '.' or '-' (not starting with '.' or '-')" % tag
    elif _at and not _DIGEST.match(digest):
        problem = "its digest %r is not sha256:<64 lower-case hex digits>" % digest
    elif len(registry) + 1 + len(repository) > MAX_NAME:
        problem = "its name is longer than %d characters" % MAX_NAME
    if problem:
        raise ValidationError("%r is no OCI reference: %s" % (reference, problem), field)
    full = "%s/%s" % (registry, repository)
    if tag is None and not _at:
        tag = DEFAULT_TAG
    return full + (":" + tag if tag else "") + ("@" + digest if _at else "")


def api_host(registry):
    """The host that serves ``registry``'s API: Docker Hub's is ``registry-1.docker.io``."""
    return API_HOSTS.get(registry, registry)


class Registry:
    """Requests to one registry with one set of credentials, the Bearer token kept once fetched."""

    def __init__(self, registry, ca_file=None, credentials=None, field="image"):
        self.base = "https://%s" % api_host(registry)
        self.field = field
        if ca_file and not os.path.isfile(ca_file):
            raise ValidationError("no such file %s" % ca_file, "image_ca_file")
        self.context = ssl.create_default_context(cafile=ca_file or None)
        # an opener of its own: this registry's CA, and the redirects registries answer blob requests with
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.context))
        self.credentials = credentials or {}
        self.authorization = None

    def _basic(self):
        if not self.credentials.get("username"):
            return None
        pair = "%s:%s" % (self.credentials["username"], self.credentials.get("password") or "")
        return "Basic " + base64.b64encode(pair.encode()).decode()

    def _token(self, challenge):
        """A Bearer token from the realm of a ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``."""
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = params.pop("realm", None)
        if not realm:
            raise MachineryError("the registry asked for a token without naming its realm", self.field)
        request = urllib.request.Request(realm + "?" + urllib.parse.urlencode(params))
        if self._basic():
            request.add_header("Authorization", self._basic())
        try:
            with self.opener.open(request, timeout=TIMEOUT) as response:
                answer = json.loads(response.read().decode())
        except urllib.error.HTTPError as exc:
            raise MachineryError("the registry's token service refused the credentials (HTTP %d)%s"
                                 % (exc.code, "" if self._basic() else "; give image_pull_secret"),
                                 self.field) from None
        except (OSError, ValueError) as exc:
            raise MachineryError("cannot get a token from %s: %s" % (realm, exc), self.field) from None
        return "Bearer " + (answer.get("token") or answer.get("access_token") or "")

    def open(self, path, accept=None):
        """The response to GET ``path``, authenticated as the registry asks (one retry after its challenge)."""
        for attempt in range(2):
            request = urllib.request.Request(self.base + path)
            if accept:
                request.add_header("Accept", accept)
            if self.authorization:
                request.add_header("Authorization", self.authorization)
            try:
                return self.opener.open(request, timeout=TIMEOUT)
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate") or ""
                if exc.code == 401 and attempt == 0 and challenge:
                    if challenge.lower().startswith("bearer"):
                        self.authorization = self._token(challenge)
                    elif self._basic():
                        self.authorization = self._basic()
                    else:
                        raise MachineryError("the registry %s wants credentials: give image_pull_secret"
                                             % self.base[len("https://"):], self.field) from None
                    continue
                if exc.code == 401:
                    raise MachineryError("the registry %s refused the credentials of image_pull_secret (HTTP 401)"
                                         % self.base[len("https://"):], self.field) from None
                if exc.code == 404:
                    raise MachineryError("%s: not found in the registry" % path, self.field) from None
                raise MachineryError("GET %s%s: HTTP %d" % (self.base, path, exc.code), self.field) from None
            except ssl.SSLError as exc:
                raise MachineryError("TLS with %s failed: %s (a private registry's CA is given with image_ca_file)"
                                     % (self.base, exc.reason or exc), self.field) from None
            except OSError as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, ssl.SSLError):
                    raise MachineryError("TLS with %s failed: %s (a private registry's CA is given with "
                                         "image_ca_file)" % (self.base, reason.reason or reason),
                                         self.field) from None
                raise MachineryError("cannot reach %s: %s" % (self.base, reason), self.field) from None
        raise MachineryError("the registry %s keeps asking for credentials" % self.base, self.field)

    def manifest(self, repository, reference):
        """(digest, manifest) of ``reference``, verified against the digest when the reference is one."""
        with self.open("/v2/%s/manifests/%s" % (repository, reference), ACCEPT) as response:
            body = response.read()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise MachineryError("the registry's manifest for %s has the digest %s" % (reference, digest), self.field)
        try:
            return digest, json.loads(body.decode())
        except ValueError:
            raise MachineryError("the registry's manifest of %s:%s is no JSON" % (repository, reference),
                                 self.field) from None


def resolve(source, ca_file=None, credentials=None, field="image"):
    """An OCI image as images.resolve returns an image: {source, checksum (the disk layer's sha256), oci {...},
    virtual_size (0: known once downloaded)}. Reads the registry, writes nothing."""
    registry, repository, reference = parse(source, field)
    client = Registry(registry, ca_file, credentials, field)
    digest, manifest = client.manifest(repository, reference)
    if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
        digest, manifest = _from_index(client, repository, manifest, source, field)
    layers = [layer for layer in manifest.get("layers") or [] if layer.get("mediaType") in ROOTFS_MEDIA_TYPES]
    if not layers and _variant(manifest) == METAL:
        raise ValidationError("%s is a metal boot image (annotation variant: metal: a kernel, an initramfs and a "
                              "squashfs to boot a server from): it has no disk for a virtual machine; give its "
                              "virtualization image" % source, field)
    if not layers:
        raise ValidationError("%s is no OS image in IronCore's format: no layer of media type %s"
                              % (source, " or ".join(ROOTFS_MEDIA_TYPES)), field)
    layer = layers[0]
    checksum = str(layer.get("digest") or "")
    if not re.match(r"^sha256:[0-9a-f]{64}$", checksum):
        raise MachineryError("%s: its disk layer has no sha256 digest" % source, field)
    return {"source": source, "checksum": checksum[len("sha256:"):], "manifest_digest": digest, "virtual_size": 0,
            "oci": {"registry": registry, "repository": repository, "layer": checksum, "size": layer.get("size"),
                    "ca_file": ca_file, "credentials": credentials}}


def _variant(entry):
    return str((entry.get("annotations") or {}).get(VARIANT_ANNOTATION) or "").lower()


def _from_index(client, repository, index, source, field):
    """(digest, manifest) of the image an index holds for these pools: its linux/amd64 entries (by platform, as
    containerd matches one), of which the one that is a virtualization boot (ironcore-image's OCI-SPEC: the
    annotation variant: virtualization, on the entry or on its manifest) rather than a metal one; with no
    annotation, the first that has a disk layer."""
    candidates = [item for item in index.get("manifests") or []
                  if (item.get("platform") or {}).get("architecture") in ("amd64", "x86_64")
                  and (item.get("platform") or {}).get("os", "linux") == "linux"]
    if not candidates:
        raise MachineryError("%s has no linux/amd64 image in its index" % source, field)
    candidates.sort(key=lambda item: {VIRTUALIZATION: 0, "": 1, METAL: 2}.get(_variant(item), 1))
    first = None
    for item in candidates:
        digest, manifest = client.manifest(repository, item["digest"])
        first = first or (digest, manifest)
        variant = _variant(item) or _variant(manifest)
        has_disk = any(layer.get("mediaType") in ROOTFS_MEDIA_TYPES for layer in manifest.get("layers") or [])
        if variant == VIRTUALIZATION or (variant != METAL and has_disk):
            return digest, manifest
    return first  # a metal image only: refused by the caller, naming why


def download(image, target_dir, field="image"):
    """The image's disk layer downloaded into ``target_dir/<sha256>`` (once), verified by its digest."""
    spec = image["oci"]
    target = os.path.join(target_dir, image["checksum"])
    if os.path.isfile(target):
        return target
    os.makedirs(target_dir, exist_ok=True)
    client = Registry(spec["registry"], spec.get("ca_file"), spec.get("credentials"), field)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target_dir, delete=False) as handle:
        try:
            with client.open("/v2/%s/blobs/%s" % (spec["repository"], spec["layer"])) as response:
                for block in iter(lambda: response.read(CHUNK), b""):
                    digest.update(block)
                    handle.write(block)
        except BaseException:
            os.unlink(handle.name)
            raise
    if digest.hexdigest() != image["checksum"]:
        os.unlink(handle.name)
        raise MachineryError("the layer of %s has the sha256 %s, not its digest %s"
                             % (image["source"], digest.hexdigest(), image["checksum"]), field)
    os.replace(handle.name, target)
    return target
