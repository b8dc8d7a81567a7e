# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Moving a machine to another pool, converged through observe -> plan -> apply (see convergence.py).

cold (any two pools, over any URI): the guest is shut down; every file the machine has in its pool's storage
(disks, seed ISO, Ignition file, console log) is streamed through libvirt into the target's storage with its
holes kept, so a thin qcow2 overlay stays thin; the base image is cached on the target by its checksum first
(streamed from the source's cache when the target lacks it, its sha256 checked on the way); the domain is
defined on the target with the same name, UUID, MACs and record, started if it ran, and only then deleted from
the source.
live (where the two daemons reach each other): libvirt's peer-to-peer migration with an incremental copy of
the writable disks onto overlays prepared on the target, the read-only files streamed beforehand.

A move is journaled: before its first write it puts ``move-<machine>`` (what it moves where, whether the guest
ran, the volumes it makes) into the registry of both pools, and removes it last. A run that dies leaves the
machine whole on one pool and the journal behind; the next run resolves it (``resolve_interrupted``): before
the copy was defined on the target, the partial copy is discarded and the move made again; after that, the move
is finished. A move that fails (rather than dies) before the source is deleted is rolled back at once.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination.holds import MOVE, check_held
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import (
    Action, Plan, Resource, converge, step)
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    HoldLost, MachineryError, NotFoundError, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.machines.addresses import wait_for_address
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import machine_status
from ansible_collections.machinery.compute.plugins.module_utils.fleets import move_policy
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_apply import MoveExecutor, Report, Run
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_observe import MoveObserver, Pools
from ansible_collections.machinery.compute.plugins.module_utils.fleets.move_plan import (
    MODES, journal_body, move_steps, recovery_steps)

# the pieces (see docs/architecture.md): move_observe.py reads both pools and the journals, the planner below
# turns what it read into actions (with the pure move_plan.py), move_apply.py carries out their steps


class MoveRequest:
    """The module's parameters checked: the machine, the pool to move it off (``source_uri``) and to
    (``target_uri``, resolved from a name among ``pools``), mode, strategy and shutdown timeout (the option
    table's defaults for those left out)."""

    def __init__(self, pools, params):
        self.pools = pools
        params = options.defaulted(options.MACHINE_MIGRATE, params)
        self.machine = check.dns_label(params.get("machine"), "machine")
        self.mode = check.one_of(params["mode"], MODES, "mode")
        self.strategy = params["strategy"]
        self.shutdown_timeout = check.timeout_seconds(params["shutdown_timeout"], "shutdown_timeout", True)
        self.policy = move_policy.parse(params.get("policy"))
        self.source_uri = lv.validate_uri(params["uri"], "uri") if params.get("uri") else None
        self.target_name = params.get("target")
        # a move made to resize the machine (resize_move.py, never a module option): the target is checked for
        # the class and size the machine is about to get, not the ones it has
        self.resize_to = params.get("resize_to")
        self.target_uri = self._target(params.get("target"))
        if self.source_uri and self.source_uri == self.target_uri:
            raise ValidationError("%s is the pool the machine is moved off (uri); name another pool"
                                  % params["target"], "target")
        if not self.source_uri and not params.get("target"):
            raise ValidationError("give the pool to move the machine off (uri) or the pool to move it to (target)",
                                  "uri")

    def _target(self, target):
        """The URI of the requested target: as given, or of the pool of ``pools`` with that name."""
        if target in (None, ""):
            return None
        if not isinstance(target, str):
            raise ValidationError("must be a pool name or a libvirt URI", "target")
        if "://" in target:
            return lv.validate_uri(target, "target")
        for entry in self.pools.entries:
            if entry.get("name") == target:
                return entry["uri"]
        for entry in self.pools.entries:  # registered names, for pools given by URI alone
            try:
                if self.pools.get(entry["uri"]).name == target:
                    return entry["uri"]
            except MachineryError:
                continue
        raise NotFoundError("no pool named %s among pools (%s)" % (target, ", ".join(
            entry.get("name") or entry["uri"] for entry in self.pools.entries) or "none given"), "target")


# --- the planner ------------------------------------------------------------------------------------------------

def plan_move(obs, machine, shutdown_timeout, warnings):
    """The move's plan from what ``MoveObserver`` read: the resolution of an interrupted move first, then the new
    move (unless the resolution found it cannot be made)."""
    actions = []
    if obs.recovery:
        actions.append(recovery_action(obs, machine))
    if obs.facts is not None and obs.problem is None:
        facts = obs.facts
        journal = journal_body(machine, facts["uuid"], obs.mode, facts["was_running"], facts["source"],
                               facts["target"], [item["volume"] for item in facts["files"]],
                               [image["volume"] for image in facts["missing_images"]])
        steps = move_steps(facts, obs.mode, facts["was_running"], shutdown_timeout)
        actions.append(Action("move", machine, {"pool": facts["source"]["pool"]},
                              {"pool": facts["target"]["pool"], "mode": obs.mode}, steps,
                              journal=journal, reason=obs.reason, origin=facts["source"],
                              destination=facts["target"]))
    return Plan(actions, list(warnings))


def recovery_action(obs, machine):
    """finish, discard or discard_copy an interrupted move (move_plan.resolve_interrupted); roll_back when the
    move cannot be made again, so the guest goes back to where it was."""
    kind, source, target, present = obs.recovery
    steps = recovery_steps(kind, obs.journal, source.facts(), target.facts(), present)
    if obs.problem is not None and kind != "finish":
        kind = "roll_back"  # the move cannot be made again: the guest goes back to where it was
        if obs.journal.get("was_running") and not source.active:
            steps.insert(-1, step("start", machine, pool=source.pool))
    end = target if kind == "finish" else source
    return Action(kind, machine, {"pool": source.pool, "interrupted": "move to %s" % target.pool},
                  {"pool": end.pool}, steps, origin=source.where(), destination=end.where())


# --- the resource -----------------------------------------------------------------------------------------------

class MoveResource(Resource):
    """One machine's move, for ``converge``: ``params`` are the module's (machine, uri, target, mode, strategy,
    shutdown_timeout), ``pools`` the fleet's PoolContexts."""

    def __init__(self, pools, params, check_mode=False):
        self.pools = pools
        self.params = params
        self.check_mode = check_mode
        self.request = MoveRequest(pools, params)
        self.machine = self.request.machine
        self.report = Report()
        self.observer = MoveObserver(pools, self.request, self.report.warnings)
        self.executor = MoveExecutor(self.machine, self.report, self.request.policy)
        self.executor.fence = lambda before: check_held(list(self.held.values()), before)
        self.held = {}  # uri: this run's hold on the machine there

    def hold(self, uri):
        """Hold the machine on pool ``uri`` for the rest of the run: a second move of it waits for this one, and
        the machine module refuses to change it meanwhile (it reads the holder in the journal)."""
        if uri not in self.held:
            ctx = self.pools.get(uri)
            hold = self.pools.coordination.machine(ctx.conn, self.machine, uri, operation=MOVE)
            self.held[uri] = hold.acquire()
        return self.held[uri]

    def hold_home(self):
        """Hold the machine where it is before anything is observed: the pool to move it off (``uri``), or the
        first pool of the run that has it."""
        if self.request.source_uri:
            self.hold(self.request.source_uri)
            return
        for uri in [entry["uri"] for entry in self.pools.entries] + [self.request.target_uri]:
            try:
                if uri and lv.lookup_domain(self.pools.get(uri).conn, self.machine) is not None:
                    self.hold(uri)
                    return
            except MachineryError:
                continue  # unreachable: the observation warns about it

    def release(self):
        for hold in self.held.values():
            hold.release()
        self.held = {}

    def holder(self):
        return next((hold.marker for hold in self.held.values() if hold.marker), None)

    def holds(self, plan, observed):
        """None for ``converge`` to take: a move holds the machine on its pool from before it observes it
        (``hold_home``, called by ``run``) and on the target once it knows it (``_move``, ``_resolve``), for the
        whole run; the holds are this run's coordination's, so they are the same holds converge would take."""
        return ()

    @property
    def warnings(self):
        return self.report.warnings

    @property
    def downtime(self):
        return self.report.downtime

    def describe(self):
        return "the move of machine %s" % self.machine

    def observe(self):
        return self.observer.observe()

    def plan(self, observed):
        return plan_move(observed, self.machine, self.request.shutdown_timeout, self.report.warnings)

    def _move(self, action, obs):
        self.hold(obs.source.uri)
        self.hold(obs.target.uri)
        journal = dict(action.data["journal"], holder=self.holder())
        self.executor.move(action.steps, Run(obs.source, obs.target, journal, obs.facts))

    def _resolve(self, action, obs):
        """An interrupted move finished, discarded or rolled back; a new move that cannot be made is refused
        once that is done."""
        _kind, source, target, _present = obs.recovery
        self.hold(source.uri)
        self.hold(target.uri)
        self.executor.execute(action.steps, Run(source, target, obs.journal))
        if obs.problem is not None:
            what = "finished" if action.kind == "finish" else "rolled back"
            end = target if action.kind == "finish" else source
            raise type(obs.problem)("the interrupted move of %s to %s was %s, the machine is on %s; %s"
                                    % (self.machine, target.pool, what, end.pool, obs.problem.message),
                                    obs.problem.field)

    APPLY = {"move": _move, "finish": _resolve, "discard": _resolve, "discard_copy": _resolve, "roll_back": _resolve}


# --- the service the module calls -------------------------------------------------------------------------------

def run(entries, params, check_mode=False, opener=None, coordination=None):
    """Move one machine as ``params`` say: (plan, the module's return beyond what the plan gives)."""
    pools = Pools(entries, opener, coordination)
    params = options.defaulted(options.MACHINE_MIGRATE, params)
    resource = None
    try:
        resource = MoveResource(pools, params, check_mode)
        if not check_mode:
            resource.hold_home()
        try:
            plan, obs = converge(resource, check_mode)
        except Exception as exc:
            if not isinstance(exc, HoldLost):  # a failure of a run that lost its holds meanwhile says that first
                try:
                    check_held(list(resource.held.values()), "its next step")
                except HoldLost as lost:
                    lost.done = list(getattr(exc, "done", None) or [])
                    raise lost from exc
            raise
        side = obs.done or obs.source  # after a move its target; in check mode where the machine is now
        machine = machine_status(side.dom, side.ctx) if side is not None and side.exists else None
        if not check_mode and machine and side.active and params.get("wait") == "address":
            nics = (side.record or {}).get("spec", {}).get("network_interfaces")
            timeout = params["wait_timeout"] or options.default(options.MACHINE_MIGRATE, "wait_timeout")  # 0 as unset
            wait_for_address(side.ctx, side.dom, resource.machine, nics, float(timeout))
            machine = machine_status(side.dom, side.ctx)
        move = plan.find("move")
        ends = [action.data for action in plan.actions]
        return plan, {"machine": machine,
                      "source": ends[0]["origin"] if ends else None,
                      "target": ends[-1]["destination"] if ends else None,
                      "mode": move.after["mode"] if move is not None else None,
                      "reason": move.data["reason"] if move is not None else None,
                      "downtime": resource.downtime,
                      "migration": resource.report.migration,
                      "warnings": sorted(set(resource.warnings))}
    finally:
        if resource is not None:
            resource.release()
        pools.close()
