# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Many machines at once across pools, in one process: one connection per pool, a thread per machine.

Machines without a pool are scheduled (a machine that exists stays where it is); every machine is converged
with MachineService in parallel; a machine that a concurrent run crowded out (its pool filled up, or its name
appeared on another pool first) is rescheduled against fresh pool snapshots, a bounded number of times.
Machines with state absent are deleted from every pool that has them.
"""

from __future__ import annotations

import json

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet, in_parallel
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    MachineryError, NameTaken, PoolFull, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules
from ansible_collections.machinery.compute.plugins.module_utils.coordination import journals as journal
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import freeze
from ansible_collections.machinery.compute.plugins.module_utils.core.progress import Progress
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import table
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import schedule

SCHEDULING_KEYS = machine_spec.SCHEDULING_KEYS


class BatchOutcome:
    def __init__(self):
        self.changed = False
        self.machines = {}
        self.actions = {}  # name -> the short forms of its planned actions
        self.placements = {}
        self.before = {}
        self.after = {}
        self.warnings = []
        self.failures = []
        self.attempts = 0

    def record(self, spec, outcome):
        name = spec["name"]
        self.machines[name] = outcome.machine
        if outcome.actions:
            self.actions[name] = list(outcome.actions)
        if outcome.changed:
            self.changed = True
            self.before[name] = outcome.before
            self.after[name] = outcome.after
        self.warnings.extend("%s: %s" % (name, warning) for warning in outcome.warnings)

    def fail(self, spec, pool, exc, crowded_out=0):
        """``crowded_out``: on how many attempts concurrent runs took the room or the name the machine was placed
        on (the last refusal is ``exc``); said in the message, so the operator knows to raise retries or rerun."""
        done = list(getattr(exc, "done", None) or [])
        msg = str(exc)
        if crowded_out:
            msg = "crowded out by concurrent runs on %d attempt%s (retries %d): %s" % (
                crowded_out, "" if crowded_out == 1 else "s", crowded_out - 1, msg)
        self.failures.append({"name": spec["name"], "pool": pool, "reason": getattr(exc, "reason", "Error"),
                              "field": getattr(exc, "field", None), "msg": msg, "done": done})
        if done:  # the machine's steps before its failure changed the pool
            self.changed = True

    def done(self):
        """What the run did, machine by machine, including the steps of failed machines before they failed."""
        return (["%s: %s" % (name, summary) for name, summaries in sorted(self.actions.items())
                 for summary in summaries]
                + ["%s: %s" % (failure["name"], step) for failure in self.failures for step in failure.get("done") or []])


def _shape(machine):
    """A machine's options other than its name as one string, or None when they cannot be told apart that way."""
    if not isinstance(machine, dict) or not isinstance(machine.get("name"), str):
        return None
    try:
        return json.dumps({key: value for key, value in machine.items() if key != "name"}, sort_keys=True)
    except (TypeError, ValueError):
        return None


def validated(machines, defaults=None):
    """Each machine through machine_spec.params (with ``defaults`` under its own keys); errors name the element.

    A fleet's machines are often alike but for their names (a role's list made from one template): a machine
    whose other options equal those of one already validated takes that one's spec with its own name, checked
    as params checks it (nothing else params derives depends on the name). 1,000 alike: 0.26 s -> 0.03 s."""
    specs, problems = [], []
    alike = {}  # _shape -> the spec of the first machine of that shape
    for index, machine in enumerate(machines):
        field = "machines[%d]" % index
        try:
            shape = _shape(machine)
            if shape is not None and shape in alike:
                specs.append(freeze(dict(alike[shape], name=check.dns_label(machine["name"], field + ".name"))))
                continue
            specs.append(machine_spec.params(machine, field, scheduling=True, defaults=defaults))
            if shape is not None:
                alike[shape] = specs[-1]
        except ValidationError as exc:
            if exc.field == "defaults":
                raise
            problems.append(exc)
    if len(problems) == 1:
        raise ValidationError("nothing was changed; %s" % problems[0].message, problems[0].field)
    if problems:  # every bad machine at once, as the preflight reports what only the pools can tell
        raise ValidationError("nothing was changed; %s" % "; ".join(str(exc) for exc in problems), "machines")
    seen = set()
    for index, spec in enumerate(specs):
        if spec["name"] in seen:
            raise ValidationError("machine %s is listed twice" % spec["name"], "machines[%d].name" % index)
        seen.add(spec["name"])
    return specs


def machine_params(spec, unique_across):
    """The machine params of a scheduled machine (machine_spec.params with scheduling), without the scheduling
    keys, unique across ``unique_across``: derived, not checked again."""
    params = {key: value for key, value in spec.items() if key not in SCHEDULING_KEYS}
    params["unique_across"] = list(unique_across)
    return freeze(params)


