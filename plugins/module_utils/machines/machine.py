# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine, converged through observe -> plan -> apply (see convergence.py).

``observe_machine`` reads the domain once; ``plan_machine`` is a pure function of the normalized spec
(machine_spec.py) and that observation; ``MachineResource.apply`` carries out one action. ``MachineService`` is
what the modules and machine_batch call: it converges, waits, and returns the outcome.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination import documents
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.coordination.journals import journal_of
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination.admission import Admission
from ansible_collections.machinery.compute.plugins.module_utils.pools.capacity import check_room
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import move_refusal, moving
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, LibvirtFailure, MachineryError, PoolFull)
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import FrozenDict
from ansible_collections.machinery.compute.plugins.module_utils.machines import clone
from ansible_collections.machinery.compute.plugins.module_utils.machines import efi_store
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.changes import Changes, live_effects
from ansible_collections.machinery.compute.plugins.module_utils.machines.efi_store import EfiVariables
from ansible_collections.machinery.compute.plugins.module_utils.machines.creation import (
    Creation, create_steps, new_disks, planned_volumes)
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import (
    lease_expiries, observe_reservations, release_address, reserved_nics, wait_for_address)
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import (
    bump_boots, shutdown, update_record)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import ephemeral_volumes
from ansible_collections.machinery.compute.plugins.module_utils.machines.rebuild import (
    Rebuild, rebuild_action, wants_rebuild)
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import (
    PoolView, is_active, machine_status, now)
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

SHOWN_AT_CREATION = ("cpu", "memory", "machine_class", "labels")
CAPABILITIES_SHOWN = ("topology", "disk_qos", "ip_reservations")


# --- observe ----------------------------------------------------------------------------------------------------

class Observed:
    """One reading of a machine's domain. ``dom`` is None when there is no domain of that name."""

    def __init__(self, name, dom=None, tree=None, record=None, state=None, live_max_memory=None, autostart=None,
                 saved=None):
        self.name = name
        self.dom = dom
        self.tree = tree
        self.record = record
        self.state = state  # (state, reason)
        self.live_max_memory = live_max_memory  # bytes the running guest can balloon up to
        self.journal = None  # of a dead run, for a machine that does not exist
        self.snapshots = 0  # how many snapshots it has: read only when a rebuild is wanted (they refuse it)
        self.security_groups = {}  # NIC name -> the groups guarding it, read from its nwfilter
        # {(guid, name): varstore.Variable} of its UEFI variables store (None: none yet); read only when a run
        # gives efi_vars (MachineResource.plan)
        self.efi_vars = None
        self._autostart = autostart
        self._saved = saved

    @property
    def exists(self):
        return self.dom is not None

    @property
    def managed(self):
        return self.record is not None

    @property
    def active(self):
        return self.exists and is_active(self.state[0])

    @property
    def autostart(self):
        """Whether the host starts the machine when its daemon starts (read once, when a plan asks)."""
        if not self.exists:
            return False
        if self._autostart is None:
            self._autostart = bool(self.dom.autostart())
        return self._autostart

    @property
    def paused(self):
        """Paused by a request (pause, or started paused), not by an error."""
        return self.exists and self.state[0] == lv.libvirt.VIR_DOMAIN_PAUSED and self.state[1] not in (
            lv.libvirt.VIR_DOMAIN_PAUSED_CRASHED, lv.libvirt.VIR_DOMAIN_PAUSED_IOERROR)

    @property
    def saved(self):
        """Off with its memory saved by libvirt (managed save): a start resumes it."""
        if not self.exists or self.active:
            return False
        if self._saved is None:
            self._saved = bool(self.dom.hasManagedSaveImage(0))
        return self._saved

    @property
    def power(self):
        """The power state a diff shows."""
        if not self.exists:
            return None
        if self.paused:
            return "paused"
        if self.active:
            return "running"
        return "suspended" if self.saved else "off"

    @property
    def failed(self):
        """Off because it crashed or failed, not because it was shut down."""
        if not self.exists:
            return False
        state, reason = self.state
        failures = (lv.libvirt.VIR_DOMAIN_SHUTOFF_CRASHED, lv.libvirt.VIR_DOMAIN_SHUTOFF_FAILED)
        return state == lv.libvirt.VIR_DOMAIN_CRASHED or (
            state == lv.libvirt.VIR_DOMAIN_SHUTOFF and reason in failures)


