# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes in a pool's storage, moved through libvirt streams so that every URI works (no second channel)."""

from __future__ import annotations

import hashlib
import os
import struct
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, LibvirtFailure, NotFoundError
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

CHUNK = 1024 * 1024
STORAGE_POOL = "machinery"  # the storage pool of a pool host's machines and image cache
QCOW2_MAGIC = b"QFI\xfb"


def image_format(path):
    """'qcow2' or 'raw', from the file's first bytes."""
    with open(path, "rb") as handle:
        return "qcow2" if handle.read(4) == QCOW2_MAGIC else "raw"


def file_key(path):
    """What tells one state of a local file from another without reading it: (path, inode, size, mtime). A run
    reads the same image for each of its machines; what it learned of it holds until the file changes."""
    stat = os.stat(path)
    return (path, stat.st_ino, stat.st_size, stat.st_mtime_ns)


_VIRTUAL_SIZES = {}  # file_key -> virtual size, for this process


def virtual_size(path):
    """The disk size the guest sees: the qcow2 header's size field, or the file size of a raw image."""
    key = file_key(path)
    if key not in _VIRTUAL_SIZES:
        with open(path, "rb") as handle:
            header = handle.read(32)
        _VIRTUAL_SIZES[key] = struct.unpack(">Q", header[24:32])[0] \
            if header[:4] == QCOW2_MAGIC and len(header) == 32 else os.path.getsize(path)
    return _VIRTUAL_SIZES[key]


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def define_dir_pool(conn, name, path):
    """Define, build, start and autostart a dir storage pool ``name`` at ``path``."""
    try:
        pool = writer.write(conn, "storagePoolDefineXML", elements.to_string(elements.storage_pool(name, path)), 0)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot define storage pool %s at %s: %s" % (name, path, lv.describe(exc)),
                             "storage_path") from None
    try:
        lv.start_or_undefine(pool, lambda: writer.write(pool, "build", 0), lambda: writer.write(pool, "create", 0),
                             lambda: writer.write(pool, "setAutostart", 1))
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot build storage pool %s at %s: %s" % (name, path, lv.describe(exc)),
                             "storage_path") from None
    return pool


def remove_pool(conn, name):
    """Delete every volume of the storage pool ``name``, then the pool and its directory."""
    pool = lv.lookup_storage_pool(conn, name)
    if pool is None:
        return
    try:
        if not pool.isActive():
            writer.write(pool, "create", 0)
        for volume in pool.listAllVolumes(0):
            writer.write(volume, "delete", 0)
        writer.write(pool, "destroy")
        writer.write(pool, "delete", 0)
        writer.write(pool, "undefine")
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot remove storage pool %s: %s" % (name, lv.describe(exc))) from None


def start_dir_pool(conn, name, start=True):
    """Start the storage pool ``name`` (``start``), or mark it autostarted."""
    pool = lv.lookup_storage_pool(conn, name)
    try:
        if start:
            writer.write(pool, "create", 0)
        else:
            writer.write(pool, "setAutostart", 1)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot start storage pool %s: %s" % (name, lv.describe(exc)), "storage_path") from None


# libvirt refuses to rescan a storage pool while it builds a volume there ("pool has asynchronous jobs running"):
# another run making a disk, a copy, a LUKS volume. That is another run's work, not a failure of this one, so a
# rescan is tried again for up to BUSY_SECONDS (a large image copied in, under load) before it fails.
BUSY_SECONDS = 120.0


def refresh(pool, seconds=BUSY_SECONDS, clock=time.monotonic, pause=time.sleep):
    """Rescan the storage ``pool``, waiting (bounded) while another run builds a volume in it."""
    deadline = clock() + seconds
    while True:
        try:
            pool.refresh(0)
            return pool
        except lv.libvirt.libvirtError as exc:
            if not busy(exc) or clock() > deadline:
                raise LibvirtFailure("cannot rescan storage pool %s: %s" % (pool.name(), lv.describe(exc))) from None
        pause(0.1)


def busy(exc):
    """True for libvirt's refusal to rescan a pool while it builds a volume there."""
    return "asynchronous jobs running" in (exc.get_error_message() or "")


