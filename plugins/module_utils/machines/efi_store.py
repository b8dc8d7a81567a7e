# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A UEFI machine's variables (``efi_vars``) read from and written to its store, through the libvirt connection.

The store is the volume ``<machine>-nvram.fd`` of the pool's storage (firmware.place_nvram). Its bytes travel over
the connection (a volume download and upload, as backups and the TPM state do), and are edited here on the
controller (core/varstore.py). QEMU holds the file as the machine's flash while it runs, and the firmware keeps
its variables in memory too: a write under it would be lost or would damage the store. So the store is written
only while the machine is off (not running, paused or suspended): the plan writes it then, or with the shutdown
of a restart, rebuild or stop of the same run, and otherwise reports the change as waiting for the machine to be
off (machine.py, efi_vars_plan).

A machine never started has no store yet: libvirt copies the firmware's variables template (the one its firmware
auto-selection picked) at the first start. The write starts the machine paused, which makes libvirt create the
store from that template while no instruction of the guest runs, and powers it off again.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import varstore
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.core.firmware import stored_nvram
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

FIELD = "efi_vars"


def store_volume(ctx, tree, name):
    """The name of the volume holding the machine's variables; refused for a machine whose variables are kept
    outside the pool's storage (made before they were kept there) or that has no UEFI firmware."""
    volume = stored_nvram(tree, ctx.storage_path)
    if volume is None:
        raise ConflictError("%s keeps its UEFI variables outside the pool's storage (%s): they are not written "
                            "here; recreate the machine to have them kept as a volume"
                            % (name, (tree.findtext("os/nvram") or "no variables file").strip()), FIELD)
    return volume


def lookup_store(ctx, volume):
    """The store's volume, or None when there is none yet. libvirt makes the file at a start, behind the storage
    pool's back: the pool is rescanned before it is said to be missing."""
    vol = lv.lookup_volume(ctx.storage, volume)
    if vol is None:
        storage.refresh(ctx.storage)
        vol = lv.lookup_volume(ctx.storage, volume)
    return vol


def read(ctx, tree, name):
    """{(guid, name): varstore.Variable} of the machine's store, or None when it has none yet."""
    vol = lookup_store(ctx, store_volume(ctx, tree, name))
    if vol is None:
        return None
    data = storage.download_bytes(ctx.conn, vol)
    try:
        return varstore.variables(data)
    except varstore.VarstoreError as exc:
        raise varstore.VarstoreError("the UEFI variables of %s (%s): %s" % (name, vol.name(), exc.message),
                                     FIELD) from None


def write(ctx, dom, name, entries):
    """Set ``entries`` (normalized efi_vars) in the store of the machine of ``dom`` and keep them in its record.
    The store is only written while the machine is off. Returns whether its bytes changed."""
    tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    volume = store_volume(ctx, tree, name)
    vol = lookup_store(ctx, volume) or _first_store(ctx, dom, name, volume)
    data = storage.download_bytes(ctx.conn, vol)
    try:
        edited = varstore.with_variables(data, efi.as_variables(entries))
    except varstore.VarstoreError as exc:
        raise varstore.VarstoreError("the UEFI variables of %s (%s): %s" % (name, volume, exc.message),
                                     FIELD) from None
    if edited != data:
        if dom.isActive():  # planned while it was off: another run or a person started it since
            raise ConflictError("%s was started while its UEFI variables were to be written; nothing was written"
                                % name, FIELD)
        storage.upload_bytes(ctx.conn, vol, edited)

    def keep(record):
        record["spec"]["efi_vars"] = [dict(entry) for entry in entries]
    update_record(dom, keep)
    return edited != data


def _first_store(ctx, dom, name, volume):
    """The store libvirt makes from the firmware's template at a start: the machine is started paused (no guest
    instruction runs, so the firmware writes nothing) and powered off again."""
    try:
        writer.write(dom, "createWithFlags", lv.libvirt.VIR_DOMAIN_START_PAUSED)
        writer.write(dom, "destroy")
    except lv.libvirt.libvirtError as exc:
        try:
            if dom.isActive():
                writer.write(dom, "destroy")
        except lv.libvirt.libvirtError:
            pass  # the cause below is the one to report
        raise LibvirtFailure("cannot have libvirt make the UEFI variable store of %s (a paused start): %s"
                             % (name, lv.describe(exc)), FIELD) from None
    vol = lookup_store(ctx, volume)
    if vol is None:
        raise LibvirtFailure("libvirt made no UEFI variable store %s for %s at its start" % (volume, name), FIELD)
    return vol


class EfiVariables:
    """How MachineResource writes the variables. It uses the resource's ctx, name, defined and spec."""

    def _write_efi_vars(self, action, _observed):
        dom = self.defined or lv.lookup_domain(self.conn, self.name)
        self.write_efi_vars(dom, action)

    def write_efi_vars(self, dom, action):
        """The variables an action carries (its ``efi_vars``), written into the store of the stopped ``dom``;
        only the record when the store holds them already."""
        entries = action.data.get("efi_vars")
        if entries is not None:
            write(self.ctx, dom, self.name, entries)
