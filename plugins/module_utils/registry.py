# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pool registration and published classes, kept on the pool host in a dir storage pool of JSON documents.

Each object is stored as ``<key>.<generation>.json``; a write creates generation n+1 and only then removes the
older ones. Every document carries the checksum of its body, so a write cut off midway leaves a document that
fails verification and the reader falls back to the previous generation: an object is never unreadable.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import time

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils.errors import ConflictError, LibvirtFailure

REGISTRY_POOL = "machinery-registry"
STORAGE_POOL = "machinery"
DEFAULT_STORAGE_PATH = "/var/lib/libvirt/machinery"
POOL_KEY = "pool"
_DOC = re.compile(r"^(?P<key>[a-z0-9][-a-z0-9]*)\.(?P<generation>[0-9]+)\.json$")


def registry_path(storage_path):
    storage_path = storage_path.rstrip("/") or "/"
    return os.path.join(os.path.dirname(storage_path), os.path.basename(storage_path) + "-registry")


def class_key(name):
    return "class-%s" % name


def encode(key, generation, body):
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    document = {"key": key, "generation": generation, "body": body,
                "sha256": hashlib.sha256(canonical.encode()).hexdigest()}
    return json.dumps(document, sort_keys=True, indent=1).encode() + b"\n"


def decode(data, key):
    """The body of a stored document, or None when it is cut off, corrupt or belongs to another key."""
    try:
        document = json.loads(data.decode())
        body = document["body"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if document.get("key") != key or document.get("sha256") != hashlib.sha256(canonical.encode()).hexdigest():
        return None
    return body


class Registry:
    """The documents of one pool host. ``pool`` is the libvirt storage pool, or None when it does not exist."""

    def __init__(self, conn, pool):
        self.conn = conn
        self.pool = pool
        self._index = None
        self._bodies = {}

    @classmethod
    def open(cls, conn):
        pool = lv.lookup_storage_pool(conn, REGISTRY_POOL)
        if pool is not None and not pool.isActive():
            pool.create(0)
        return cls(conn, pool)

    def _generations(self):
        """{key: [(generation, volume name)] newest first}."""
        if self._index is None:
            self._index = {}
            if self.pool is not None:
                for name in self.pool.listVolumes():
                    match = _DOC.match(name)
                    if match:
                        self._index.setdefault(match.group("key"), []).append(
                            (int(match.group("generation")), name))
                for versions in self._index.values():
                    versions.sort(reverse=True)
        return self._index

    def keys(self, prefix=""):
        return sorted(key for key in self._generations() if key.startswith(prefix))

    def get(self, key):
        if key not in self._bodies:
            self._bodies[key] = self._read(key)
        return self._bodies[key]

    def _read(self, key, relisted=False):
        vanished = False
        for _generation, name in self._generations().get(key, []):
            vol = lv.lookup_volume(self.pool, name)
            try:
                data = storage.download_bytes(self.conn, vol, limit=1024 * 1024) if vol is not None else None
            except LibvirtFailure:
                if lv.lookup_volume(self.pool, name) is not None:
                    raise
                data = None  # pruned between the lookup and the download
            if data is None:
                vanished = True
                continue
            body = decode(data, key)
            if body is not None:
                return body
        if vanished and not relisted:
            # a concurrent put wrote a newer generation and pruned the ones listed here: list again, once
            self._index = None
            return self._read(key, relisted=True)
        return None

    def put(self, key, body):
        # under the host's admission lock, listed afresh: two runs writing the same document at once (both
        # registering a pool, say) then take distinct generations instead of colliding on one volume name
        with AdmissionLock(self.conn, self.pool):
            self._index = None
            versions = self._generations().get(key, [])
            generation = versions[0][0] + 1 if versions else 1
            name = "%s.%d.json" % (key, generation)
            data = encode(key, generation, body)
            vol = storage.create_volume(self.pool, name, len(data), "raw", mode="0600")
            storage.upload_bytes(self.conn, vol, data)
            # superseded generations are pruned; one that another run is opening for a read stays until the
            # next put (readers take the newest valid generation, so it is never read again)
            for _old, old_name in versions:
                storage.delete_volume(self.pool, old_name, keep_if_busy=True)
        self._index[key] = [(generation, name)]
        self._bodies[key] = body

    def delete(self, key):
        self._bodies.pop(key, None)
        with AdmissionLock(self.conn, self.pool):
            self._index = None
            versions = self._generations().pop(key, [])
            for _generation, name in versions:
                storage.delete_volume(self.pool, name)
        return bool(versions)

    def pool_registration(self):
        return self.get(POOL_KEY)

    def machine_class(self, name):
        return self.get(class_key(name))

    def machine_classes(self):
        classes = {}
        for key in self.keys("class-"):
            body = self.get(key)
            if body is not None:
                classes[body["name"]] = body
        return classes


LOCK_VOLUME = "admission.lock"
LOCK_STALE_SECONDS = 120


class AdmissionLock:
    """A lock on one pool host made from libvirt alone: creating a storage volume is atomic, so whoever creates
    ``admission.lock`` in the registry pool holds it. A lock older than LOCK_STALE_SECONDS (its holder died)
    is broken. Works over any URI, across hosts and processes."""

    def __init__(self, conn, pool, timeout=60.0):
        self.conn = conn
        self.pool = pool
        self.timeout = timeout
        self.volume = None

    def _age(self):
        vol = lv.lookup_volume(self.pool, LOCK_VOLUME)
        if vol is None:
            return None
        node = dx.parse(vol.XMLDesc(0)).find("target/timestamps/mtime")
        if node is None or not node.text:
            return 0.0
        return max(0.0, time.time() - float(node.text))

    def acquire(self):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.volume = self.pool.createXML(storage.volume_xml(LOCK_VOLUME, 1, "raw", mode="0600"), 0)
                return self
            except lv.libvirt.libvirtError as exc:
                if exc.get_error_code() not in (lv.libvirt.VIR_ERR_STORAGE_VOL_EXIST, lv.libvirt.VIR_ERR_INTERNAL_ERROR,
                                                lv.libvirt.VIR_ERR_OPERATION_FAILED):
                    raise LibvirtFailure("cannot take the admission lock: %s" % lv.describe(exc)) from None
            age = self._age()
            if age is not None and age > LOCK_STALE_SECONDS:
                storage.delete_volume(self.pool, LOCK_VOLUME)
                continue
            if time.monotonic() > deadline:
                raise ConflictError("the admission lock of this pool has been held for over %ds by another run"
                                    % self.timeout, "uri")
            time.sleep(0.05 + random.random() * 0.1)

    def release(self):
        if self.volume is not None:
            try:
                self.volume.delete(0)
            except lv.libvirt.libvirtError:
                pass
            self.volume = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
        return False
