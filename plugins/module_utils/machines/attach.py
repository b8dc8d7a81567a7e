# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Volumes and NICs attached to a machine after it was created, converged through observe -> plan -> apply.

Hot-plug when the machine runs (live and persistent), persistent only when it is stopped; detach waits until
the guest has really released the device, asking it again while it waits (a guest still booting may miss the
first request). Both kinds are kept in the machine's record (with their ephemeral flag), so the machine's
deletion knows what lives and dies with it, and found again in the domain by their ``ua-vol-*`` / ``ua-nic-*``
aliases.
"""

from __future__ import annotations

import re
import time

from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import missing_machine
from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_storage, storage_room
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import host_bridge
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import lease_expiries, wait_for_address
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import observe_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
POLL = 0.2
RESEND_SECONDS = 3.0


def aliases(tree):
    return {disk["alias"] for disk in elements.read_disks(tree)} | \
        {nic["alias"] for nic in elements.read_interfaces(tree)}


def observe_target(conn, name, pool_name):
    """The managed machine a device goes to: its observation plus the view of the running guest (``live``)."""
    observed = observe_machine(conn, name)
    if not observed.exists:
        raise NotFoundError("no machine %s on pool %s" % (name, pool_name), "machine")
    if not observed.managed:
        raise ConflictError("%s was not created by machinery.compute (adopt it with the machine module first)"
                            % name, "machine")
    observed.live = dx.parse(observed.dom.XMLDesc(0)) if observed.active else observed.tree
    return observed


class Attachment(Resource):
    """What both kinds share: the target machine, flags for attach/detach, the record, the return."""

    entry_key = None  # the record's list: volumes or network_interfaces
    alias = None

    TABLE = ()  # the module's options (options.VOLUME_ATTACH, options.NIC_ATTACH): their defaults apply

    def __init__(self, ctx, params, check_mode=False):
        self.ctx = ctx
        self.conn = ctx.conn
        self.params = params = options.defaulted(self.TABLE, params)
        self.check_mode = check_mode
        self.machine = check.dns_label(params.get("machine"), "machine")
        self.state = check.one_of(params["state"], options.ATTACH_STATES, "state")
        check.timeout_seconds(params["timeout"], "timeout")
        self.warnings = []

    def describe(self):
        return "%s of machine %s" % (self.entry_key, self.machine)

    def holds(self, plan, observed):
        """The target machine: a device goes in or out of it."""
        return [self.ctx.coordination.of(self.ctx, self.machine)]

    def missing(self, exc):
        """No such machine on the pool: a move taking it away names itself (holds.missing_machine)."""
        return missing_machine(self.ctx, self.machine, exc)

    def observe_target(self):
        return observe_target(self.conn, self.machine, self.ctx.name or self.ctx.uri)

    @staticmethod
    def flags(observed):
        config = lv.libvirt.VIR_DOMAIN_AFFECT_CONFIG
        return config | lv.libvirt.VIR_DOMAIN_AFFECT_LIVE if observed.dom.isActive() else config

    def attach_device(self, observed, element, what):
        try:
            writer.write(observed.dom, "attachDeviceFlags", elements.to_string(element), self.flags(observed))
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot attach %s to %s: %s" % (what, self.machine, lv.describe(exc))) from None

    def detach_device(self, observed, alias, what):
        """Detach the device ``alias`` and wait until the running guest no longer has it, asking again every few
        seconds: a guest that was still booting may have missed the first request."""
        tree = observed.tree
        node = next((node for node in tree.iter("disk", "interface")
                     if node.find("alias") is not None and node.find("alias").get("name") == alias), None)
        if node is None:
            return
        xml = elements.to_string(node)
        dom = observed.dom
        running = dom.isActive()
        try:
            writer.write(dom, "detachDeviceFlags", xml, self.flags(observed))
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot detach %s from %s: %s" % (what, self.machine, lv.describe(exc))) from None
        if not running:
            return
        timeout = float(check.timeout_seconds(self.params["timeout"], "timeout"))
        deadline = time.monotonic() + timeout
        asked = time.monotonic()
        while dom.isActive() and alias in aliases(dx.parse(dom.XMLDesc(0))):
            if time.monotonic() > deadline:
                raise MachineryError("the guest of %s did not release %s within %ss; it stays attached until the "
                                     "guest lets go (it is already gone from the persistent configuration)"
                                     % (self.machine, what, timeout), "timeout")
            if time.monotonic() - asked > RESEND_SECONDS:
                asked = time.monotonic()
                try:
                    writer.write(dom, "detachDeviceFlags", xml, lv.libvirt.VIR_DOMAIN_AFFECT_LIVE)
                except lv.libvirt.libvirtError:
                    pass  # gone meanwhile, or a request still in flight: the loop checks again
            time.sleep(POLL)

    def save_entries(self, observed, change):
        """Change this kind's list in the machine's record (persistent and live metadata)."""
        def edit(record):
            record["spec"][self.entry_key] = change(list(record["spec"].get(self.entry_key) or []))
        update_record(observed.dom, edit)

    def converge(self):
        plan, observed = converge(self, self.check_mode)
        before, after = plan.diff()
        return {"changed": plan.changed, "before": before, "after": after, "actions": plan.summaries(),
                "plan": plan.as_list(), "warnings": plan.warnings + self.warnings, "observed": observed}

    def apply(self, action, observed):
        """Both kinds observe (the target machine, what else they need): their methods take the target."""
        self.applier(action.handler)(self, action, observed[0])


# --- volumes ----------------------------------------------------------------------------------------------------

def plan_volume(params, observed, volume):
    """The volume attachment's plan: pure, from the parameters, the target and the volume (``observe``)."""
    name = params["volume"]
    storage.check_attachable(name, "volume")
    entry = next((vol for vol in observed.record["spec"].get("volumes") or [] if vol.get("volume") == name), None)
    # a disk the machine module made is aliased by its name in the machine's spec (ua-vol-data), one attached
    # here by its volume's name
    alias = dx.volume_alias(entry["name"] if entry is not None else name)
    if params.get("state") == "detached":
        if entry is None:
            return Plan(volume_state={"name": name, "state": "Detached"})
        after = {"deleted": name} if entry.get("ephemeral") else {}
        steps = [step("detach_device", alias), step("write_record", observed.name)]
        if entry.get("ephemeral"):
            steps.append(step("delete_volume", name))
        return Plan([Action("detach", name, {"volume": name, "device": entry["device"]}, after, steps,
                            entry=entry, alias=alias)], volume_state={"name": name, "state": "Detached"})
    size = check.disk_bytes(params["size"], "size") if params.get("size") is not None else None
    fmt = check.one_of(params["format"], options.VOLUME_FORMATS, "format")
    if params.get("bus"):
        bus = check.one_of(params["bus"], options.DISK_BUSES, "bus")
        if entry is not None and entry.get("bus") and bus != entry["bus"]:
            raise ConflictError("volume %s is attached on bus %s; detach it first to move it to %s"
                                % (name, entry["bus"], bus), "bus")
    else:  # left out: the attached disk's bus (virtio for a new one)
        bus = (entry or {}).get("bus") or options.initial(options.VOLUME_ATTACH, "bus")
    if volume is None and size is None:
        raise NotFoundError("no volume %r in storage pool %s; give size to create it"
                            % (name, params["storage_pool"]), "volume")
    if volume is not None:
        fmt = volume["format"]
    shareable = bool(params.get("shareable"))
    if shareable and fmt != "raw":
        raise ValidationError("a shareable volume must be raw (qcow2 cannot be written by two guests)", "shareable")
    if bus == "sata" and observed.active and entry is None:
        raise ValidationError("SATA disks cannot be hot-plugged; use virtio or scsi, or stop the machine", "bus")
    disk = next((disk for disk in elements.read_disks(observed.tree)
                 if volume is not None and disk["path"] == volume["path"]), None)
    if entry is None and disk is not None:
        if disk["alias"] != alias:
            raise ConflictError("volume %s is already a disk of %s" % (name, observed.name), "volume")
        # an attach of this name killed after its disk was defined, before the record was written: finish it
        after = {"volume": name, "device": disk["device"], "bus": disk["bus"],
                 "size": format_quantity(volume["capacity"])}
        return Plan([Action("attach", name, {}, after, [step("write_record", observed.name)], handler="record_disk",
                            device=disk["device"], bus=disk["bus"], ephemeral=bool(params.get("ephemeral")))],
                    volume_state=dict(after, name=name, ephemeral=bool(params.get("ephemeral")),
                                      state="Attached" if alias in aliases(observed.live) else "Pending"))
    if volume is not None and entry is None and volume["users"] and not shareable:
        raise ConflictError("volume %s is attached to %s; set shareable: true (raw volumes only) to attach it to "
                            "more than one machine" % (name, ", ".join(volume["users"])), "volume")
    device = _device(observed, entry, params.get("device"), bus)
    actions = []
    warnings = []
    current_size = volume["capacity"] if volume is not None else size
    if entry is None:
        steps = [] if volume is not None else [step("create_volume", name, size=size, format=fmt)]
        needs_controller = bus == "scsi" and observed.tree.find("devices/controller[@type='scsi']") is None
        if needs_controller:
            steps.append(step("attach_controller", "virtio-scsi"))
        steps += [step("attach_device", alias), step("write_record", observed.name)]
        actions.append(Action("attach", name, {}, {"volume": name, "device": device, "bus": bus,
                                                   "size": format_quantity(current_size)}, steps,
                              size=size, fmt=fmt, bus=bus, device=device, alias=alias, shareable=shareable,
                              created=volume is None, controller=needs_controller,
                              ephemeral=bool(params.get("ephemeral"))))
    elif size is not None and size < current_size:
        warnings.append("volume %s is %s; volumes are never shrunk, size %s was ignored"
                        % (name, format_quantity(current_size), format_quantity(size)))
    elif size is not None and size > current_size:
        actions.append(Action("grow", name, {"size": format_quantity(current_size)}, {"size": format_quantity(size)},
                              [step("resize", name, size=size)], size=size, device=entry["device"]))
    if entry is not None and params.get("ephemeral") is not None and entry.get("ephemeral") != params["ephemeral"]:
        actions.append(Action("set_ephemeral", name, {"ephemeral": entry.get("ephemeral")},
                              {"ephemeral": bool(params["ephemeral"])}, [step("write_record", observed.name)]))
    shown = {"name": name, "device": device, "bus": bus,
             "size": format_quantity(current_size),
             "ephemeral": bool((entry or {}).get("ephemeral", params.get("ephemeral"))),
             "state": "Attached" if alias in aliases(observed.live) else "Pending"}
    return Plan(actions, warnings, volume_state=shown)