def observe_machine(conn, name, journal=False, listing=None, registry=None, dom=None):
    """One read of the machine; with ``journal``, a missing machine also brings the journal a dead run of that
    name left in the pool's registry (the volumes it created or was deleting). With ``listing`` (the pool's
    domains as this run read them, pool_context.read_domains) the machine is taken from it, no round trip, and a
    missing one's journal from ``registry`` (the run's). ``dom``: the domain's handle, when the run has it (the
    one its define returned), so it is not looked up."""
    if listing is not None:
        reading = listing.get(name)
        if reading is not None:
            return Observed(name, reading.dom, reading.tree, reading.record, reading.state,
                            reading.live_max_memory, reading.autostart, reading.saved)
        dom = None
    elif dom is None:
        dom = lv.lookup_domain(conn, name)
    if dom is None:
        observed = Observed(name)
        if journal:
            observed.journal = journal_of(registry or documents.Registry.open(conn), name)
        return observed
    try:
        tree = dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))
    except lv.libvirt.libvirtError as exc:
        if listing is not None or exc.get_error_code() != lv.libvirt.VIR_ERR_NO_DOMAIN:
            raise
        return observe_machine(conn, name, journal, registry=registry)  # undefined since: as it is now
    state = tuple(dom.state())
    live_max = dom.maxMemory() * 1024 if is_active(state[0]) else None
    record = dx.read_record(tree)
    if record is not None and any(nic.get("ip_address") for nic in record.get("spec", {}).get("network_interfaces")
                                  or []):
        observe_reservations(conn, record)  # only machines with fixed addresses pay for the network's XML
    observed = Observed(name, dom, tree, record, state, live_max)
    for interface in elements.read_interfaces(tree):
        if (interface["alias"] or "").startswith("ua-nic-"):
            observed.security_groups[interface["alias"][len("ua-nic-"):]] = sgs.nic_groups(conn, interface)
    return observed


# --- plan (pure) ------------------------------------------------------------------------------------------------

def adoption_record(observed, image, moment):
    """The record of a domain the collection takes over as it is: its size and firmware, nothing else."""
    found = options.read_created(observed.tree)
    return {"version": dx.RECORD_VERSION, "created": moment, "boots": 1 if observed.active else 0,
            "last_error": None, "adopted": True,
            "spec": {"name": observed.name, "machine_class": None, "cpu": found["cpu"], "memory": found["memory"],
                     "labels": {}, "firmware": found["firmware"], "image": {"source": image}, "volumes": [],
                     "network_interfaces": [], "root_size": None, "boot_config": None, "files": {}}}


def device_request_warnings(spec, record):
    """Volumes and NICs of an existing machine change through volume_attach and nic_attach, not here."""
    warnings = []
    for key, module in (("volumes", "volume_attach"), ("network_interfaces", "nic_attach")):
        requested = spec.get("requested_" + key)
        recorded = [item["name"] for item in record["spec"].get(key) or [] if not item.get("swap")]
        if requested is not None and [item.get("name") for item in requested] != recorded:
            warnings.append("%s of an existing machine are changed with machinery.compute.%s; the %s option was "
                            "not applied" % (key.replace("_", " "), module, key))
    return warnings


def boot_files_conflict(spec, record):
    """A new boot configuration rewrites the machine's Ignition file or seed ISO; it cannot add the device."""
    files = record["spec"].get("files") or {}
    if "ignition_data" in spec and not files.get("ignition"):
        raise ConflictError("%s was created without Ignition; the fw_cfg entry can only be added by recreating "
                            "the machine" % spec["name"], "ignition")
    if "seed_files" in spec and not files.get("seed"):
        raise ConflictError("%s was created without a cloud-init seed; the cdrom can only be added by recreating "
                            "the machine" % spec["name"], "cloud_init")


