# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes in a pool's storage, moved through libvirt streams so that every URI works (no second channel)."""

from __future__ import annotations

import hashlib
import os
import struct
from xml.sax.saxutils import escape

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.errors import LibvirtFailure, NotFoundError

CHUNK = 1024 * 1024
QCOW2_MAGIC = b"QFI\xfb"


def image_format(path):
    """'qcow2' or 'raw', from the file's first bytes."""
    with open(path, "rb") as handle:
        return "qcow2" if handle.read(4) == QCOW2_MAGIC else "raw"


def virtual_size(path):
    """The disk size the guest sees: the qcow2 header's size field, or the file size of a raw image."""
    with open(path, "rb") as handle:
        header = handle.read(32)
    if header[:4] == QCOW2_MAGIC and len(header) == 32:
        return struct.unpack(">Q", header[24:32])[0]
    return os.path.getsize(path)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def dir_pool_xml(name, path):
    return ("<pool type='dir'><name>%s</name><target><path>%s</path>"
            "<permissions><mode>0711</mode></permissions></target></pool>" % (escape(name), escape(path)))


def ensure_dir_pool(conn, name, path, check_mode=False):
    """Make sure a running, autostarted dir pool ``name`` exists at ``path``; return (pool, changed)."""
    pool = lv.lookup_storage_pool(conn, name)
    changed = False
    if pool is None:
        if check_mode:
            return None, True
        try:
            pool = conn.storagePoolDefineXML(dir_pool_xml(name, path), 0)
            pool.build(0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot define storage pool %s at %s: %s" % (name, path, lv.describe(exc)),
                                 "storage_path") from None
        changed = True
    if not pool.isActive():
        if check_mode:
            return pool, True
        try:
            pool.create(0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot start storage pool %s: %s" % (name, lv.describe(exc)),
                                 "storage_path") from None
        changed = True
    if not pool.autostart():
        if check_mode:
            return pool, True
        pool.setAutostart(1)
        changed = True
    return pool, changed


def pool_path(pool):
    return dx.parse(pool.XMLDesc(0)).findtext("target/path")


def volume_format(vol):
    """The format libvirt records for a volume (raw when it records none)."""
    node = dx.parse(vol.XMLDesc(0)).find("target/format")
    return node.get("type") if node is not None else "raw"


def volume_xml(name, capacity, fmt="raw", mode=None, backing=None, allocation=0):
    """Volume XML; ``backing`` is (path, format) for a thin overlay."""
    parts = ["<volume><name>%s</name>" % escape(name),
             "<capacity unit='bytes'>%d</capacity><allocation unit='bytes'>%d</allocation>" % (capacity, allocation),
             "<target><format type='%s'/>" % fmt]
    if mode:
        parts.append("<permissions><mode>%s</mode></permissions>" % mode)
    parts.append("</target>")
    if backing:
        path, fmt_of_backing = backing
        parts.append("<backingStore><path>%s</path><format type='%s'/></backingStore>"
                     % (escape(path), fmt_of_backing))
    parts.append("</volume>")
    return "".join(parts)


def create_volume(pool, name, capacity, fmt="raw", mode=None, backing=None):
    try:
        return pool.createXML(volume_xml(name, capacity, fmt, mode, backing), 0)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot create volume %s: %s" % (name, lv.describe(exc))) from None


def delete_volume(pool, name, keep_if_busy=False):
    """Delete ``name`` if it exists; True when something was deleted.

    With ``keep_if_busy``, a volume that something is still reading (a download stream of another run) is
    left in place, and False returned, instead of failing."""
    vol = lv.lookup_volume(pool, name)
    if vol is None:
        return False
    try:
        vol.delete(0)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_STORAGE_VOL:
            return False
        if keep_if_busy and exc.get_error_code() == lv.libvirt.VIR_ERR_OPERATION_INVALID:
            return False
        raise LibvirtFailure("cannot delete volume %s: %s" % (name, lv.describe(exc))) from None
    return True


def _send(stream, chunks):
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            sent = stream.send(view.tobytes())
            if sent < 0:
                raise LibvirtFailure("the upload stream refused data")
            view = view[sent:]


def upload(conn, vol, chunks, length):
    """Write ``length`` bytes from the iterable ``chunks`` into ``vol`` through a libvirt stream."""
    stream = conn.newStream(0)
    try:
        vol.upload(stream, 0, length, 0)
        _send(stream, chunks)
        stream.finish()
    except BaseException as exc:
        try:
            stream.abort()
        except Exception:  # the stream may already be closed by the daemon
            pass
        if isinstance(exc, lv.libvirt.libvirtError):
            raise LibvirtFailure("upload to volume %s failed: %s" % (vol.name(), lv.describe(exc))) from None
        raise


def upload_bytes(conn, vol, data):
    upload(conn, vol, [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""], len(data))


def upload_file(conn, vol, path):
    size = os.path.getsize(path)

    def chunks():
        with open(path, "rb") as handle:
            yield from iter(lambda: handle.read(CHUNK), b"")
    upload(conn, vol, chunks(), size)


def download_bytes(conn, vol, limit=64 * 1024 * 1024):
    """The whole content of a (small) volume."""
    stream = conn.newStream(0)
    received = []
    try:
        vol.download(stream, 0, 0, 0)
        total = 0
        while True:
            data = stream.recv(CHUNK)
            if data in (-2, None) or not data:
                break
            received.append(data)
            total += len(data)
            if total > limit:
                raise LibvirtFailure("volume %s is larger than %d bytes" % (vol.name(), limit))
        stream.finish()
    except lv.libvirt.libvirtError as exc:
        try:
            stream.abort()
        except Exception:  # already closed by the daemon
            pass
        raise LibvirtFailure("download of volume %s failed: %s" % (vol.name(), lv.describe(exc))) from None
    return b"".join(received)


def write_secret_volume(conn, pool, name, data):
    """A mode-0600 raw volume holding ``data`` (Ignition, seed ISO): recreated whole, never edited in place."""
    delete_volume(pool, name)
    vol = create_volume(pool, name, max(len(data), 1), "raw", mode="0600")
    upload_bytes(conn, vol, data)
    return vol


def image_volume_name(checksum, fmt):
    return "image-%s.%s" % (checksum[:32], fmt)


def ensure_image(conn, pool, path, checksum, check_mode=False):
    """The cached image volume for ``checksum`` in ``pool``, uploaded from ``path`` once.

    A cut-off upload must not be mistaken for a cached image: the volume is only trusted when its capacity is
    the file's size and the completion marker volume exists.
    """
    fmt = image_format(path)
    name = image_volume_name(checksum, fmt)
    marker = name + ".complete"
    vol = lv.lookup_volume(pool, name)
    if vol is not None and lv.lookup_volume(pool, marker) is not None:
        return vol, fmt, False
    if check_mode:
        return None, fmt, True
    if vol is not None:
        delete_volume(pool, name)
    vol = create_volume(pool, name, os.path.getsize(path), "raw", mode="0644")
    upload_file(conn, vol, path)
    create_volume(pool, marker, 1, "raw", mode="0644")
    vol = pool.storageVolLookupByName(name)
    return vol, fmt, True


def find_volume(pool, name, field):
    vol = lv.lookup_volume(pool, name)
    if vol is None:
        raise NotFoundError("no volume %r in storage pool %s" % (name, pool.name()), field)
    return vol
