# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine, converged through observe -> plan -> apply (see convergence.py), as a move is: the observer
(machine_observe.py, completed here with what the plan needs from the pool), the pure planner (machine_plan.py)
and the steps (``MachineResource.apply``, with creation.py, changes.py, rebuild.py and efi_store.py). Room is
checked after planning and before any step (``admit``). ``MachineService`` is what the modules and machine_batch
call: it converges, waits, and returns the outcome.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination.journals import journal_of
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_room
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import move_refusal, moving
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Resource, converge
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import LibvirtFailure, MachineryError, PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import FrozenDict
from ansible_collections.machinery.compute.plugins.module_utils.machines import clone
from ansible_collections.machinery.compute.plugins.module_utils.machines import efi_store
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.changes import Changes
from ansible_collections.machinery.compute.plugins.module_utils.machines.efi_store import EfiVariables
from ansible_collections.machinery.compute.plugins.module_utils.machines.creation import Creation, new_disks, planned_volumes
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import (
    lease_expiries, release_address, reserved_nics, wait_for_address)
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import (
    bump_boots, shutdown, update_record)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import ephemeral_volumes
from ansible_collections.machinery.compute.plugins.module_utils.machines.rebuild import Rebuild, wants_rebuild
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import PoolView, machine_status, now
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_observe import observe_machine
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_plan import adoption_record, plan_observed, resize_field, resize_refusal


# --- apply ------------------------------------------------------------------------------------------------------


class Prepared:
    """A spec normalized against one observation of the machine on one pool (a batch's check-mode preflight), for
    the real run on that pool to reuse while its own observation says the same.

    The key is taken when the real run first compares it: most machines of a batch are converged already and
    never need it, and until then nothing has written to what the preflight observed (a check-mode run writes
    nothing, and the real run compares before it applies)."""

    def __init__(self, spec, observed, uri):
        self.spec = spec
        self.uri = uri
        self._observed = observed
        self._key = None

    @property
    def key(self):
        if self._observed is not None:
            self._key, self._observed = observation_key(self._observed), None
        return self._key

    def matches(self, observed, uri):
        """Whether the real run on ``uri`` observes what the preflight did (a machine rescheduled to another
        pool is normalized anew, against that pool's images, networks and storage)."""
        return uri == self.uri and self.key == observation_key(observed)


def observation_key(observed):
    """What a spec was normalized from, of an observation: whether the machine exists, its record, its owned
    fields, and a dead run's journal."""
    return (observed.exists, json.dumps(observed.record, sort_keys=True, default=str),
            json.dumps((observed.journal or {}).get("volumes"), default=str),
            json.dumps(options.owned_values(observed.tree, observed.record) if observed.exists else None,
                       sort_keys=True, default=str))