def security_group_changes(spec, observed):
    """{nic: (groups now, groups wanted)} of the NICs whose requested security groups differ from the ones
    their nwfilter holds."""
    changes = {}
    for nic, wanted in sorted((spec.get("requested_security_groups") or {}).items()):
        if nic in observed.security_groups and observed.security_groups[nic] != wanted:
            changes[nic] = (observed.security_groups[nic], wanted)
    return changes


def security_groups_action(name, changes, active):
    steps = []
    for nic, (before, after) in changes.items():
        filter_name = sgs.nic_filter(name, nic)
        if after:
            steps.append(step("define_nwfilter", filter_name, security_groups=after))
        if bool(before) != bool(after):
            steps.append(step("update_device", dx.nic_alias(nic), live=active,
                              filterref=filter_name if after else None))
        if not after:
            steps.append(step("undefine_nwfilter", filter_name))
    return Action("update", name, {"security_groups": {nic: pair[0] for nic, pair in changes.items()}},
                  {"security_groups": {nic: pair[1] for nic, pair in changes.items()}}, steps,
                  fields=["security_groups"], handler="update_security_groups", changes=changes, grows=[])


RESIZE_FIELDS = ("cpu", "memory")


def restarts_to_resize(names, spec, observed):
    """Whether an update of the running machine of ``observed`` restarts it in place: it is resized (cpu, or
    memory beyond what its guest can balloon up to) and is to keep running (``stopped`` stops it anyway)."""
    if not observed.active or spec["state"] == "stopped":
        return False
    pending, _notes = live_effects(names, spec, observed)
    return any(key in pending for key in RESIZE_FIELDS)


def restart_action(name, record):
    """The graceful restart that carries a resize into the running guest (its restart count goes up by one)."""
    restarts = max(0, int((record or {}).get("boots") or 0) - 1)
    return Action("restart", name, {"restart_count": restarts}, {"restart_count": restarts + 1},
                  [step("shutdown", name), step("start", name)], resize=True)


def resize_field(prm, grows):
    """The option a refused resize names: the class when the task gives one, else the first size it grows."""
    if prm.get("machine_class"):
        return "machine_class"
    return next((key for key in grows if prm.get(key) is not None), grows[0] if grows else "machine_class")


def resize_refusal(prm, spec, grows, pool, cause):
    """The error of a resize the pool has no room for (``cause`` is the capacity check's): names the option that
    asked for it and what ``allow_move`` would do."""
    size = "%s cpu and %s" % (check.cpu_text(spec["cpu"]), format_quantity(spec["memory"]))
    if prm.get("allow_move"):
        hint = "allow_move found no pool to move it to"
    else:
        hint = "with allow_move: true it would be moved to a pool that fits first"
    refusal = PoolFull("no room on pool %s to resize %s to %s (%s); nothing was changed; %s"
                       % (pool, spec["name"], size, cause, hint), resize_field(prm, grows))
    # what a move to a pool that fits needs to know (fleets/resize_move.py)
    refusal.resize = {"name": spec["name"], "machine_class": spec.get("machine_class"), "cpu": spec["cpu"],
                      "memory": spec["memory"], "tolerations": [dict(item) for item in spec.get("tolerations") or []]}
    return refusal