def _device(observed, entry, wanted, bus):
    taken = {disk["device"] for disk in elements.read_disks(observed.tree) + elements.read_disks(observed.live)}
    if entry is not None:
        if wanted and wanted != entry["device"]:
            raise ConflictError("volume %s is attached as %s; detach it first to move it to %s"
                                % (entry["volume"], entry["device"], wanted), "device")
        return entry["device"]
    if wanted:
        check.device_name(wanted, bus, "device")
        if wanted in taken:
            raise ConflictError("device %s of %s is already taken" % (wanted, observed.name), "device")
        return wanted
    return dx.device_names(1, taken, check.DEVICE_PREFIX[bus])[0]


class VolumeAttachment(Attachment):
    TABLE = options.VOLUME_ATTACH
    entry_key = "volumes"

    def __init__(self, ctx, params, check_mode=False):
        super().__init__(ctx, params, check_mode)
        name = params.get("volume")
        if not isinstance(name, str) or not _VOLUME_NAME.match(name):
            raise ValidationError("%r is not a volume name (letters, digits, '.', '_' and '-')" % (name,), "volume")
        self.volume_name = name

    def observe(self):
        target = self.observe_target()
        pool = self.ctx.storage
        vol = lv.lookup_volume(pool, self.volume_name)
        volume = None
        if vol is not None:
            volume = {"path": vol.path(), "format": storage.volume_format(vol), "capacity": vol.info()[1],
                      "users": storage.users_of(self.conn, vol.path(), self.machine)}
        return target, volume

    def plan(self, observed):
        target, volume = observed
        plan = plan_volume(dict(self.params, storage_pool=self.ctx.storage.name()), target, volume)
        attach, grow = plan.find("attach"), plan.find("grow")
        if attach is not None and attach.data.get("created"):  # refused in check mode too
            check_storage(self.ctx, [("size", attach.data["size"])])
        elif grow is not None:
            check_storage(self.ctx, [("size", grow.data["size"] - volume["capacity"])])
        return plan

    def _attach(self, action, target):
        data = action.data
        pool = self.ctx.storage
        # a new volume is counted against the storage's room and made under the pool's admission lock, until its
        # machine's definition counts it
        with storage_room(self.ctx, [("size", data["size"])] if data["created"] else []):
            vol = lv.lookup_volume(pool, action.target)
            if vol is None:
                vol = storage.create_volume(pool, action.target, data["size"], data["fmt"])
            try:
                if data["controller"]:
                    self.attach_device(target, elements.controller("scsi", "virtio-scsi"),
                                       "a virtio-scsi controller")
                self.attach_device(target, elements.disk(vol.path(), data["fmt"], data["device"], data["bus"],
                                                         data["alias"], shareable=data["shareable"]),
                                   "volume " + action.target)
            except MachineryError:
                if data["created"] and not storage.users_of(self.conn, vol.path(), ""):
                    storage.delete_volume(pool, action.target)  # only a volume this run created
                raise
            self._record_disk(action, target)

    def _record_disk(self, action, target):
        data = action.data
        vol = lv.lookup_volume(self.ctx.storage, action.target)
        entry = {"name": action.target, "volume": action.target, "device": data["device"], "bus": data["bus"],
                 "size": vol.info()[1], "ephemeral": data["ephemeral"], "source": "attached"}
        self.save_entries(target, lambda entries: entries + [entry])

    def _grow(self, action, target):
        size = action.data["size"]
        vol = lv.lookup_volume(self.ctx.storage, action.target)
        with storage_room(self.ctx, [("size", size - vol.info()[1])]):
            try:
                if target.dom.isActive():
                    writer.write(target.dom, "blockResize", action.data["device"], size, lv.libvirt.VIR_DOMAIN_BLOCK_RESIZE_BYTES)
                else:
                    writer.write(vol, "resize", size, 0)
            except lv.libvirt.libvirtError as exc:
                raise LibvirtFailure("cannot grow %s to %s: %s"
                                     % (action.target, format_quantity(size), lv.describe(exc)), "size") from None
            self.save_entries(target, lambda entries: [dict(entry, size=size) if entry.get("volume") == action.target
                                                       else entry for entry in entries])

    def _set_ephemeral(self, action, target):
        flag = action.after["ephemeral"]
        self.save_entries(target, lambda entries: [dict(vol, ephemeral=flag) if vol.get("volume") == action.target
                                                   else vol for vol in entries])

    def _detach(self, action, target):
        entry = action.data["entry"]
        self.detach_device(target, action.data["alias"], "volume %s (%s)" % (entry["volume"], entry["device"]))
        self.save_entries(target, lambda entries: [vol for vol in entries if vol.get("volume") != action.target])
        if entry.get("ephemeral"):
            # an ephemeral volume has no life apart from its machine: once detached, nothing would delete it
            storage.delete_volume(self.ctx.storage, entry["volume"])

    APPLY = {"attach": _attach, "record_disk": _record_disk, "grow": _grow, "set_ephemeral": _set_ephemeral,
             "detach": _detach}

    def ensure(self):
        result = self.converge()
        target, volume = result.pop("observed")
        result["volume"] = plan_volume(dict(self.params, storage_pool=self.ctx.storage.name()), target,
                                       volume).facts["volume_state"] if self.state == "attached" else \
            {"name": self.volume_name, "state": "Detached"}
        result["machine"] = MachineService(self.ctx).status(self.machine)
        return result