class MachineResource(Creation, Changes, Rebuild, EfiVariables, Resource):
    """One machine on one pool, for ``converge``. ``params`` are machine_spec.params' (validated once, frozen)."""

    def __init__(self, ctx, params, check_mode=False, prepared=None, room=True):
        if not isinstance(params, FrozenDict):
            raise TypeError("MachineResource takes machine_spec.params(), not raw options")
        self.ctx = ctx
        self.conn = ctx.conn
        self.params = params
        self.check_mode = check_mode
        self.name = params["name"]
        self.state = params["state"]
        self.prepared = prepared
        # False: a resize is planned without the room check (check mode of a resize that moves the machine first)
        self.room = room
        self.spec = None
        self.warnings = []
        self.restart_required = False
        self.resize_backup = None  # {xml, running, fields}: the definition a resize replaced (Changes._update)
        self.observations = 0
        # while a create holds the machine through its wave (_apply_claimed): its admission and cached image
        self.admission = None
        self.cached = None
        self.defined = None  # the handle of the domain this run's create defined, for the observation after it
        # the leases listed for the machine's NICs when this run booted it (lease_expiries)
        self.earlier_leases = None
        self.power_done = False  # state=restarted: this run restarted the machine (its plan after says so)

    def describe(self):
        return "machine %s on pool %s" % (self.name, self.ctx.name or self.ctx.uri)

    def holds(self, plan, observed):
        """The hold on the machine for ``converge`` to take, for every plan but a create's: a create holds it
        the cheap way, through its wave, under the admission lock (``apply_plan``)."""
        if plan.actions and plan.actions[0].kind == "create":
            return clone.holds(self.ctx, self.spec)  # a clone's source, while its disk is copied
        return [self.ctx.coordination.of(self.ctx, self.name, field="name")]

    def apply_plan(self, plan, observed):
        """Apply; a create holds the machine through its wave (``_apply_claimed``). When another run holds the
        name already, the create waits for that hold as a change does (converge took the others' holds)."""
        if not (plan.actions and plan.actions[0].kind == "create"):
            super().apply_plan(plan, observed)
        elif not self._apply_claimed(plan, observed):
            with self.ctx.coordination.of(self.ctx, self.name, field="name"):
                super().apply_plan(plan, observed)

    def _apply_claimed(self, plan, observed):
        """Create the machine (and start it) holding it the cheap way (admission.claim): admitted onto the pool
        first, then held with a lock volume alone once the process's wave there lists it, until the start is
        done; the wave stays as long. False, with nothing made, when another run holds the machine: the caller
        then waits for that hold as a change does, outside the admission lock."""
        cached = self.cache_image()
        with Admission(self.ctx, self.params["unique_across"] or [], self.name) as admission:
            admission.journal(self.name, planned_volumes(self.spec))
            claimed = admission.claim(self.name)
            if claimed is None:
                return False
            self.admission, self.cached = admission, cached
            try:
                super().apply_plan(plan, observed)
            finally:
                self.admission = self.cached = None
                admission.unclaim(self.name, claimed)
        return True

    def interference(self, plan, leftover):
        """Who changed the machine after this run applied ``plan`` (see convergence.converge)."""
        found = super().interference(plan, leftover)
        if found is None:
            return None
        journal = documents.Registry.open(self.conn).get(keys.move_key(self.name))
        if journal:
            return "%s; a move of it from %s to %s is under way" % (found, journal["source"]["pool"],
                                                                    journal["target"]["pool"])
        return found

    def observe(self):
        # the first observation may come from the pool's listing of this run; the one after apply is fresh
        listing = self.ctx.listed() if not self.observations else None
        self.observations += 1
        dom, self.defined = self.defined, None
        observed = observe_machine(self.conn, self.name, journal=bool(self.ctx.registration), listing=listing,
                                   registry=self.ctx.registry if listing is not None else None, dom=dom)
        if not observed.exists and not observed.journal and self.ctx.registration:
            observed.journal = self._orphan_log()
        return self._complete(observed)

    def _complete(self, observed):
        """What the plan needs beyond the domain, read now so that planning reads nothing: the pool's name, the
        moment and record of an adoption, the spec normalized against the pool (once a run: machine_spec.resolve
        reads its images, classes, networks and storage), the owned values, the snapshots (a rebuild refuses
        them) and the UEFI variables store when the run gives efi_vars."""
        observed.pool = self.ctx.name or self.ctx.uri
        if observed.exists and not observed.managed and not self.params["adopt"]:
            return observed  # the plan refuses it
        record = observed.record
        if observed.exists and record is None:
            observed.moment = now().isoformat()
            record = observed.adopted = adoption_record(observed, self.params["image"], observed.moment)
        if self.spec is None:
            if self.prepared is not None and self.prepared.matches(observed, self.ctx.uri):
                self.spec = self.prepared.spec  # the preflight normalized against what this run observes too
            else:
                if not observed.exists and self.state != "absent":
                    self.ctx.require_registration()
                observed.current = options.owned_values(observed.tree, record) if observed.exists else None
                facts = machine_spec.resolve(self.params, self.ctx, record)
                # the volumes a dead run of this name listed in its journal are replaced by the create
                facts.taken_volumes -= set((observed.journal or {}).get("volumes") or [])
                self.spec = machine_spec.normalize(self.params, facts, record, observed.current)
        observed.spec = self.spec
        if observed.exists and wants_rebuild(self.spec, record):
            observed.snapshots = observed.dom.snapshotNum(0)
        if observed.exists and self.spec.get("efi_vars") is not None:
            observed.efi_vars = efi_store.read(self.ctx, observed.tree, self.name)
        return observed

    def _orphan_log(self):
        """A journal for the console log of this name that no domain uses and no journal lists (a run that died
        left it): the log is the collection's own file, so a create replaces it and ``absent`` removes it."""
        log = "%s-console.log" % self.name
        if self.ctx.view().missing(self.ctx.storage_file(log)):
            return None  # not among the volumes this run listed: no lookup (one made since is a live run's)
        vol = lv.lookup_volume(self.ctx.storage, log)
        if vol is None or storage.users_of(self.conn, vol.path(), None):
            return None
        if self.ctx.registry.get(keys.move_key(self.name)) is not None:
            return None  # a move of that name is under way or was cut off: its own resolution owns the file
        return {"machine": self.name, "volumes": [log]}

    def plan(self, observed):
        """Pure: machine_plan.plan_observed of the completed observation (``_complete``)."""
        return plan_observed(self.params, observed, restarted=self.power_done)

    def admit(self, plan, observed):
        """Before any step, in check mode too: a create or a resize the pool has no room for is refused, and the
        run's journal of the pool lists each create from the first on (a batch's check-mode preflight plans
        every create of the batch before the first is made)."""
        # nothing is applied for variables that wait for the machine to be off: the plan alone says so
        self.restart_required = self.restart_required or plan.facts.get("efi_waiting", False)
        for action in plan.actions:
            if action.kind == "create":
                check_room(self.ctx, self.spec, new_disks(self.spec))
                self.ctx.planned_creates[self.name] = planned_volumes(self.spec)
            elif action.kind == "update" and action.data["grows"] and self.room:
                self.check_resize_room(action.data["grows"])

    def check_resize_room(self, grows, locked=False):
        """Refuse a resize the pool has no room for, naming the option that asked for it (the machine's own
        current size is not counted against it)."""
        try:
            check_room(self.ctx, self.spec, locked=locked)
        except PoolFull as exc:
            raise resize_refusal(self.params, self.spec, grows, self.ctx.name or self.ctx.uri,
                                 str(exc)) from None

    # the actions

    def _define(self, tree, what):
        try:
            return writer.write(self.conn, "defineXML", dx.tostring(tree))
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot %s %s: %s" % (what, tree.findtext("name"), lv.describe(exc))) from None

    def _start(self, action, _observed):
        dom = self.defined or lv.lookup_domain(self.conn, self.name)  # created just now: its define's handle
        state, reason = dom.state()
        unwritten = None  # variables a restart was to write and could not: the machine starts all the same
        try:
            if state == lv.libvirt.VIR_DOMAIN_PAUSED and reason != lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED:
                writer.write(dom, "resume")
            else:
                if state != lv.libvirt.VIR_DOMAIN_SHUTOFF:
                    writer.write(dom, "destroy")
                try:
                    self.write_efi_vars(dom, action)  # a restart's or a resize's, while it is off
                except MachineryError as exc:
                    unwritten = exc
                self.earlier_leases = lease_expiries(self.ctx, self.spec.get("network_interfaces"))
                writer.write(dom, "create")
        except lv.libvirt.libvirtError as exc:
            self._record_error(dom, "start failed: %s" % lv.describe(exc))
            if self.resize_backup is not None:
                self._undo_resize(dom, "it did not start with its new size: %s" % lv.describe(exc))
            try:
                field, hint = fw.start_failure_option(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE)),
                                                      lv.describe(exc))
            except lv.libvirt.libvirtError:
                field, hint = None, ""
            raise LibvirtFailure("cannot start %s: %s%s" % (self.name, lv.describe(exc), hint), field) from None
        self._update_record(dom, bump_boots)
        if unwritten is not None:
            raise unwritten

    def _restart(self, action, observed):
        """Shut the machine down gracefully (forced after its shutdown_timeout) and start it with its new size; a
        restart that fails puts the machine back as it was, running."""
        dom = lv.lookup_domain(self.conn, self.name)
        timeout = self.params["shutdown_timeout"]
        forced = False
        try:
            forced = shutdown(dom, timeout)
        except lv.libvirt.libvirtError as exc:
            self._undo_resize(dom, "it could not be shut down: %s" % lv.describe(exc))
        if forced:
            self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off to be "
                                 "resized" % (self.name, timeout))
        self._start(action, observed)
        self.restart_required = False

    def _undo_resize(self, dom, cause):
        """Put back the definition the resize replaced and start the machine again if it ran; then fail."""
        backup = self.resize_backup
        field = resize_field(self.params, backup["fields"])
        try:
            writer.write(self.conn, "defineXML", backup["xml"])
            if backup["running"] and not dom.isActive():
                writer.write(dom, "create")
                self._update_record(dom, bump_boots)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot resize %s: %s; putting it back as it was failed too: %s"
                                 % (self.name, cause, lv.describe(exc)), field) from None
        self._record_error(dom, "resize failed: %s" % cause)
        done = getattr(self, "done", None)
        if done is not None:  # the update was undone: a failure that reports it as done would mislead
            done[:] = [action for action in done if not action.data.get("resize")]
        raise LibvirtFailure("cannot resize %s: %s; it was put back as it was%s" % (
            self.name, cause, ", running" if backup["running"] else ""), field)

    def apply(self, action, observed):
        """Carry out one action, with the run strategy a start or stop changes (written before it: the crash
        action a started guest gets is its definition's) and the autostart it carries (after it)."""
        if action.data.get("strategy"):
            self._update(Action("update", self.name, fields=["run_strategy"], grows=[]), observed)
        super().apply(action, observed)
        if action.data.get("autostart") is not None:
            self._write_autostart(action.data["autostart"])

    def _set_autostart(self, action, _observed):
        self._write_autostart(action.after["autostart"])

    def _write_autostart(self, wanted):
        dom = self.defined or lv.lookup_domain(self.conn, self.name)
        try:
            writer.write(dom, "setAutostart", 1 if wanted else 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot set autostart of %s: %s" % (self.name, lv.describe(exc)),
                                 "run_strategy") from None

    def _power_restart(self, action, observed):
        """Restart: soft is the ACPI power button (forced off after shutdown_timeout), hard a power cycle; a
        suspended machine's saved memory is discarded, as a reboot would lose it."""
        dom = observed.dom
        try:
            if dom.isActive():
                if action.data["mode"] == "hard":
                    writer.write(dom, "destroy")
                elif shutdown(dom, self.params["shutdown_timeout"]):
                    self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off "
                                         "to be restarted" % (self.name, self.params["shutdown_timeout"]))
            elif dom.hasManagedSaveImage(0):
                writer.write(dom, "managedSaveRemove", 0)
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot restart %s: %s" % (self.name, lv.describe(exc)), "state") from None
        self.power_done = True
        self._start(action, observed)

    def _power(self, what, call, field="state"):
        try:
            call()
        except lv.libvirt.libvirtError as exc:
            raise LibvirtFailure("cannot %s %s: %s" % (what, self.name, lv.describe(exc)), field) from None

    def _pause(self, _action, observed):
        self._power("pause", observed.dom.suspend)

    def _start_paused(self, _action, observed):
        self._power("start", lambda: writer.write(observed.dom, "createWithFlags", lv.libvirt.VIR_DOMAIN_START_PAUSED))
        self._update_record(observed.dom, bump_boots)

    def _suspend(self, _action, observed):
        self._power("suspend", lambda: writer.write(observed.dom, "managedSave", 0))

    def _resume(self, _action, observed):
        """A paused guest runs on; a suspended one is restored from its saved memory (no new boot)."""
        dom = observed.dom
        self._power("resume", dom.resume if observed.paused else dom.create)

    def _stop(self, _action, observed):
        timeout = self.params["shutdown_timeout"]
        if shutdown(observed.dom, timeout):
            self.warnings.append("%s did not power off within %ss of the ACPI request and was forced off"
                                 % (self.name, timeout))

    def _delete(self, _action, observed):
        dom = observed.dom
        volumes = ephemeral_volumes(observed.record or {})
        if volumes:
            # a run killed between the undefine and the last volume leaves the journal for the next run
            self.ctx.registry.put(keys.pending_key(self.name), {"machine": self.name, "volumes": volumes})
        timeout = self.params["shutdown_timeout"]
        if dom.isActive() and shutdown(dom, timeout):
            self.warnings.append("%s did not power off within %ss and was forced off" % (self.name, timeout))
        lv.undefine_domain(dom, self.name)
        for interface in elements.read_interfaces(observed.tree):
            if (interface["filterref"] or "").startswith(sgs.NIC_PREFIX):
                sgs.undefine_filter(self.conn, interface["filterref"])
        pool = self.ctx.storage
        for volume_name in volumes:
            if volume_name.endswith("-console.log"):
                storage.refresh(pool)
            storage.delete_volume(pool, volume_name)
        for vol in (observed.record or {}).get("spec", {}).get("volumes") or []:
            if vol.get("encrypted") and vol.get("ephemeral"):
                storage.delete_volume_secret(self.conn, self.ctx.storage_file(vol["volume"]))
        for nic in reserved_nics(observed.record):
            release_address(self.ctx, nic)
        if volumes:
            self.ctx.registry.remove(keys.pending_key(self.name), expected=True)
        # a create of the machine killed after its define (while it started the guest) left its wave listing it:
        # under the pool's lock every wave but this process's is a dead run's (a live one goes before its lock)
        if self.ctx.registration and (journal_of(self.ctx.registry, self.name) or {}).get("wave"):
            with Admission(self.ctx, []) as admission:
                admission.clean_dead_waves()

    # the record of a running machine

    def _update_record(self, dom, change):
        update_record(dom, change)

    def _record_error(self, dom, message):
        def note(record):
            record["last_error"] = message
        try:
            update_record(dom, note)
        except lv.libvirt.libvirtError:
            pass

    APPLY = {"create": Creation._create, "clean_up": Creation._clean_up, "adopt": Changes._adopt,
             "update": Changes._update, "update_security_groups": Changes._update_security_groups, "start": _start,
             "set_autostart": _set_autostart, "restart": _restart, "power_restart": _power_restart,
             "pause": _pause, "start_paused": _start_paused, "suspend": _suspend, "resume": _resume, "stop": _stop, "delete": _delete,
             "rebuild": Rebuild._rebuild, "write_efi_vars": EfiVariables._write_efi_vars}