def plan_machine(spec, observed, record=None, current=None, restarted=False):
    """The actions that take the machine from ``observed`` to ``spec``; ``record`` is the machine's record
    (the one about to be written when the plan adopts the domain); ``current`` its owned values
    (options.owned_values of the observed tree and that record) when the caller read them already."""
    name = spec["name"]
    if spec["state"] == "absent":
        if not observed.exists:
            if observed.journal:
                # a run of this name died midway: what it listed goes, as the machine would have
                steps = [step("delete_volume", volume) for volume in observed.journal.get("volumes") or []]
                return Plan([Action("clean_up", name, steps=steps, journal=observed.journal)])
            return Plan()
        steps = ([step("shutdown", name)] if observed.active else []) + [step("undefine", name)]
        steps += [step("delete_volume", volume) for volume in ephemeral_volumes(observed.record or {})]
        steps += [step("release_address", nic["network"], mac=nic["mac"], ip=nic["ip_address"])
                  for nic in reserved_nics(observed.record)]
        return Plan([Action("delete", name, {"state": "present"}, {"state": "absent"}, steps)])
    if not observed.exists:
        after = options.shown({key: spec.get(key) for key in SHOWN_AT_CREATION})
        after.update({key: spec[key] for key in CAPABILITIES_SHOWN if spec.get(key)})
        if spec.get("swap"):
            after["swap"] = format_quantity(spec["swap"])
        after.update(state=spec["state"], image=(spec.get("image") or {}).get("source"))
        actions = [Action("create", name, {}, after, create_steps(spec))]
        if spec.get("efi_vars"):  # into the store libvirt makes from the firmware's template, before a boot
            actions.append(efi_vars_action(spec, observed))
        if should_start(spec, observed):
            actions.append(Action("start", name, steps=[step("start", name)]))
        # the autostart the run strategy wants is part of the create, as its crash action is
        carry_autostart(actions[0], spec, observed, should_start(spec, observed))
        return Plan(actions, restart_required=False)
    actions = []
    record = record or observed.record
    if not observed.managed:
        actions.append(Action("adopt", name, steps=[step("write_record", name), step("define", name)],
                              record=record))
    warnings = device_request_warnings(spec, record)
    current = current if current is not None else options.owned_values(observed.tree, record)
    names = options.changed_fields(current, spec)
    rebuild = rebuild_action(spec, record, observed.active, observed.snapshots)
    power, running_after = state_action(spec, observed, restarted, rebuild)
    if power is not None and "run_strategy" in names:
        # the strategy a start or stop implies (or one given with it) changes with that action, not beside it
        names.remove("run_strategy")
        power.before["run_strategy"], power.after["run_strategy"] = current["run_strategy"], spec["run_strategy"]
        power.steps.insert(0, step("define", name))
        power.data["strategy"] = True
    if rebuild is not None and "boot_config" in names:
        boot_files_conflict(spec, record)
        names.remove("boot_config")  # the rebuild writes the boot files anew, beside the old ones
        rebuild.before["boot_config"], rebuild.after["boot_config"] = current["boot_config"], spec["boot_config"]
    pending = []
    restart = None
    if names:
        if "boot_config" in names:
            boot_files_conflict(spec, record)
        if observed.active:
            restarting = restarts_to_resize(names, spec, observed)
            pending, notes = live_effects(names, spec, observed, restarting)
            warnings.extend(notes)
            if restarting:
                restart = restart_action(name, record)
        grows = [key for key in RESIZE_FIELDS if key in names and spec[key] > (current[key] or 0)]
        actions.append(Action("update", name, options.shown({key: current[key] for key in names}),
                              options.shown({key: spec[key] for key in names}),
                              [step("define", name)] + ([step("set_live", name)] if observed.active else []),
                              fields=names, grows=grows, resize=any(key in names for key in RESIZE_FIELDS)))
    changes = security_group_changes(spec, observed)
    if changes:
        actions.append(security_groups_action(name, changes, observed.active))
    if rebuild is not None:
        # it shuts a running machine down and starts it again: a resize restart would be a second one
        actions.append(rebuild)
        restart, pending = (None, []) if observed.active else (restart, pending)
    if restart is not None:
        actions.append(restart)
    after_stop, efi_waiting = efi_vars_plan(spec, observed, record, actions, power, warnings)
    if power is not None:
        actions.append(power)
    if after_stop is not None:
        actions.append(after_stop)
    # libvirt's autostart follows the run strategy: it changes with the action that changes the power or the
    # strategy; on its own only when nothing else changes (an on_failure machine found shut down)
    carrier = power or next((action for action in actions if "run_strategy" in action.fields), None)
    if carrier is not None:
        carry_autostart(carrier, spec, observed, running_after)
    else:
        autostart = autostart_action(spec, observed, running_after)
        if autostart is not None:
            actions.append(autostart)
    return Plan(actions, warnings, restart_required=bool(pending) or efi_waiting, efi_waiting=efi_waiting)


