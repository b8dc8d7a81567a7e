# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OS images: a local path, an http(s) URL or an OCI reference (oci.py), verified by sha256, cached once per pool
by checksum."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.machines import oci
from ansible_collections.machinery.compute.plugins.module_utils.coordination import locks
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, NotFoundError, \
    ValidationError

FORMATS = ("qcow2", "raw")


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "machinery.compute")


def _is_url(source):
    return source.startswith("http://") or source.startswith("https://")


def _checksum_field(field):
    return field[:-len("image")] + "image_checksum" if field.endswith("image") else field + "_checksum"


_CHECKSUMS = {}  # storage.file_key -> sha256, for this process (the file below keeps them across runs)


def _remembered_checksum(path):
    """sha256 of a local file, remembered by (path, size, mtime) so a large image is hashed once."""
    own = storage.file_key(path)
    if own in _CHECKSUMS:
        return _CHECKSUMS[own]
    stat = os.stat(path)
    key = "%s:%d:%d" % (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    memo_path = os.path.join(cache_dir(), "checksums.json")
    try:
        with open(memo_path) as handle:
            memo = json.load(handle)
    except (OSError, ValueError):
        memo = {}
    if key not in memo:
        memo[key] = storage.sha256_file(path)
        try:
            os.makedirs(cache_dir(), exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=cache_dir(), delete=False) as handle:
                json.dump(memo, handle)
            os.replace(handle.name, memo_path)
        except OSError:
            pass  # a read-only home only costs a second hash next time
    _CHECKSUMS[own] = memo[key]
    return memo[key]


def resolve(source, checksum=None, field="image", registry=None):
    """Validate an image reference without writing anything: {source, checksum, path | url | oci}. ``registry``
    ({ca_file, credentials}) is how an ``oci://`` image's registry is reached."""
    if not isinstance(source, str) or not source:
        raise ValidationError("must be a file path or an http(s) URL", field)
    if oci.is_oci(source):
        if checksum:
            raise ValidationError("an OCI image is verified by its own digest; give it in the reference "
                                  "(oci://.../repository@sha256:<digest>) rather than a checksum",
                                  _checksum_field(field))
        registry = registry or {}
        return oci.resolve(source, registry.get("ca_file"), registry.get("credentials"), field)
    wanted = check.sha256_checksum(checksum, _checksum_field(field)) if checksum else None
    if _is_url(source):
        if not wanted:
            raise ValidationError("an image URL needs a sha256 checksum to be verified against",
                                  _checksum_field(field))
        return {"source": source, "checksum": wanted, "url": source}
    if "://" in source:
        raise ValidationError("%r: only local paths and http(s) URLs are supported" % source, field)
    if not os.path.isfile(source):
        raise NotFoundError("image %s does not exist or is not a file" % source, field)
    actual = _remembered_checksum(source)
    if wanted and wanted != actual:
        raise ValidationError("checksum mismatch for %s: expected sha256 %s, the file has %s"
                              % (source, wanted, actual), _checksum_field(field))
    return {"source": source, "checksum": actual, "path": os.path.abspath(source)}


def cached_volume(pool, checksum):
    """(volume, format) of a completely uploaded image in ``pool``, or (None, None)."""
    for fmt in FORMATS:
        name = storage.image_volume_name(checksum, fmt)
        vol = lv.lookup_volume(pool, name)
        if vol is not None and lv.lookup_volume(pool, name + ".complete") is not None:
            return vol, fmt
    return None, None


def download(url, checksum, opener):
    """Fetch ``url`` into the local cache once, verifying its sha256 on the way in.

    ``opener(url, timeout)`` returns a file-like response: the modules pass Ansible's open_url, which honours
    proxies and the system's certificates."""
    target = os.path.join(cache_dir(), "images", checksum)
    if os.path.isfile(target):
        return target
    path, found = _fetch(url, opener)
    if found != checksum:
        os.unlink(path)
        raise ValidationError("checksum mismatch for %s: expected sha256 %s, got %s"
                              % (url, checksum, found), "image_checksum")
    with open(path, "rb") as downloaded:  # the same rule as a local image, before it is cached
        header = downloaded.read(check.IMAGE_HEADER_BYTES)
    try:
        check.disk_image(header, os.path.getsize(path), "image")
    except MachineryError:
        os.unlink(path)
        raise
    os.replace(path, target)
    return target


def _fetch(url, opener):
    """(path, sha256) of ``url`` downloaded into a new file of the local image cache."""
    if opener is None:
        raise MachineryError("no way to download %s here" % url, "image")
    directory = os.path.join(cache_dir(), "images")
    os.makedirs(directory, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=directory, delete=False) as handle:
        try:
            with opener(url, timeout=60) as response:
                for block in iter(lambda: response.read(storage.CHUNK), b""):
                    digest.update(block)
                    handle.write(block)
        except (OSError, ValueError) as exc:
            os.unlink(handle.name)
            raise MachineryError("cannot download %s: %s" % (url, exc), "image") from None
    return handle.name, digest.hexdigest()


def checksum_of_url(url, opener):
    """(sha256, first) of an image URL given without a checksum (vitistack's os.imageID). The first call downloads
    the file once into the cache, records its sha256 by URL on this controller and returns first=True; later
    calls return the recorded sha256, against which the download is then verified, so a file changed at that URL
    is a checksum mismatch rather than a different image booted."""
    memo_path = os.path.join(cache_dir(), "url-checksums.json")
    try:
        with open(memo_path) as handle:
            memo = json.load(handle)
    except (OSError, ValueError):
        memo = {}
    if url in memo:
        return memo[url], False
    path, checksum = _fetch(url, opener)
    os.replace(path, os.path.join(cache_dir(), "images", checksum))
    memo[url] = checksum
    with tempfile.NamedTemporaryFile("w", dir=cache_dir(), delete=False) as handle:
        json.dump(memo, handle)
    os.replace(handle.name, memo_path)
    return checksum, True


def ensure_cached(conn, pool, image, opener=None, memo=None, run=None):
    """The pool's volume of ``image``, uploaded through the libvirt stream if it is not there yet; a base volume
    (``base_volume``: OpenShift's baseVolumeID) is that volume itself, used in place as the backing file.

    Threads of one run that need the same image on the same pool wait for one upload; with ``memo`` (a dict the
    run keeps per pool) the volume is looked up once a run, not once a machine. ``run``: the run's Coordination
    (its threads take turns there before they take the image's upload lock)."""
    if image.get("base_volume"):
        vol = base_volume_by_key(conn, image["base_volume"], "image")
        return vol, storage.volume_format(vol)
    if memo is not None and image["checksum"] in memo:
        return memo[image["checksum"]]
    vol, fmt = cached_volume(pool, image["checksum"])
    if vol is None:
        vol, fmt = _upload_once(conn, pool, image, opener, run)
    if memo is not None:
        memo[image["checksum"]] = (vol, fmt)
    return vol, fmt


BASE_VOLUME = "volume:"


def is_base_volume(source):
    """True for ``volume:<storage pool>/<volume>`` (or ``volume:<path>``): a volume already on the pool host."""
    return isinstance(source, str) and source.startswith(BASE_VOLUME) and len(source) > len(BASE_VOLUME)


def base_volume_by_key(conn, key, field):
    try:
        return conn.storageVolLookupByKey(key)
    except lv.libvirt.libvirtError:
        raise NotFoundError("the base volume %s is gone from the pool host" % key, field) from None


def resolve_base_volume(conn, source, field):
    """A base volume as an image: {source, checksum, base_volume (its key), virtual_size}. The volume is named
    ``<storage pool>/<volume>`` (looked up by name in that libvirt storage pool) or by its key (a path), as the
    OpenShift libvirt provider looks up its baseVolumeID. Its bits are not read: the checksum stands for the
    volume's identity (key and capacity), so the machine's record tells which base it was built on."""
    name = source[len(BASE_VOLUME):]
    vol = None
    if not name.startswith("/"):
        pool_name, _sep, volume_name = name.partition("/")
        try:
            pool = conn.storagePoolLookupByName(pool_name)
        except lv.libvirt.libvirtError:
            raise NotFoundError("no libvirt storage pool %r on the pool host (for base volume %s)"
                                % (pool_name, volume_name), field) from None
        try:
            pool.refresh(0)
        except lv.libvirt.libvirtError:
            pass  # an inactive pool cannot be refreshed; the lookup says whether the volume is there
        vol = lv.lookup_volume(pool, volume_name)
        if vol is None:
            raise NotFoundError("no volume %r in libvirt storage pool %r of the pool host"
                                % (volume_name, pool_name), field)
    else:
        vol = base_volume_by_key(conn, name, field)
    capacity = vol.info()[1]
    identity = hashlib.sha256(("%s\0%d" % (vol.key(), capacity)).encode()).hexdigest()
    return {"source": source, "checksum": identity, "base_volume": vol.key(), "virtual_size": capacity}


def backing_path(ctx, vol, image):
    """The path an overlay of ``image`` names as its backing file: a base volume's own path, else the cache
    volume's in the pool's storage."""
    return vol.path() if image.get("base_volume") else ctx.storage_file(vol.name())


def _upload_once(conn, pool, image, opener, run):
    with run.upload_turn(pool.UUIDString(), image["checksum"]) if run is not None else contextlib.nullcontext():
        vol, fmt = cached_volume(pool, image["checksum"])
        if vol is not None:
            return vol, fmt
        if image.get("oci"):
            path = oci.download(image, os.path.join(cache_dir(), "images"))
            with open(path, "rb") as downloaded:  # the rule every image is held to, before it is cached
                check.disk_image(downloaded.read(check.IMAGE_HEADER_BYTES), os.path.getsize(path), "image")
        else:
            path = image.get("path") or download(image["url"], image["checksum"], opener)
        # other processes (another run, another controller) may want the same image now: one uploads it, the
        # others wait for it instead of taking its half-written volume for the leftover of a dead run
        with locks.image_upload_lock(conn, pool, image["checksum"], run.identity if run is not None else None):
            vol, fmt = cached_volume(pool, image["checksum"])
            if vol is not None:
                return vol, fmt
            vol, fmt, _uploaded = storage.ensure_image(conn, pool, path, image["checksum"])
            return vol, fmt
