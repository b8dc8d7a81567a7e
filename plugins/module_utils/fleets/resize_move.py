# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A resize its pool has no room for, with ``allow_move``: the machine moves cold to a pool that fits its new size
(the migrate core: journaled, rolled back when it fails), then is resized there as on any pool."""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Plan
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import migrate
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import (
    pool_entries, read_each, read_snapshots)
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import pick_target
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import Unschedulable


def move_pools(given, allow_move):
    """The pools ``allow_move`` may move a machine to, as pool entries ([] when none are given), checked whenever
    they are given: a wrong entry would otherwise pass every run until the first resize that needs a move."""
    if given is None or (given == [] and not allow_move):
        return []
    if given == []:
        raise ValidationError("is empty, so allow_move has no pool to move the machine to: name the pools it may "
                              "move to, or leave pools out", "pools")
    return pool_entries(given)


def found_elsewhere(error, source_uri, entries):
    """``error`` (machine_spec's: no machine of that name on the pool) saying on which pools of ``entries`` a
    machine of that name is, when one holds it; pools that cannot be read are passed over."""
    name = getattr(error, "absent_machine", None)
    if not name or not entries:
        return error

    def look(ctx, entry):
        dom = lv.lookup_domain(ctx.conn, name)
        if dom is None or dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))) is None:
            return None
        return "%s (%s)" % (ctx.name or entry.get("name") or entry["uri"], entry["uri"])
    others = [entry for entry in entries if entry["uri"] != source_uri]
    found = [where for where in read_each(others, look, lambda _entry, _cause: None) if where]
    if not found:
        return error
    told = type(error)("%s. A machine of that name is on %s, of pools" % (error.message, " and ".join(found)),
                       error.field)
    told.absent_machine, told.done = name, error.done
    return told


def placement_request(resize):
    """What the scheduler reads of the machine at its new size (``resize`` is the refusal's)."""
    return {"name": resize["name"], "machine_class": resize["machine_class"],
            "size": {"cpu": resize["cpu"], "memory": resize["memory"]}, "machine_pool_selector": {},
            "tolerations": resize["tolerations"], "machine_pool": None}


def target_for(refusal, source_uri, entries):
    """The pool of ``entries`` that fits the new size best (spread), other than the machine's own; the refusal,
    with the scheduler's reasons, when none does."""
    snapshots = read_snapshots([entry for entry in entries if entry["uri"] != source_uri])
    try:
        chosen, reason = pick_target(placement_request(refusal.resize), snapshots, source_uri)
    except Unschedulable as exc:
        raise type(refusal)("%s (%s)" % (refusal.message, exc.message), refusal.field) from None
    return chosen, reason


def resize_elsewhere(ctx, params, refusal, entries, check_mode=False, opener=None):
    """Move the machine of ``params`` off the pool of ``ctx`` to a pool of ``entries`` that fits its new size,
    then resize it there: (the plan of both, the resize's machine_service.Outcome). Check mode plans both and
    writes nothing."""
    if not entries:
        raise type(refusal)("%s: give the pools it may move to (pools)" % refusal.message, "pools")
    chosen, reason = target_for(refusal, ctx.uri, entries)
    source = {"name": ctx.name, "uri": ctx.uri}
    move_params = {"machine": params["name"], "uri": ctx.uri, "target": chosen["uri"], "mode": "cold",
                   "shutdown_timeout": params["shutdown_timeout"], "wait": "none",
                   "resize_to": {key: value for key, value in placement_request(refusal.resize).items()
                                 if key in ("machine_class", "size")}}
    moved_plan, moved = migrate.run([source, {"name": chosen["name"], "uri": chosen["uri"]}], move_params,
                                    check_mode, opener, ctx.coordination)
    warnings = list(moved.get("warnings") or [])
    warnings.append("%s did not fit pool %s at its new size: moved to %s (%s)"
                    % (params["name"], ctx.name or ctx.uri, chosen["name"], reason))
    if check_mode:  # the resize as it would be planned after the move: against the machine as it is now
        outcome = MachineService(ctx, True).ensure(params, room=False)
        return Plan(moved_plan.actions + outcome.plan.actions, warnings), outcome
    with lv.Connection(chosen["uri"]) as conn:
        target = PoolContext(conn, chosen["uri"], ctx.coordination)
        target.url_opener = opener
        try:
            outcome = MachineService(target).ensure(params)
        except MachineryError as exc:
            failure = type(exc)("%s was moved to pool %s to be resized; there: %s"
                                % (params["name"], chosen["name"], exc.message), exc.field)
            failure.done = ["move %s to %s" % (params["name"], chosen["name"])] + list(exc.done)
            raise failure from None
    return Plan(moved_plan.actions + outcome.plan.actions, warnings + outcome.warnings), outcome