def pool_path(pool):
    return elements.read_storage_pool(elements.parse(pool.XMLDesc(0)))["path"]


def volume_format(vol):
    """The format libvirt records for a volume (raw when it records none)."""
    return elements.read_volume(elements.parse(vol.XMLDesc(0)))["format"] or "raw"


def volume_xml(name, capacity, fmt="raw", mode=None, backing=None, secret=None):
    """Volume XML; ``backing`` is (path, format) for a thin overlay, ``secret`` the passphrase of a LUKS one."""
    return elements.to_string(elements.volume(name, capacity, fmt, mode=mode, backing=backing, secret=secret))


class VolumeExists(LibvirtFailure):
    """The volume to create is there already (another run made it, or a listing missed it)."""


class VolumeTooLarge(LibvirtFailure):
    """A volume read whole is larger than the caller's limit."""


class VolumeBeingWritten(LibvirtFailure):
    """libvirt refuses to read a volume that another run is still creating ("still being allocated")."""


LUKS_BENCHMARK = "Unable to get accurate CPU usage"
LUKS_ATTEMPTS = 5


def _luks_retried(secret, make):
    """``make()``, asked again when it made an encrypted volume (``secret``) and qemu-img, which times its LUKS key
    derivation on the host's CPU, gave up because a loaded host let it measure nothing: then nothing was made."""
    for attempt in range(LUKS_ATTEMPTS):
        try:
            return make()
        except lv.libvirt.libvirtError as exc:
            if not (secret and LUKS_BENCHMARK in lv.describe(exc) and attempt + 1 < LUKS_ATTEMPTS):
                raise


def create_volume(pool, name, capacity, fmt="raw", mode=None, backing=None, secret=None, replace=False):
    """Create the volume ``name``; with ``replace``, one of that name already there is deleted first (found by
    the create failing, so the usual case costs no lookup)."""
    xml = volume_xml(name, capacity, fmt, mode, backing, secret)
    try:
        return _luks_retried(secret, lambda: writer.write(pool, "createXML", xml, 0))
    except lv.libvirt.libvirtError as exc:
        if not (replace and exc.get_error_code() == lv.libvirt.VIR_ERR_STORAGE_VOL_EXIST):
            kind = VolumeExists if exc.get_error_code() == lv.libvirt.VIR_ERR_STORAGE_VOL_EXIST else LibvirtFailure
            raise kind("cannot create volume %s: %s" % (name, lv.describe(exc))) from None
    delete_volume(pool, name)
    return create_volume(pool, name, capacity, fmt, mode, backing, secret)


def copy_volume(pool, name, capacity, fmt, source, secret=None):
    """A new volume ``name`` holding a full copy of the volume ``source`` (converted to ``fmt``, no backing
    file), of at least ``capacity`` bytes. libvirt copies on the host (qemu-img convert), so it works over any
    URI; the copy is grown afterwards when the source was smaller than ``capacity``. With ``secret`` (the uuid of
    a volume secret) the copy is LUKS-encrypted, raw inside: every byte of the source is written encrypted."""
    try:
        vol = _luks_retried(secret, lambda: writer.write(pool, "createXMLFrom",
                                                         volume_xml(name, capacity, fmt, secret=secret), source, 0))
        if vol.info()[1] < capacity:
            writer.write(vol, "resize", capacity, 0)
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot copy %s into volume %s: %s" % (source.name(), name, lv.describe(exc))) from None
    return vol


def delete_volume(pool, name, keep_if_busy=False, checked=True):
    """Delete ``name`` if it exists; True when something was deleted.

    With ``keep_if_busy``, a volume that something is still reading (a download stream of another run) is
    left in place, and False returned, instead of failing. ``checked=False``: a lock volume (writer.write)."""
    vol = lv.lookup_volume(pool, name)
    if vol is None:
        return False
    try:
        writer.write(vol, "delete", 0, checked=checked)
    except lv.libvirt.libvirtError as exc:
        if exc.get_error_code() == lv.libvirt.VIR_ERR_NO_STORAGE_VOL:
            return False
        if keep_if_busy and exc.get_error_code() == lv.libvirt.VIR_ERR_OPERATION_INVALID:
            return False
        raise LibvirtFailure("cannot delete volume %s: %s" % (name, lv.describe(exc))) from None
    return True