def efi_vars_action(spec, observed):
    """The action that writes the variables ``efi_vars`` gives into the machine's store (and its record)."""
    entries = spec["efi_vars"]
    found = observed.efi_vars
    differing = efi.differing(entries, found)
    steps = [step("write_volume", fw.nvram_volume(spec["name"]),
                  variables=["%s-%s" % (entry["name"], entry["guid"]) for entry in differing])] if differing else []
    before = {"efi_vars": efi.found_entries(entries, found)} if observed.exists else {}
    return Action("update", spec["name"], before, {"efi_vars": entries},
                  steps + [step("write_record", spec["name"])], fields=["efi_vars"], handler="write_efi_vars",
                  grows=[], efi_vars=entries)


def efi_vars_plan(spec, observed, record, actions, power, warnings):
    """Plan the variables ``efi_vars`` gives for an existing machine: the store is written only while the machine
    is off. Off (or only the record differs): an action before the ones that start it, in ``actions``. Running:
    the action of this plan that shuts it down and starts it again (a restart, a resize's restart, a rebuild)
    writes them in between; a stop is followed by the write; else the change waits, with a warning. Returns (the
    action that follows ``power`` or None, whether the change waits for the machine to be off)."""
    if spec.get("efi_vars") is None:
        return None, False
    differing = efi.differing(spec["efi_vars"], observed.efi_vars)
    if not differing and ((record or {}).get("spec") or {}).get("efi_vars") == spec["efi_vars"]:
        return None, False
    action = efi_vars_action(spec, observed)
    if not differing or not (observed.active or observed.saved):
        first = next((index for index, item in enumerate(actions) if item.kind in ("rebuild", "restart")),
                     len(actions))
        actions.insert(first, action)
        return None, False
    carrier = next((item for item in actions if item.kind in ("rebuild", "restart")), None)
    if carrier is None and power is not None and power.kind == "restart":
        carrier = power
    if carrier is not None:
        carrier.data["efi_vars"] = spec["efi_vars"]
        carrier.before.update(action.before)
        carrier.after.update(action.after)
        kinds = [item["action"] for item in carrier.steps]
        at = kinds.index("start") if "start" in kinds else kinds.index("define") + 1 if "define" in kinds \
            else len(kinds)
        carrier.steps[at:at] = action.steps
        return None, False
    if power is not None and power.kind == "stop":
        return action, False
    warnings.append("efi_vars of the running machine %s (%s) are written into its UEFI variable store while it is "
                    "off (QEMU holds the store as the machine's flash): nothing was written; restart it (state: "
                    "restarted) or stop it to have them written" % (
                        spec["name"], ", ".join(entry["name"] for entry in differing)))
    return None, True


def state_action(spec, observed, restarted=False, rebuild=None):
    """(the action that changes the machine's power, or None; whether it runs after the plan)."""
    name = spec["name"]
    power = power_action(spec, observed, restarted)
    if power is not None:
        return power, power.kind in ("restart", "resume", "pause") or power.handler == "start_paused"
    if should_start(spec, observed) and not observed.active:
        return Action("start", name, steps=[step("start", name)]), True
    if should_stop(spec) and observed.active and rebuild is None:
        return Action("stop", name, steps=[step("shutdown", name)]), False
    return None, observed.active


def power_action(spec, observed, restarted=False):
    """The action of a power request (``state`` restarted, paused, suspended, or running on a paused or suspended
    machine), or None. ``restarted``: this run restarted the machine already (a restart is done once per run)."""
    name, state = spec["name"], spec["state"]
    shown = ({"power": observed.power}, )
    if state == "restarted" and not restarted:
        mode = spec["restart"]
        steps = ([step("destroy" if mode == "hard" else "shutdown", name)] if observed.active else []) + \
            [step("start", name)]
        return Action("restart", name, shown[0], {"power": "running"}, steps, handler="power_restart", mode=mode)
    if state == "paused" and not observed.paused:
        if observed.active:
            return Action("pause", name, shown[0], {"power": "paused"}, [step("suspend", name)])
        return Action("start", name, shown[0], {"power": "paused"}, [step("start", name, paused=True)],
                      handler="start_paused")
    if state == "suspended" and not observed.saved:
        if not observed.active:
            raise ConflictError("%s is off: there is no running guest to suspend" % name, "state")
        return Action("suspend", name, shown[0], {"power": "suspended"}, [step("managed_save", name)])
    if (state in ("running", "restarted") or (state == "present" and spec.get("run_strategy") == "always")) and \
            (observed.paused or observed.saved):
        return Action("resume", name, shown[0], {"power": "running"},
                      [step("resume" if observed.paused else "restore", name)])
    return None


