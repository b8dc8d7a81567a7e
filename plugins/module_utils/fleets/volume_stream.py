# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Storage and domain pieces of a move that talk to libvirt: refreshing a pool, reading a volume's facts,
copying a volume between two connections through sparse streams (holes kept), undefining a domain with all it
carries."""

from __future__ import annotations

import hashlib
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import header_bytes_needed, rebase_header
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


def refresh(pool):
    """Rescan a storage pool; libvirt refuses while a volume is being created in it (storage.refresh waits)."""
    storage.refresh(pool)


def volume_facts(vol):
    """{format, capacity, bytes (the file's length), mode, backing (path)} of a volume."""
    info = elements.read_volume(elements.parse(vol.XMLDesc(0)))
    length = vol.infoFlags(lv.libvirt.VIR_STORAGE_VOL_GET_PHYSICAL)[2]
    return {"format": info["format"] or "raw", "capacity": info["capacity"], "bytes": length,
            "mode": info["mode"], "backing": info["backing"]}


def _sparse_chunks(stream):
    """(data bytes | hole length) pieces of a sparse download stream, in order."""
    while True:
        data = stream.recvFlags(storage.CHUNK, lv.libvirt.VIR_STREAM_RECV_STOP_AT_HOLE)
        if data == -3:
            yield stream.recvHole(0)
        elif data == -2:
            time.sleep(0.01)
        elif not data:
            return
        else:
            yield data


def stream_volume(source_conn, source_vol, target_conn, target_vol, backing=None):
    """Copy the bytes of ``source_vol`` into ``target_vol`` through two libvirt streams, holes kept as holes.
    With ``backing``, the qcow2 header's backing file name is rewritten on the way (``rebase_header``).
    Returns the sha256 of the bytes the source holds (holes read as zeros)."""
    down = source_conn.newStream(0)
    up = target_conn.newStream(0)
    digest = hashlib.sha256()
    zeros = bytes(storage.CHUNK)
    head = b"" if backing else None
    try:
        source_vol.download(down, 0, 0, lv.libvirt.VIR_STORAGE_VOL_DOWNLOAD_SPARSE_STREAM)
        writer.write(target_vol, "upload", up, 0, 0, lv.libvirt.VIR_STORAGE_VOL_UPLOAD_SPARSE_STREAM)
        for piece in _sparse_chunks(down):
            if isinstance(piece, int):
                if head:
                    raise LibvirtFailure("the qcow2 header of %s is cut by a hole" % source_vol.name())
                left = piece
                while left:
                    digest.update(zeros[:min(left, len(zeros))])
                    left -= min(left, len(zeros))
                up.sendHole(piece, 0)
                continue
            digest.update(piece)
            if head is not None:
                head += piece
                if len(head) < 24 or len(head) < header_bytes_needed(head, backing):
                    continue
                piece, head = rebase_header(head, backing), None
            storage.send_chunks(up, [piece])
        if head:
            raise LibvirtFailure("the qcow2 header of %s is cut short" % source_vol.name())
        down.finish()
        up.finish()
    except BaseException as exc:
        for stream in (down, up):
            try:
                stream.abort()
            except Exception:  # closed by the daemon already
                pass
        if isinstance(exc, lv.libvirt.libvirtError):
            raise LibvirtFailure("copying volume %s failed: %s" % (source_vol.name(), lv.describe(exc))) from None
        if isinstance(exc, ValueError):
            raise LibvirtFailure("copying volume %s failed: %s" % (source_vol.name(), exc)) from None
        raise
    return digest.hexdigest()