def send_chunks(stream, chunks):
    """Send every chunk through an upload stream, as many calls as the stream needs for each."""
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
        writer.write(vol, "upload", stream, 0, length, 0)
        send_chunks(stream, chunks)
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


def download_bytes(conn, vol, limit=64 * 1024 * 1024, offset=0):
    """The whole content of a (small) volume, or from ``offset`` on."""
    stream = conn.newStream(0)
    received = []
    try:
        vol.download(stream, offset, 0, 0)
        total = 0
        while True:
            data = stream.recv(CHUNK)
            if data in (-2, None) or not data:
                break
            received.append(data)
            total += len(data)
            if total > limit:
                raise VolumeTooLarge("volume %s is larger than %d bytes" % (vol.name(), limit))
        stream.finish()
    except (lv.libvirt.libvirtError, VolumeTooLarge) as exc:
        try:
            stream.abort()
        except Exception:  # already closed by the daemon
            pass
        if isinstance(exc, VolumeTooLarge):
            raise
        kind = VolumeBeingWritten if being_written(exc) else LibvirtFailure
        raise kind("download of volume %s failed: %s" % (vol.name(), lv.describe(exc))) from None
    return b"".join(received)


def being_written(exc):
    """True for libvirt's refusal to read a volume another run is still creating."""
    return exc.get_error_code() == lv.libvirt.VIR_ERR_OPERATION_INVALID and \
        "still being allocated" in (exc.get_error_message() or "")


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


def define_volume_secret(conn, path, machine, passphrase):
    """A private libvirt secret holding the LUKS passphrase of the volume at ``path``; a secret left for that
    path by a run that died is replaced. Returns its uuid."""
    delete_volume_secret(conn, path)
    try:
        secret = writer.write(conn, "secretDefineXML", cap.secret_xml(path, machine), 0)
        writer.write(secret, "setValue", passphrase.encode("utf-8"), 0)
    except lv.libvirt.libvirtError as exc:
        delete_volume_secret(conn, path)
        raise LibvirtFailure("cannot define the passphrase secret of %s: %s" % (path, lv.describe(exc))) from None
    return secret.UUIDString()


def delete_volume_secret(conn, path):
    """Undefine the secret of the volume at ``path``, if there is one; True when one went."""
    try:
        secret = conn.secretLookupByUsage(lv.libvirt.VIR_SECRET_USAGE_TYPE_VOLUME, path)
    except lv.libvirt.libvirtError:
        return False
    try:
        writer.write(secret, "undefine")
    except lv.libvirt.libvirtError as exc:
        raise LibvirtFailure("cannot undefine the passphrase secret of %s: %s" % (path, lv.describe(exc))) from None
    return True


def users_of(conn, path, except_machine):
    """Names of the other domains of the pool whose persistent XML uses ``path`` as a disk."""
    users = []
    for dom, tree in dx.defined_domains(conn):
        if dom.name() == except_machine:
            continue
        if any(disk["path"] == path for disk in elements.read_disks(tree)):
            users.append(dom.name())
    return sorted(users)


def reserved_volume(name):
    """Why the collection's own volume ``name`` may never be attached as a disk, or None for any other name:
    image caches are the backing files of every root on the pool, the others are a machine's boot material or
    console log (or a KVM probe's)."""
    if name.startswith("image-") or name.endswith(".complete"):
        return "it is an image cache, the backing file of the machines' root disks"
    if name.startswith("upload-"):
        return "it is the lock of an image upload"
    for suffix, what in (("-ignition.json", "an Ignition file"), ("-cidata.iso", "a cloud-init seed"),
                         ("-console.log", "a console log"), (".log", "a log")):
        if name.endswith(suffix):
            return "it is %s of the collection's own" % what
    return None


def check_attachable(name, field):
    reason = reserved_volume(name)
    if reason:
        raise ConflictError("volume %s cannot be attached: %s" % (name, reason), field)


def find_volume(pool, name, field):
    vol = lv.lookup_volume(pool, name)
    if vol is None:
        raise NotFoundError("no volume %r in storage pool %s" % (name, pool.name()), field)
    return vol