# --- the service the modules call -------------------------------------------------------------------------------

class Outcome:
    """What a run did (or would do in check mode): the plan, the final status, warnings."""

    def __init__(self, plan, machine, warnings=(), restart_required=False):
        self.plan = plan
        self.machine = machine
        self.warnings = list(plan.warnings) + list(warnings)
        self.restart_required = restart_required
        self.changed = plan.changed
        self.actions = plan.summaries()
        self.before, self.after = plan.diff() if plan.changed else ({}, {})


class MachineService:
    def __init__(self, ctx, check_mode=False):
        self.ctx = ctx
        self.conn = ctx.conn
        self.check_mode = check_mode

    def status(self, name):
        dom = lv.lookup_domain(self.conn, name)
        if dom is None:
            return {"name": name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
        return machine_status(dom, self.ctx)

    def ensure(self, params, prepared=None, room=True):
        """Converge the machine of ``params`` (machine_spec.params); ``prepared`` is a preflight's Prepared;
        ``room`` False plans a resize without checking the pool's room (only in check mode)."""
        resource = MachineResource(self.ctx, params, self.check_mode, prepared, room=room or not self.check_mode)
        with self.ctx.applying:
            plan, observed = converge(resource, self.check_mode)
        if not self.check_mode:
            names = self.ctx.clear_abandoned_lock()
            identity = self.ctx.coordination.identity
            mover = moving(names, resource.name, identity) if observed.exists and not plan.actions else None
            if mover is not None:  # converged only until the move holding it goes on (holds.moving)
                raise move_refusal(self.conn, resource.name, mover)
        spec = resource.spec or {"name": resource.name, "state": resource.state}
        if resource.state == "absent":
            machine = {"name": resource.name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Terminated"}
        elif not observed.exists:  # check mode: nothing was created
            machine = {"name": resource.name, "pool": self.ctx.name, "uri": self.ctx.uri, "phase": "Pending",
                       "machine_class": spec.get("machine_class"), "cpu": spec.get("cpu"),
                       "memory": format_quantity(spec["memory"]), "labels": spec.get("labels")}
        else:
            if not self.check_mode and resource.state in ("running", "restarted"):
                self.wait(observed.dom, spec, params, resource.earlier_leases)
            if params["wait"] == "address":  # waited for since the observation: read again
                machine = machine_status(observed.dom, self.ctx, PoolView(self.ctx, volumes_of=self.ctx.view()))
            else:
                # the observation is the run's first, or the fresh one after the apply: its XML and state are the
                # status's; after a change the pool's leases and volumes are read anew, else as this run read them
                view = PoolView(self.ctx, volumes_of=self.ctx.view()) if plan.actions else self.ctx.view()
                machine = machine_status(observed.dom, self.ctx, view, observed.tree, state=observed.state,
                                         record=observed.record, flags=(observed.autostart, observed.saved))
        restart_required = resource.restart_required or (self.check_mode and plan.facts.get("restart_required"))
        outcome = Outcome(plan, machine, resource.warnings, bool(restart_required))
        outcome.prepared = Prepared(resource.spec, observed, self.ctx.uri) if resource.spec is not None else None
        return outcome

    def wait(self, dom, spec, params, earlier_leases=None):
        if params["wait"] == "address":
            wait_for_address(self.ctx, dom, spec["name"], spec.get("network_interfaces"),
                             float(params["wait_timeout"]), earlier_leases)