def _run(jobs, workers, work, progress=None):
    """[(job, result or exception)] of work(job) for every job, run on up to ``workers`` threads; ``progress``
    (a Progress) hears of each machine as it begins and ends."""
    def guarded(job):
        if progress is not None:
            progress.begin(job[0]["name"])
        try:
            return job, work(job)
        except MachineryError as exc:
            return job, exc
        except lv.libvirt.libvirtError as exc:
            # the pool's daemon went away or refused: say which pool, and why
            return job, MachineryError("libvirt error on pool %s (%s): %s"
                                       % (job[1].name or job[1].uri, job[1].uri, lv.describe(exc)))
        finally:
            if progress is not None:
                progress.end(job[0]["name"])
    return in_parallel(interleaved(jobs), guarded, workers)


def interleaved(jobs):
    """The jobs taken from each pool in turn (each pool's in the order given): a pool changes at most
    APPLYING_PER_POOL machines at once, so a run of jobs on one pool would hold threads the other pools could use."""
    by_pool = {}
    for job in jobs:
        by_pool.setdefault(job[1].uri, []).append(job)
    queues = list(by_pool.values())
    return [queue[index] for index in range(max((len(queue) for queue in queues), default=0))
            for queue in queues if index < len(queue)]


def preflight(jobs, specs, workers):
    """Every placed machine planned in check mode first: an invalid one fails the run before any write.

    Returns {name: outcome} of the machines already converged (an empty plan): the real run would observe and
    plan them again to the same empty plan, so their check-mode outcome is their outcome; and {name: Prepared}
    of the specs normalized, which the real run reuses while it observes what the preflight observed."""
    index = {spec["name"]: position for position, spec in enumerate(specs)}
    problems = []
    converged = {}
    prepared = {}
    for (spec, _ctx), outcome in _run(jobs, workers, lambda job: MachineService(job[1], True)
                                      .ensure(machine_params(job[0], []))):
        if isinstance(outcome, MachineryError) and not isinstance(outcome, (PoolFull, NameTaken)):
            field = "machines[%d]%s" % (index[spec["name"]], "." + outcome.field if outcome.field else "")
            problems.append("%s: %s" % (field, outcome.message))
        elif not isinstance(outcome, MachineryError) and not outcome.plan.actions and \
                not (spec.get("state") == "running" and spec.get("wait") == "address"):
            converged[spec["name"]] = outcome  # waiting for an address is the real run's, not check mode's
        if not isinstance(outcome, MachineryError) and outcome.prepared is not None:
            prepared[spec["name"]] = outcome.prepared
    if problems:
        raise ValidationError("nothing was changed; %s" % "; ".join(problems), "machines")
    return converged, prepared


MAX_WORKERS = 256
MAX_RETRIES = 100


def journaled_names(fleet, snapshots):
    """{uri: names} of the machines whose journal a pool's registry holds: a create killed before its domain was
    defined left its volumes there, and a deletion of that name must clean them up, as the machine module does."""
    found = {}
    for snapshot in snapshots:
        ctx = fleet.contexts.get(snapshot["uri"])
        if ctx is not None and snapshot["state"] == "Ready":
            found[snapshot["uri"]] = journal.journaled(ctx.registry)
    return found


def pool_problems(snapshots):
    """Why pools were left out, for a machine placed nowhere: '; pool3 unreachable: <cause>' per pool."""
    return "".join("; %s %s: %s" % (snapshot["name"], "unreachable" if snapshot["state"] == "Offline" else "not ready",
                                    snapshot.get("problem") or "no cause given")
                   for snapshot in snapshots if snapshot["state"] != "Ready")


