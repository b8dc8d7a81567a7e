# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's TPM state carried by a cold move, through the libvirt connections alone.

libvirt keeps the state of an emulated TPM in a directory of its own per domain (``/var/lib/libvirt/swtpm/
<uuid>/tpm2``), outside any storage pool, and a live move carries it in QEMU's migration stream. A cold move
defines the machine on the target with the same UUID, and libvirt would make it a new TPM (new seeds: whatever
was sealed to the old one is lost) at its first start there. So the files of that directory are copied before:
a transient ``dir`` storage pool over the directory on each side makes them volumes, downloaded from the source
and uploaded to the target (the target's directory built by the pool). libvirt hands them to the swtpm user when
it starts the machine. The source's copy goes with the source's definition, as before.
"""

from __future__ import annotations

import contextlib

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

# where libvirt's QEMU driver keeps each domain's TPM state (its build's default local state directory)
SWTPM_DIR = "/var/lib/libvirt/swtpm"
# files swtpm holds while it runs, not state
SKIPPED = (".lock",)


def state_dir(uuid):
    return "%s/%s/tpm2" % (SWTPM_DIR, uuid)


def has_emulated_tpm(tree):
    return tree.find("devices/tpm/backend[@type='emulator']") is not None


@contextlib.contextmanager
def state_pool(conn, uuid, build=False):
    """A transient dir storage pool over the TPM state directory of ``uuid`` (made first with ``build``); None when
    the directory is not there (a machine never started has no TPM state yet)."""
    xml = elements.to_string(elements.storage_pool("machinery-tpm-%s" % uuid[:13], state_dir(uuid), "0700"))
    flags = lv.libvirt.VIR_STORAGE_POOL_CREATE_WITH_BUILD if build else 0
    try:
        pool = writer.write(conn, "storagePoolCreateXML", xml, flags)
    except lv.libvirt.libvirtError as exc:
        if build:
            raise LibvirtFailure("cannot make the TPM state directory %s: %s" % (state_dir(uuid), lv.describe(exc))) \
                from None
        yield None
        return
    try:
        yield pool
    finally:
        try:
            writer.write(pool, "destroy")
        except lv.libvirt.libvirtError:
            pass  # a transient pool gone already


def read(conn, uuid):
    """{file name: bytes} of the TPM state of domain ``uuid`` on the host of ``conn`` (empty when it has none yet)."""
    with state_pool(conn, uuid) as pool:
        if pool is None:
            return {}
        return {vol.name(): storage.download_bytes(conn, vol) for vol in pool.listAllVolumes(0)
                if not vol.name().endswith(SKIPPED)}


def write(conn, uuid, files):
    """Make ``files`` ({name: bytes}) the whole TPM state of domain ``uuid`` on the host of ``conn``: the directory
    is made when missing, and a state file not among ``files`` is deleted. The machine must be off (swtpm not
    running)."""
    with state_pool(conn, uuid, build=True) as pool:
        for vol in pool.listAllVolumes(0):
            if vol.name() not in files and not vol.name().endswith(SKIPPED):
                storage.delete_volume(pool, vol.name())
        for name, data in sorted(files.items()):
            storage.delete_volume(pool, name)
            vol = storage.create_volume(pool, name, max(len(data), 1), "raw", mode="0600")
            storage.upload_bytes(conn, vol, data)


def carry(source_conn, target_conn, uuid):
    """Copy the TPM state of domain ``uuid`` from the source's host to the target's. Returns the names of the files
    copied (none when the source has no state yet)."""
    files = read(source_conn, uuid)
    if files:
        write(target_conn, uuid, files)
    return sorted(files)
