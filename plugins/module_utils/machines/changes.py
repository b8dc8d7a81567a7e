# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Changing an existing machine in place: owned fields in its persistent definition and, where libvirt can, live; its
security groups; its fixed addresses; its boot files."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import capabilities as cap
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.machines import seed
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import (
    observe_reservations, release_address, reserve_address)
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer


def live_effects(names, spec, observed, restarting=False):
    """(fields a running guest only takes at its next start, warnings) for an update of ``names``; when the
    update is ``restarting`` the machine (a resize), the restart takes them all and none is left pending."""
    pending, warnings = [], []
    for name in names:
        live = options.OWNED_BY_NAME[name].live
        if live == "restart":
            pending.append(name)
        elif live == "balloon" and spec[name] > (observed.live_max_memory or 0):
            pending.append(name)
        elif live == "boot":
            warnings.append("the new boot configuration is read by the guest at its next first boot")
        elif live == "network":
            # the reservation changes at once; the guest asks for an address again when it starts
            pending.append(name)
    if restarting:
        return [], [note for note in warnings if "next first boot" in note]
    if pending:
        warnings.append("%s of the running machine %s take effect at its next restart"
                        % (" and ".join(pending), spec["name"]))
    return pending, warnings


class Changes:
    """How MachineResource changes an existing machine. It uses the resource's ctx, conn, name, spec, warnings,
    _define and check_resize_room, and keeps what a resize replaced in its resize_backup."""

    def _adopt(self, action, observed):
        tree = dx.parse(observed.dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
        dx.write_record(tree, action.data["record"])
        self._define(tree, "adopt")

    def _update(self, action, observed):
        spec = self.spec
        dom = observed.dom
        original = dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)
        tree = dx.parse(original)  # fresh: an adopt may precede
        record = dx.read_record(tree)
        record["spec"] = dict(record["spec"])
        if "boot_config" in action.fields:
            self._rewrite_boot_files(record)
        qos_before = cap.read_disk_qos(tree, record)
        options.apply_fields(tree, record, spec, action.fields)
        if "ip_reservations" in action.fields:
            observe_reservations(self.conn, record)  # what the networks hold now
            self._reserve(record, spec["ip_reservations"])
        if action.data.get("resize"):
            # what a failed restart or start puts back (see MachineResource._undo_resize)
            self.resize_backup = {"xml": original, "running": bool(dom.isActive()),
                                  "fields": [key for key in action.fields if key in ("cpu", "memory")]}
        if action.data.get("grows"):
            # the room is checked again under the pool's admission lock: no concurrent run books it meanwhile
            with Admission(self.ctx, [], self.name):
                self.check_resize_room(action.data["grows"], locked=True)
                self._define(tree, "redefine")
        else:
            self._define(tree, "redefine")
        if dom.isActive():
            self._set_live(dom, record, action.fields, observed)
            if "disk_qos" in action.fields:
                self._set_iotune(dom, record, cap.changed_disks(qos_before, spec["disk_qos"]))

    def _reserve(self, record, wanted):
        """Make the networks hold exactly ``wanted`` ({nic: address}) for the machine's NICs."""
        for nic in record["spec"].get("network_interfaces") or []:
            if nic.get("network") and wanted.get(nic["name"]) != nic.get("ip_address"):
                if nic.get("ip_address"):
                    release_address(self.ctx, nic)
                nic["ip_address"] = wanted.get(nic["name"])
                if nic["ip_address"]:
                    reserve_address(self.ctx, nic, self.name)

    def _set_iotune(self, dom, record, names):
        """QoS limits of a running machine's disks, live (the persistent XML was defined already)."""
        devices = {vol["name"]: vol["device"] for vol in record["spec"].get("volumes") or []}
        for name in names:
            try:
                writer.write(dom, "setBlockIoTune", devices[name], cap.iotune_values(self.spec["disk_qos"].get(name)),
                             lv.libvirt.VIR_DOMAIN_AFFECT_LIVE)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot set the QoS of volume %s of %s live: %s"
                                     % (name, self.name, lv.describe(exc)), "volumes") from None

    def _update_security_groups(self, action, observed):
        """Groups change live: a NIC that keeps a filter gets it redefined (libvirt re-applies it to the running
        guest); one that gains or loses its filter has its interface updated, live and persistent."""
        dom = observed.dom
        for nic, (before, after) in action.data["changes"].items():
            filter_name = sgs.nic_filter(self.name, nic)
            if after:
                sgs.define_nic_filter(self.conn, self.name, nic, after)
            if bool(before) != bool(after):
                self._set_filterref(dom, nic, filter_name if after else None)
            if not after:
                sgs.undefine_filter(self.conn, filter_name)

        def record_groups(record):
            for entry in record["spec"].get("network_interfaces") or []:
                if entry["name"] in action.data["changes"]:
                    entry["security_groups"] = action.data["changes"][entry["name"]][1]
        update_record(dom, record_groups)

    def _set_filterref(self, dom, nic, filter_name):
        alias = dx.nic_alias(nic)
        views = [(lv.libvirt.VIR_DOMAIN_XML_INACTIVE, lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG)]
        if dom.isActive():
            views.append((0, lv.libvirt.VIR_DOMAIN_AFFECT_LIVE))
        for xml_flags, affect in views:
            tree = dx.parse(dom.XMLDesc(xml_flags))
            node = next((node for node in tree.findall("devices/interface")
                         if node.find("alias") is not None and node.find("alias").get("name") == alias), None)
            if node is None:
                continue
            elements.set_filterref(node, filter_name)
            try:
                writer.write(dom, "updateDeviceFlags", elements.to_string(node), affect)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot update the security groups of NIC %s of %s: %s"
                                     % (nic, self.name, lv.describe(exc)),
                                     "network_interfaces") from None

    def _set_crash_action(self, dom):
        """The running guest's on_crash follows its new run strategy at once (the definition has it already)."""
        actions = {"restart": lv.libvirt.VIR_DOMAIN_LIFECYCLE_ACTION_RESTART,
                   "destroy": lv.libvirt.VIR_DOMAIN_LIFECYCLE_ACTION_DESTROY}
        try:
            dom.setLifecycleAction(lv.libvirt.VIR_DOMAIN_LIFECYCLE_CRASH,
                                   actions[dx.crash_action(self.spec["run_strategy"])],
                                   lv.libvirt.VIR_DOMAIN_AFFECT_LIVE)
        except lv.libvirt.libvirtError as exc:
            self.warnings.append("the run strategy of the running machine %s reaches its crash handling at its "
                                 "next start: %s" % (self.name, lv.describe(exc)))

    def _rewrite_boot_files(self, record):
        files = record["spec"].get("files") or {}
        pool = self.ctx.storage
        if "ignition_data" in self.spec and files.get("ignition"):
            storage.write_secret_volume(self.conn, pool, files["ignition"], self.spec["ignition_data"])
        if "seed_files" in self.spec and files.get("seed"):
            # the instance id stays the one the machine's root was made with (a rebuild's): cloud-init in the guest
            # reads the new seed at its next first boot only
            given = seed.with_generation(self.spec["seed_files"], self.name, int(record.get("rebuilds") or 0))
            storage.write_secret_volume(self.conn, pool, files["seed"], seed.nocloud_iso(given))

    def _set_live(self, dom, record, names, observed):
        """Carry the change into the running guest where libvirt can; the rest waits for a restart."""
        live = lv.libvirt.VIR_DOMAIN_AFFECT_LIVE
        try:
            writer.write(dom, "setMetadata", lv.libvirt.VIR_DOMAIN_METADATA_ELEMENT, dx.record_xml(record), dx.PREFIX,
                         dx.NAMESPACE, live)
        except lv.libvirt.libvirtError:
            pass
        pending, _notes = live_effects(names, self.spec, observed)
        if "run_strategy" in names:
            self._set_crash_action(dom)
        if "memory" in names and "memory" not in pending:
            try:
                writer.write(dom, "setMemoryFlags", self.spec["memory"] // 1024, live)
            except lv.libvirt.libvirtError:
                pending.append("memory")
                self.warnings.append("memory of the running machine %s takes effect at its next restart"
                                     % self.name)
        self.restart_required = self.restart_required or bool(pending)