# --- NICs -------------------------------------------------------------------------------------------------------

def plan_nic(params, observed, mac_users):
    """The NIC attachment's plan: pure, from the parameters, the target and who uses which MAC (``observe``)."""
    name = params["name"]
    alias = dx.nic_alias(name)
    entry = next((nic for nic in observed.record["spec"].get("network_interfaces") or [] if nic["name"] == name),
                 None)
    if params.get("state") == "detached":
        if entry is None:
            return Plan()
        return Plan([Action("detach", name, {"name": name, "mac": entry["mac"]}, {},
                            [step("detach_device", alias), step("write_record", observed.name)], entry=entry,
                            alias=alias)])
    if bool(params.get("network")) == bool(params.get("bridge")):
        raise ValidationError("give exactly one of network or bridge", "network")
    if params.get("network") and not params["network_exists"]:
        raise NotFoundError("no network %r on pool %s" % (params["network"], params["pool_name"]), "network")
    # mac and model left out keep what an attached NIC has (a new one gets the derived MAC and virtio)
    if params.get("mac"):
        mac = check.mac_address(params["mac"], "mac")
    else:
        mac = entry["mac"] if entry is not None else dx.derive_mac(observed.name, name)
    if params.get("model"):
        model = check.one_of(params["model"], options.NIC_MODELS, "model")
    else:
        model = (entry or {}).get("model") or options.initial(options.NIC_ATTACH, "model")
    wanted = {"name": name, "network": params.get("network"), "bridge": params.get("bridge"), "mac": mac,
              "model": model, "ephemeral": True}
    if entry is not None:
        differs = [key for key in ("network", "bridge", "mac", "model") if entry.get(key) != wanted[key]]
        if differs:
            raise ConflictError("NIC %s of %s is attached with a different %s; detach it first"
                                % (name, observed.name, ", ".join(differs)), differs[0])
        return Plan(wanted=wanted)
    for user, where in mac_users.get(mac, []):
        if params.get("network") is None or where == params.get("network"):
            raise ConflictError("MAC %s is already used by %s on %s" % (mac, user, where), "mac")
    added = {key: value for key, value in wanted.items() if value is not None}
    steps = [step("attach_device", alias), step("write_record", observed.name)]
    return Plan([Action("attach", name, {}, added, steps, wanted=wanted, alias=alias)], wanted=wanted)