def converge(entries, specs, strategy=options.default(options.MACHINE_BATCH, "strategy"),
             retries=options.default(options.MACHINE_BATCH, "retries"),
             workers=options.default(options.MACHINE_BATCH, "workers"), check_mode=False, opener=None,
             topology_spread=None, coordination=None):
    """Converge ``specs`` (machine_spec.params with the scheduling keys, one per machine) over the pools;
    ``topology_spread`` spreads the batch's own machines over pool labels."""
    retries = check.whole_number(retries, "retries", 0, MAX_RETRIES)
    spread = placement_rules.spread_constraints(topology_spread)  # checked before any pool is read
    workers = check.whole_number(workers, "workers", 1, MAX_WORKERS)
    fleet = Fleet(entries, opener, coordination)
    result = BatchOutcome()
    prepared = {}
    progress = Progress("machines", total=len({spec["name"] for spec in specs}))
    try:
        snapshots = fleet.snapshots()
        absent = [spec for spec in specs if spec.get("state") == "absent"]
        pending = [spec for spec in specs if spec.get("state") != "absent"]
        journaled = journaled_names(fleet, snapshots) if absent else {}
        deletions = [(spec, fleet.contexts[snapshot["uri"]]) for spec in absent for snapshot in snapshots
                     if snapshot["uri"] in fleet.contexts and (spec["name"] in snapshot["machines"] or
                                                               spec["name"] in journaled.get(snapshot["uri"], ()))]
        for (spec, ctx), outcome in _run(deletions, workers, lambda job: MachineService(job[1], check_mode)
                                         .ensure(machine_params(job[0], [])), progress):
            if isinstance(outcome, MachineryError):
                result.fail(spec, ctx.name, outcome)
            else:
                result.record(spec, outcome)
        for spec in absent:
            result.machines.setdefault(spec["name"], {"name": spec["name"], "pool": None, "phase": "Terminated"})
            progress.end(spec["name"])
        if absent:
            # a machine to delete may live on a pool that could not be read: say so, never claim it gone there
            result.warnings.extend("%s was not read, so machines to delete were not looked for there: %s"
                                   % (snapshot["name"], snapshot.get("problem")) for snapshot in snapshots
                                   if snapshot["state"] == "Offline")
        image_sizes = machine_spec.local_image_sizes(pending)  # read once: the scheduler counts them as storage
        while pending:
            result.attempts += 1
            by_uri = {snapshot["uri"]: snapshot for snapshot in snapshots}
            # the batch's machines created in an earlier attempt count for the spread as those placed now
            placements = schedule(pending, snapshots, strategy, strict=False, field="machines", topology_spread=spread,
                                  spread_members=[spec["name"] for spec in specs if spec.get("state") != "absent"],
                                  image_sizes=image_sizes)
            jobs = []
            for spec, placement in zip(pending, placements):
                result.placements[spec["name"]] = placement
                if placement["uri"] is None:
                    result.failures.append({"name": spec["name"], "pool": None, "reason": "Unschedulable",
                                            "field": "machine_pool", "done": [],
                                            "msg": placement["reason"] + pool_problems(snapshots)})
                    progress.end(spec["name"])
                else:
                    jobs.append((spec, fleet.contexts[placement["uri"]]))
            if result.attempts == 1:
                converged, prepared = preflight(jobs, specs, workers)
                for spec, _ctx in jobs:
                    if spec["name"] in converged:
                        result.record(spec, converged[spec["name"]])
                        progress.end(spec["name"])
                jobs = [job for job in jobs if job[0]["name"] not in converged]
            crowded = []
            for (spec, ctx), outcome in _run(jobs, workers, lambda job: MachineService(job[1], check_mode)
                                             .ensure(machine_params(job[0], fleet.uris),
                                                     prepared.get(job[0]["name"])), progress):
                if isinstance(outcome, (PoolFull, NameTaken)) and result.attempts <= retries:
                    crowded.append(spec)
                    progress.undo(spec["name"])
                elif isinstance(outcome, MachineryError):
                    result.fail(spec, by_uri[ctx.uri]["name"], outcome,
                                crowded_out=result.attempts if isinstance(outcome, (PoolFull, NameTaken)) else 0)
                else:
                    result.record(spec, outcome)
            pending = crowded
            if pending:
                snapshots = fleet.snapshots()
        if not check_mode:
            # every pool of the run, not only those a machine was converged on: a killed batch may have left its
            # lock on a pool this run had nothing to do on; and again where a machine's run cleared it while
            # other machines of this run still held the pool's lock
            for snapshot in snapshots:
                ctx = fleet.contexts.get(snapshot["uri"])
                if ctx is not None and snapshot["state"] == "Ready":
                    try:
                        ctx.clear_abandoned_lock(again=True)
                    except (MachineryError, lv.libvirt.libvirtError):
                        pass  # housekeeping: a pool gone away meanwhile is reported by the run's own work
    finally:
        fleet.close()
    return result


def summary(result, specs, returned="all"):
    """The result of a batch: ``machines`` and ``placements`` list every machine (``returned`` all), those the run
    changed or would change in check mode (changed), or none; the table and ``counts`` (machines by phase) always
    cover them all. A fleet of thousands returns its statuses only when asked: each costs the module, and
    ansible-core on both ends, about 1.4 KB of JSON."""
    machines = [result.machines[spec["name"]] for spec in specs if spec["name"] in result.machines]
    shown = [machine for machine in machines if machine.get("phase") != "Terminated"]
    counts = {}
    for machine in machines:
        counts[machine["phase"]] = counts.get(machine["phase"], 0) + 1
    if returned == "all":
        listed = set(result.machines)
    else:
        listed = set(result.actions) if returned == "changed" else set()
    return {"machines": [machine for machine in machines if machine["name"] in listed],
            "placements": [result.placements[spec["name"]] for spec in specs
                           if spec["name"] in result.placements and spec["name"] in listed],
            "failures": result.failures, "counts": counts,
            "table": table(sorted(shown, key=lambda machine: (machine.get("pool") or "", machine["name"]))),
            "attempts": result.attempts}
