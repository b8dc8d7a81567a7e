# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""OVMF's variable store, read and edited as bytes: pure, no libvirt.

A UEFI machine's variables file (its ``<nvram>``) is an edk2 firmware volume whose first part is the variable
store: a header, then one record per variable (a 60-byte header, the name in UCS-2 with its terminating NUL, the
data), each record starting on a 4-byte boundary, up to the first erased (0xff) bytes. The firmware never
overwrites a record in place: it appends the new one and marks the old one deleted, and compacts the store
("reclaim") when it is full. After the store come the fault-tolerant-write areas, which are left alone.

``with_variables`` does what the firmware's reclaim and SetVariable do together: the valid records are kept, byte
for byte and in their order, deleted ones are dropped, and each variable given replaces the record of the same
vendor GUID and name (or is added). A variable is known by its GUID and name together, as UEFI defines it.

Written here rather than taken from a library: see docs/firmware.md ("Why the collection edits the store
itself").
"""

from __future__ import annotations

import struct
import uuid

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError

# the firmware volume that holds the variables (EFI_SYSTEM_NV_DATA_FV_GUID), and its signature
NV_DATA_VOLUME = uuid.UUID("fff12b8d-7696-4c8b-a985-2747075b4f50")
VOLUME_SIGNATURE = b"_FVH"
# the store's header: authenticated variables (what OVMF builds since 2015 use), formatted and healthy
AUTHENTICATED_STORE = uuid.UUID("aaf32c78-947b-439a-a180-2e144ec37792")
STORE_HEADER = struct.Struct("<16sIBBHI")
FORMATTED, HEALTHY = 0x5A, 0xFE
# one variable's header: start id, state, attributes, monotonic count, time stamp, public key index, the name's
# and the data's sizes, vendor GUID
RECORD_HEADER = struct.Struct("<HBxIQ16sIII16s")
START_ID = 0x55AA
# a record's state loses bits as it goes: added 0x3f; its update begun (in deleted transition) clears bit 0;
# deleted clears bit 1
ADDED = 0x3F
ADDED_IN_TRANSITION = 0x3E
# attributes
NON_VOLATILE = 0x01
BOOTSERVICE_ACCESS = 0x02
RUNTIME_ACCESS = 0x04
TIME_BASED_AUTHENTICATED_WRITE = 0x20


class VarstoreError(MachineryError):
    """The bytes are no OVMF variable store this code can edit, or the variables do not fit."""

    reason = "Invalid"


class Variable:
    """One variable: its vendor GUID (lower-case text), name, attributes and data."""

    def __init__(self, guid, name, attributes, data):
        self.guid = str(guid).lower()
        self.name = name
        self.attributes = attributes
        self.data = bytes(data)

    @property
    def key(self):
        return (self.guid, self.name)

    def record(self):
        """The variable as a new record of the store (no time stamp, count or key: it is not authenticated)."""
        name = (self.name + "\0").encode("utf-16-le")
        header = RECORD_HEADER.pack(START_ID, ADDED, self.attributes, 0, bytes(16), 0, len(name), len(self.data),
                                    uuid.UUID(self.guid).bytes_le)
        return aligned(header + name + self.data)

    def __eq__(self, other):
        return isinstance(other, Variable) and (self.key, self.attributes, self.data) == (
            other.key, other.attributes, other.data)

    def __repr__(self):
        return "Variable(%s-%s, 0x%x, %d bytes)" % (self.name, self.guid, self.attributes, len(self.data))


def aligned(record):
    return record + b"\xff" * (-len(record) % 4)


def _store_bounds(data):
    """(first byte of the records, end of the store) of the variables file ``data``."""
    for offset in range(0, max(len(data) - 64, 0), 1024):
        guid = uuid.UUID(bytes_le=bytes(data[offset + 16:offset + 32]))
        if guid != NV_DATA_VOLUME or data[offset + 40:offset + 44] != VOLUME_SIGNATURE:
            continue
        header_length = struct.unpack_from("<H", data, offset + 48)[0]
        start = offset + header_length
        if start + STORE_HEADER.size > len(data):
            break
        signature, size, fmt, state, _reserved, _reserved1 = STORE_HEADER.unpack_from(data, start)
        if uuid.UUID(bytes_le=signature) != AUTHENTICATED_STORE:
            raise VarstoreError("the variable store is not of the authenticated kind OVMF writes (its GUID is %s)"
                                % uuid.UUID(bytes_le=signature))
        if (fmt, state) != (FORMATTED, HEALTHY) or start + size > len(data):
            raise VarstoreError("the variable store is not formatted and healthy (format 0x%x, state 0x%x, "
                                "%d bytes)" % (fmt, state, size))
        return start + STORE_HEADER.size, start + size
    raise VarstoreError("no UEFI variable store in these %d bytes (no edk2 NV data firmware volume)" % len(data))


def records(data):
    """[(offset, state, Variable, raw record bytes)] of every record of the store, deleted ones included."""
    start, end = _store_bounds(data)
    found = []
    position = start
    while position + RECORD_HEADER.size <= end:
        start_id, state, attributes, _count, _time, _key, name_size, data_size, guid = \
            RECORD_HEADER.unpack_from(data, position)
        if start_id != START_ID:
            break  # erased: the free space
        body = position + RECORD_HEADER.size
        if name_size < 2 or name_size % 2 or body + name_size + data_size > end:
            raise VarstoreError("the variable store is damaged at offset 0x%x (a record of %d + %d bytes)"
                                % (position, name_size, data_size))
        name = bytes(data[body:body + name_size]).decode("utf-16-le", "replace").rstrip("\0")
        value = bytes(data[body + name_size:body + name_size + data_size])
        following = body + name_size + data_size
        following += -following % 4
        found.append((position, state, Variable(uuid.UUID(bytes_le=guid), name, attributes, value),
                      bytes(data[position:min(following, end)])))
        position = following
    return found


def _valid(entries):
    """{(guid, name): (Variable, raw record)} of the valid records among ``entries`` (records()). A record whose
    update was cut off midway (in deleted transition) counts while no newer record of that variable exists, as the
    firmware reads it."""
    found = {}
    for _offset, state, variable, raw in entries:
        if state == ADDED or (state == ADDED_IN_TRANSITION and variable.key not in found):
            found[variable.key] = (variable, raw)
    return found


def variables(data):
    """{(guid, name): Variable} of the valid variables of the store."""
    return {key: variable for key, (variable, _raw) in _valid(records(data)).items()}


def with_variables(data, wanted):
    """The variables file ``data`` with the ``wanted`` Variables set (every other valid variable kept as it is,
    in its order, deleted records dropped); ``data`` itself when they are set already."""
    entries = records(data)
    current = _valid(entries)
    if all(current.get(variable.key, (None,))[0] == variable for variable in wanted):
        return bytes(data)
    start, end = _store_bounds(data)
    replaced = {variable.key for variable in wanted}
    kept = []
    for _offset, _state, variable, raw in entries:
        if variable.key in replaced or current.get(variable.key, (None, None))[1] is not raw:
            continue
        kept.append(raw[:2] + bytes([ADDED]) + raw[3:])  # a cut-off update becomes the variable's record
    body = b"".join(aligned(raw) for raw in kept) + b"".join(variable.record() for variable in wanted)
    if len(body) > end - start:
        raise VarstoreError("the variables need %d bytes and the machine's variable store holds %d"
                            % (len(body), end - start))
    return bytes(data[:start]) + body + b"\xff" * (end - start - len(body)) + bytes(data[end:])