class NicAttachment(Attachment):
    TABLE = options.NIC_ATTACH
    entry_key = "network_interfaces"

    def __init__(self, ctx, params, check_mode=False):
        super().__init__(ctx, params, check_mode)
        self.nic_name = check.dns_label(params.get("name"), "name")
        # the leases listed for the NIC's MAC when this run plugged it in (machine.lease_expiries)
        self.earlier_leases = None

    def observe(self):
        target = self.observe_target()
        mac_users = {}
        if self.state == "attached":
            for dom, tree in dx.defined_domains(self.conn):
                for nic in elements.read_interfaces(tree):
                    mac_users.setdefault((nic["mac"] or "").lower(), []).append(
                        (dom.name(), nic["network"] or nic["bridge"]))
        return target, mac_users

    def plan(self, observed):
        target, mac_users = observed
        network = self.params.get("network")
        if self.state == "attached" and self.params.get("bridge"):
            host_bridge(self.ctx, check.interface_name(self.params["bridge"], "bridge"), "bridge")
        if self.params.get("wait") == "address":
            check.timeout_seconds(self.params["wait_timeout"], "wait_timeout")
        params = dict(self.params, name=self.nic_name, pool_name=self.ctx.name or self.ctx.uri,
                      network_exists=bool(network) and self.ctx.network(network) is not None)
        return plan_nic(params, target, mac_users)

    def _attach(self, action, target):
        wanted = action.data["wanted"]
        self.earlier_leases = lease_expiries(self.ctx, [wanted])
        self.attach_device(target, dx.nic_element(wanted), "NIC " + action.target)
        self.save_entries(target, lambda entries: entries + [wanted])

    def _detach(self, action, target):
        entry = action.data["entry"]
        self.detach_device(target, action.data["alias"], "NIC %s (%s)" % (action.target, entry["mac"]))
        self.save_entries(target, lambda entries: [nic for nic in entries if nic["name"] != action.target])
        # the filter of the NIC's security groups has no other user
        sgs.undefine_filter(self.conn, sgs.nic_filter(self.machine, action.target))

    APPLY = {"attach": _attach, "detach": _detach}

    def ensure(self):
        result = self.converge()
        target, _users = result.pop("observed")
        if self.state == "detached":
            result["network_interface"] = {"name": self.nic_name, "state": "Detached"}
            result["machine"] = MachineService(self.ctx).status(self.machine)
            return result
        wanted = next((nic for nic in target.record["spec"].get("network_interfaces") or []
                       if nic["name"] == self.nic_name), None)
        if not self.check_mode and self.params.get("wait") == "address" and wanted and wanted.get("network"):
            wait_for_address(self.ctx, target.dom, self.machine, [wanted],
                             float(check.timeout_seconds(self.params["wait_timeout"], "wait_timeout")),
                             self.earlier_leases)
        machine = MachineService(self.ctx).status(self.machine)
        shown = next((nic for nic in machine.get("network_interfaces") or [] if nic["name"] == self.nic_name),
                     None)
        if shown is None:
            planned = result["plan"][0]["after"] if result["plan"] else {}
            shown = dict(planned, ip_addresses=[], state="Pending")
        elif dx.nic_alias(self.nic_name) not in aliases(target.live):
            shown = dict(shown, state="Pending")
        result["network_interface"] = shown
        result["machine"] = machine
        return result
