# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes and NICs attached to a machine after it was created: hot-plug when it runs (live and persistent),
persistent only when it is stopped; detach waits until the guest has really released the device.

Both kinds are kept in the machine's record (with their ephemeral flag), so the machine's deletion knows what
lives and dies with it, and found again in the domain by their ``ua-vol-*`` / ``ua-nic-*`` aliases.
"""

from __future__ import annotations

import re
import time
from xml.sax.saxutils import escape

from ansible_collections.machinery.compute.plugins.module_utils import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils import storage
from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.quantity import format_quantity

DEVICE_PREFIX = {"virtio": "vd", "scsi": "sd", "sata": "sd"}
_DEVICE = re.compile(r"^(vd|sd)[a-z]{1,2}$")
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
POLL = 0.2


class Target:
    """The managed machine a device is attached to: its domain, record and both XML views."""

    def __init__(self, service, name):
        self.service = service
        self.name = check.dns_label(name, "machine")
        dom, tree, record = service.find(self.name)
        if dom is None:
            raise NotFoundError("no machine %s on pool %s" % (self.name, service.ctx.name or service.ctx.uri),
                                "machine")
        if record is None:
            raise ConflictError("%s was not created by machinery.compute (adopt it with the machine module first)"
                                % self.name, "machine")
        self.dom = dom
        self.tree = tree
        self.record = record

    @property
    def running(self):
        return self.dom.isActive()

    def live(self):
        """The domain as it is now: the live XML of a running machine, else its persistent XML, re-read."""
        return dx.parse(self.dom.XMLDesc(0 if self.running else lv.libvirt.VIR_DOMAIN_XML_INACTIVE))

    def flags(self):
        config = lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG
        return config | lv.libvirt.VIR_DOMAIN_AFFECT_LIVE if self.running else config

    def save_record(self):
        self.service._update_record(self.dom, lambda record: record.update(spec=self.record["spec"]))

    def attach(self, xml, what):
        try:
            self.dom.attachDeviceFlags(xml, self.flags())
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot attach %s to %s: %s" % (what, self.name, lv.describe(exc))) from None

    def detach(self, xml, alias, what, timeout):
        """Detach and wait until the live XML no longer shows ``alias`` (the guest may take its time)."""
        was_running = self.running
        try:
            self.dom.detachDeviceFlags(xml, self.flags())
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot detach %s from %s: %s" % (what, self.name, lv.describe(exc))) from None
        if not was_running:
            return
        deadline = time.monotonic() + float(timeout)
        while alias in aliases(self.live()):
            if time.monotonic() > deadline:
                raise MachineryError("the guest of %s did not release %s within %ss; it stays attached until the "
                                     "guest lets go (it is already gone from the persistent configuration)"
                                     % (self.name, what, timeout), "timeout")
            time.sleep(POLL)


def aliases(tree):
    return {disk["alias"] for disk in dx.disks(tree)} | {nic["alias"] for nic in dx.interfaces(tree)}


def disk_xml(path, fmt, device, bus, alias, shareable):
    return ("<disk type='file' device='disk'><driver name='qemu' type='%s'%s/><source file='%s'/>"
            "<target dev='%s' bus='%s'/>%s<alias name='%s'/></disk>"
            % (fmt, " cache='none'" if shareable else " discard='unmap'", escape(path), device, bus,
               "<shareable/>" if shareable else "", alias))


def interface_xml(nic, alias):
    kind = "network" if nic.get("network") else "bridge"
    return ("<interface type='%s'><mac address='%s'/><source %s='%s'/><model type='%s'/><alias name='%s'/>"
            "</interface>" % (kind, nic["mac"], kind, escape(nic[kind]), nic["model"], alias))


def users_of(conn, path, except_machine):
    """Names of the other domains of the pool whose persistent XML uses ``path`` as a disk."""
    users = []
    for dom in conn.listAllDomains(0):
        if dom.name() == except_machine:
            continue
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        if any(disk["path"] == path for disk in dx.disks(tree)):
            users.append(dom.name())
    return sorted(users)


class Attachment:
    """What both kinds of attachment share: the pool, a machine service, check mode."""

    def __init__(self, ctx, check_mode=False):
        self.ctx = ctx
        self.service = MachineService(ctx, check_mode)
        self.check_mode = check_mode


class VolumeAttachment(Attachment):
    def ensure(self, params):
        target = Target(self.service, params.get("machine"))
        name = params.get("volume")
        if not isinstance(name, str) or not _VOLUME_NAME.match(name):
            raise ValidationError("%r is not a volume name (letters, digits, '.', '_' and '-')" % (name,), "volume")
        state = check.one_of(params.get("state") or "attached", ("attached", "detached"), "state")
        alias = dx.volume_alias(name)
        entry = next((vol for vol in target.record["spec"].get("volumes") or [] if vol.get("volume") == name),
                     None)
        result = {"changed": False, "before": {}, "after": {}, "warnings": []}
        if state == "detached":
            if entry is not None:
                self._detach(target, entry, alias, params, result)
            result["volume"] = {"name": name, "state": "Detached"}
            return self._finish(target, result)

        size = check.disk_bytes(params["size"], "size") if params.get("size") is not None else None
        fmt = check.one_of(params.get("format") or "qcow2", ("qcow2", "raw"), "format")
        bus = check.one_of(params.get("bus") or "virtio", ("virtio", "scsi", "sata"), "bus")
        pool = self.ctx.storage
        vol = lv.lookup_volume(pool, name)
        if vol is None and size is None:
            raise NotFoundError("no volume %r in storage pool %s; give size to create it" % (name, pool.name()),
                                "volume")
        if vol is not None:
            fmt = storage.volume_format(vol)
        shareable = bool(params.get("shareable"))
        if shareable and fmt != "raw":
            raise ValidationError("a shareable volume must be raw (qcow2 cannot be written by two guests)",
                                  "shareable")
        if bus == "sata" and target.running and entry is None:
            raise ValidationError("SATA disks cannot be hot-plugged; use virtio or scsi, or stop the machine",
                                  "bus")
        if vol is not None and entry is None:
            users = users_of(self.ctx.conn, vol.path(), target.name)
            if users and not shareable:
                raise ConflictError("volume %s is attached to %s; set shareable: true (raw volumes only) to attach "
                                    "it to more than one machine" % (name, ", ".join(users)), "volume")
        device = self._device(target, entry, params.get("device"), bus)
        if entry is None:
            result["before"] = {}
            result["after"] = {"volume": name, "device": device, "bus": bus,
                               "size": format_quantity(size if vol is None else vol.info()[1])}
            result["changed"] = True
            if not self.check_mode:
                if vol is None:
                    vol = storage.create_volume(pool, name, size, fmt)
                try:
                    if bus == "scsi":
                        self._ensure_scsi_controller(target)
                    target.attach(disk_xml(vol.path(), fmt, device, bus, alias, shareable), "volume " + name)
                except MachineryError:
                    if size is not None and not users_of(self.ctx.conn, vol.path(), ""):
                        storage.delete_volume(pool, name)
                    raise
                entry = {"name": name, "volume": name, "device": device, "bus": bus, "size": vol.info()[1],
                         "ephemeral": bool(params.get("ephemeral")), "source": "attached"}
                target.record["spec"].setdefault("volumes", []).append(entry)
                target.save_record()
        elif size is not None:
            self._grow(target, entry, vol, size, result)
        if entry is not None and params.get("ephemeral") is not None and \
                entry.get("ephemeral") != bool(params["ephemeral"]):
            result["changed"] = True
            result["before"]["ephemeral"] = entry.get("ephemeral")
            result["after"]["ephemeral"] = bool(params["ephemeral"])
            if not self.check_mode:
                entry["ephemeral"] = bool(params["ephemeral"])
                target.save_record()
        result["volume"] = {"name": name, "device": device, "bus": bus,
                            "size": format_quantity(vol.info()[1]) if vol is not None else format_quantity(size),
                            "ephemeral": bool((entry or {}).get("ephemeral", params.get("ephemeral"))),
                            "state": "Attached" if alias in aliases(target.live()) else "Pending"}
        return self._finish(target, result)

    def _finish(self, target, result):
        result["machine"] = self.service.status(target.name)
        return result

    def _device(self, target, entry, wanted, bus):
        taken = {disk["device"] for disk in dx.disks(target.tree) + dx.disks(target.live())}
        if entry is not None:
            if wanted and wanted != entry["device"]:
                raise ConflictError("volume %s is attached as %s; detach it first to move it to %s"
                                    % (entry["volume"], entry["device"], wanted), "device")
            return entry["device"]
        if wanted:
            if not _DEVICE.match(wanted):
                raise ValidationError("%r is not a device name such as vdb or sdb" % wanted, "device")
            if wanted in taken:
                raise ConflictError("device %s of %s is already taken" % (wanted, target.name), "device")
            return wanted
        return dx.device_names(1, taken, DEVICE_PREFIX[bus])[0]

    def _ensure_scsi_controller(self, target):
        if target.tree.find("devices/controller[@type='scsi']") is None:
            target.attach("<controller type='scsi' model='virtio-scsi'/>", "a virtio-scsi controller")

    def _grow(self, target, entry, vol, size, result):
        current = vol.info()[1]
        if size < current:
            result["warnings"].append("volume %s is %s; volumes are never shrunk, size %s was ignored"
                                      % (entry["volume"], format_quantity(current), format_quantity(size)))
            return
        if size == current:
            return
        result["changed"] = True
        result["before"]["size"] = format_quantity(current)
        result["after"]["size"] = format_quantity(size)
        if self.check_mode:
            return
        try:
            if target.running:
                target.dom.blockResize(entry["device"], size, lv.libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
            else:
                vol.resize(size, 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot grow %s to %s: %s"
                                 % (entry["volume"], format_quantity(size), lv.describe(exc)), "size") from None
        entry["size"] = size
        target.save_record()

    def _detach(self, target, entry, alias, params, result):
        result["changed"] = True
        result["before"] = {"volume": entry["volume"], "device": entry["device"]}
        result["after"] = {}
        if self.check_mode:
            return
        disk = next((node for node in target.tree.findall("devices/disk")
                     if node.find("alias") is not None and node.find("alias").get("name") == alias), None)
        if disk is not None:
            target.detach(dx.tostring(disk), alias, "volume %s (%s)" % (entry["volume"], entry["device"]),
                          params.get("timeout") or 30)
        target.record["spec"]["volumes"] = [vol for vol in target.record["spec"].get("volumes") or []
                                            if vol is not entry]
        target.save_record()
        if entry.get("ephemeral"):
            # an ephemeral volume has no life apart from its machine: once detached, nothing would delete it
            storage.delete_volume(self.ctx.storage, entry["volume"])
            result["after"] = {"deleted": entry["volume"]}


class NicAttachment(Attachment):
    def ensure(self, params):
        target = Target(self.service, params.get("machine"))
        name = check.dns_label(params.get("name"), "name")
        state = check.one_of(params.get("state") or "attached", ("attached", "detached"), "state")
        alias = dx.nic_alias(name)
        nics = target.record["spec"].setdefault("network_interfaces", [])
        entry = next((nic for nic in nics if nic["name"] == name), None)
        result = {"changed": False, "before": {}, "after": {}, "warnings": []}
        if state == "detached":
            if entry is not None:
                result.update(changed=True, before={"name": name, "mac": entry["mac"]}, after={})
                if not self.check_mode:
                    node = next((node for node in target.tree.findall("devices/interface")
                                 if node.find("alias") is not None and node.find("alias").get("name") == alias),
                                None)
                    if node is not None:
                        target.detach(dx.tostring(node), alias, "NIC %s (%s)" % (name, entry["mac"]),
                                      params.get("timeout") or 30)
                    target.record["spec"]["network_interfaces"] = [nic for nic in nics if nic is not entry]
                    target.save_record()
            result["network_interface"] = {"name": name, "state": "Detached"}
            result["machine"] = self.service.status(target.name)
            return result

        if bool(params.get("network")) == bool(params.get("bridge")):
            raise ValidationError("give exactly one of network or bridge", "network")
        if params.get("network") and self.ctx.network(params["network"]) is None:
            raise NotFoundError("no network %r on pool %s" % (params["network"], self.ctx.name or self.ctx.uri),
                                "network")
        mac = check.mac_address(params["mac"], "mac") if params.get("mac") else dx.derive_mac(target.name, name)
        model = check.one_of(params.get("model") or "virtio", ("virtio", "e1000e", "rtl8139"), "model")
        wanted = {"name": name, "network": params.get("network"), "bridge": params.get("bridge"), "mac": mac,
                  "model": model, "ephemeral": True}
        if entry is not None:
            differs = [key for key in ("network", "bridge", "mac", "model") if entry.get(key) != wanted[key]]
            if differs:
                raise ConflictError("NIC %s of %s is attached with a different %s; detach it first"
                                    % (name, target.name, ", ".join(differs)), differs[0])
        else:
            self._check_mac(target, mac, params.get("network"))
            added = {key: value for key, value in wanted.items() if value is not None}
            result.update(changed=True, before={}, after=added)
            if not self.check_mode:
                target.attach(interface_xml(wanted, alias), "NIC " + name)
                nics.append(wanted)
                target.save_record()
                entry = wanted
        if not self.check_mode and params.get("wait") == "address" and wanted.get("network"):
            self.service.wait(target.dom, {"name": target.name, "network_interfaces": [wanted]},
                              {"wait": "address", "wait_timeout": params.get("wait_timeout") or 300})
        machine = self.service.status(target.name)
        shown = next((nic for nic in machine.get("network_interfaces") or [] if nic["name"] == name),
                     dict(wanted, ip_addresses=[], state="Pending"))
        if entry is not None and alias not in aliases(target.live()):
            shown = dict(shown, state="Pending")
        result["network_interface"] = shown
        result["machine"] = machine
        return result

    def _check_mac(self, target, mac, network):
        for dom in self.ctx.conn.listAllDomains(0):
            tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
            for nic in dx.interfaces(tree):
                if (nic["mac"] or "").lower() == mac and (network is None or nic["network"] == network):
                    where = nic["network"] or nic["bridge"]
                    raise ConflictError("MAC %s is already used by %s on %s" % (mac, dom.name(), where), "mac")