def should_start(spec, observed):
    """Whether the machine is to run: its state says so, or, under ``present``, its run strategy does (``always``
    starts it when found off, ``on_failure`` when it crashed or failed)."""
    strategy = spec.get("run_strategy")
    if spec["state"] == "running":
        return True
    return spec["state"] == "present" and (strategy == "always" or (strategy == "on_failure" and observed.failed))


def should_stop(spec):
    return spec["state"] == "stopped" or (spec["state"] == "present" and spec.get("run_strategy") == "halted")


def wanted_autostart(spec, observed, running_after):
    """libvirt's autostart as the run strategy wants it: on for ``always``; for ``on_failure`` while the machine
    runs (a host that loses power has failed it), off once it was shut down; off for ``manual`` and ``halted``.
    None when it is as wanted already, or the machine has no strategy (made before they existed, under
    ``present``: left as it is)."""
    strategy = spec.get("run_strategy")
    if strategy is None:
        return None
    wanted = strategy == "always" or (strategy == "on_failure" and running_after)
    return None if observed.autostart == wanted else wanted


def autostart_action(spec, observed, running_after):
    """The autostart change on its own, when no other action of the plan carries it."""
    wanted = wanted_autostart(spec, observed, running_after)
    if wanted is None:
        return None
    return Action("update", spec["name"], {"autostart": observed.autostart}, {"autostart": wanted},
                  [step("set_autostart", spec["name"], autostart=wanted)], fields=["autostart"],
                  handler="set_autostart", grows=[])


def carry_autostart(action, spec, observed, running_after):
    """Make ``action`` also set the autostart its strategy wants (shown in its diff, one more step)."""
    wanted = wanted_autostart(spec, observed, running_after)
    if wanted is None:
        return
    if observed.exists:
        action.before["autostart"] = observed.autostart
        action.after["autostart"] = wanted
    action.steps.append(step("set_autostart", spec["name"], autostart=wanted))
    action.data["autostart"] = wanted


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
        if observed.exists and not observed.managed and not self.params["adopt"]:
            raise ConflictError("a domain named %s exists on %s but was not created by machinery.compute; set "
                                "adopt: true to take it over" % (self.name, self.ctx.name or self.ctx.uri), "name")
        record = observed.record
        if observed.exists and record is None:
            record = adoption_record(observed, self.params["image"], now().isoformat())
        current = None  # the owned values, when read here already
        if self.spec is None:
            if self.prepared is not None and self.prepared.matches(observed, self.ctx.uri):
                self.spec = self.prepared.spec  # the preflight normalized against what this run observes too
            else:
                if not observed.exists and self.state != "absent":
                    self.ctx.require_registration()
                current = options.owned_values(observed.tree, record) if observed.exists else None
                facts = machine_spec.resolve(self.params, self.ctx, record)
                # the volumes a dead run of this name listed in its journal are replaced by the create
                facts.taken_volumes -= set((observed.journal or {}).get("volumes") or [])
                self.spec = machine_spec.normalize(self.params, facts, record, current)
        if observed.exists and wants_rebuild(self.spec, record):
            observed.snapshots = observed.dom.snapshotNum(0)
        if observed.exists and self.spec.get("efi_vars") is not None:
            observed.efi_vars = efi_store.read(self.ctx, observed.tree, self.name)
        plan = plan_machine(self.spec, observed, record, current, restarted=self.power_done)
        # nothing is applied for variables that wait for the machine to be off: the plan alone says so
        self.restart_required = self.restart_required or plan.facts.get("efi_waiting", False)
        for action in plan.actions:
            if action.kind == "create":  # a plan that needs room is refused in check mode too
                check_room(self.ctx, self.spec, new_disks(self.spec))
                # the run's journal of the pool lists it from the first create on (a batch's check-mode
                # preflight plans every create of the batch before the first is made)
                self.ctx.planned_creates[self.name] = planned_volumes(self.spec)
            elif action.kind == "update" and action.data["grows"] and self.room:
                self.check_resize_room(action.data["grows"])
        return plan

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
