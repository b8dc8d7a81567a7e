# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A machine's plan, pure: the actions that take an observation (machine_observe.Observed) to the normalized spec
(machine_spec.py). Nothing here reads libvirt or the registry, or the clock: ``plan_observed`` is what the
machine resource (machine.py) calls, and a unit test calls it on a recorded observation with no connection.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import efi_vars as efi
from ansible_collections.machinery.compute.plugins.module_utils.core import firmware as fw
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.pools import security_groups as sgs
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, PoolFull
from ansible_collections.machinery.compute.plugins.module_utils.machines.changes import live_effects
from ansible_collections.machinery.compute.plugins.module_utils.machines.creation import create_steps
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import reserved_nics
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_spec import ephemeral_volumes
from ansible_collections.machinery.compute.plugins.module_utils.machines.rebuild import rebuild_action
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity

SHOWN_AT_CREATION = ("cpu", "memory", "machine_class", "labels")
CAPABILITIES_SHOWN = ("topology", "disk_qos", "ip_reservations")


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


def plan_observed(params, observed, restarted=False):
    """The plan of the machine resource from a completed observation (machine.MachineResource._complete): a
    domain of that name that the collection did not create is refused unless ``adopt``; an adopted one is planned
    from the record about to be written for it."""
    if observed.exists and not observed.managed and not params["adopt"]:
        raise ConflictError("a domain named %s exists on %s but was not created by machinery.compute; set "
                            "adopt: true to take it over" % (observed.name, observed.pool), "name")
    record = observed.record if observed.record is not None else observed.adopted
    return plan_machine(observed.spec, observed, record, observed.current, restarted=restarted)


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
