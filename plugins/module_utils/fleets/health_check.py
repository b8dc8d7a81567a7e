# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine health checks (OpenShift's MachineHealthCheck on libvirt pools), through observe -> plan -> apply.

The machines a check covers are those of its pools whose labels match its selector. Each is unhealthy when one
of the unhealthy conditions (OR-ed) has held for its timeout, or when it has never been Ready for
``node_startup_timeout`` after its creation. Since when a condition holds is kept in the machine's record: every
run that observes a machine records the conditions that changed (``health`` in the record), so a timeout counts
from the first observation of the bad state, across runs. When more machines are unhealthy than
``max_unhealthy`` allows, nothing is remediated. Remediation deletes the machine (its set replaces it) or
restarts it in place.

The conditions are what libvirt shows: Ready (the domain runs), VolumesReady and NetworkInterfacesReady (from
the machine's status), Failed (crashed, or paused by an I/O error), AddressAssigned (a machine with a NIC on
a libvirt network has a DHCP lease), GuestAgentConnected (a running machine's guest-agent channel is connected:
the agent in the guest answers) and Booted (the check's ``boot_marker`` has appeared on the serial console since
the machine last started; read from the console log's tail until it has, then taken from the record).

NodeReady is the guest's readiness, what a Kubernetes Node's Ready means to OpenShift's health checks, never
merely a running domain: True when the machine runs and its guest agent answers; where the guest has no agent
(it never answered since the machine's health was first recorded), when it also has a DHCP lease on its libvirt
network (or no NIC on one); False when it does not run, or runs with neither; Unknown when an agent that
answered before has fallen silent (readiness can no longer be observed). A ``node_startup_timeout`` of 0 disables
the startup check.
"""

from __future__ import annotations

import threading

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConflictError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import in_parallel
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.machines.power import update_record
from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import read_fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets import lost_pool
from ansible_collections.machinery.compute.plugins.module_utils.fleets.lost_pool import age, seconds
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import now

CONSOLE_TAIL = 256 * 1024  # how much of a console log the Booted condition reads
# the record's mark that a condition has been True once since the machine's health was first recorded
STARTED = {"Ready": "ever_ready", "NodeReady": "ever_node_ready"}


def normalize_check(params):
    params = options.defaulted(options.MACHINE_HEALTH_CHECK, params)
    name = check.dns_label(params.get("name"), "name")
    match = check.labels(((params.get("selector") or {}).get("match_labels")), "selector.match_labels")
    if not match:
        raise ValidationError("needs at least one label, or the check would cover every machine",
                              "selector.match_labels")
    rules = []
    for index, item in enumerate(params.get("unhealthy_conditions") or []):
        where = "unhealthy_conditions[%d]" % index
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping with type, status and timeout", where)
        rules.append({"type": check.one_of(item.get("type"), options.CONDITION_TYPES, where + ".type"),
                      "status": check.one_of(str(item.get("status")), ("True", "False", "Unknown"),
                                             where + ".status"),
                      "timeout": seconds(item.get("timeout"), where + ".timeout")})
    limit = params["max_unhealthy"]
    if isinstance(limit, str) and limit.strip().endswith("%"):
        try:
            percent = int(limit.strip()[:-1])
        except ValueError:
            raise ValidationError("%r is not a number or a percentage such as 40%%" % (limit,),
                                  "max_unhealthy") from None
        if not 0 <= percent <= 100:
            raise ValidationError("must be between 0%% and 100%%, got %s" % limit, "max_unhealthy")
        limit = {"percent": percent}
    else:
        limit = {"count": check.whole_number(limit, "max_unhealthy", minimum=0)}
    marker = params.get("boot_marker")
    if marker is not None and (not isinstance(marker, str) or not marker.strip() or "\n" in marker):
        raise ValidationError("must be one line of text that the guest prints on its serial console", "boot_marker")
    if marker is None and any(rule["type"] == "Booted" for rule in rules):
        raise ValidationError("condition Booted needs boot_marker, the line the guest prints once it has booted",
                              "unhealthy_conditions")
    return {"name": name, "match_labels": match, "rules": rules, "boot_marker": marker,
            "startup": seconds(params["node_startup_timeout"], "node_startup_timeout") or None,  # 0: disabled
            "started_by": STARTED[check.one_of(params["startup_condition"], tuple(STARTED), "startup_condition")],
            "max_unhealthy": limit,
            "remediation": check.one_of(params["remediation"], options.REMEDIATIONS, "remediation"),
            "unreachable_timeout": None if params.get("unreachable_timeout") is None else
            seconds(params["unreachable_timeout"], "unreachable_timeout")}


def conditions_of(machine):
    """{type: "True" | "False"} of a machine's status."""
    found = {condition["type"]: condition["status"] for condition in machine.get("conditions") or []}
    found["Failed"] = "True" if machine.get("phase") == "Failed" else "False"
    on_network = any(nic.get("network") for nic in machine.get("network_interfaces") or [])
    found["AddressAssigned"] = "True" if machine.get("ip_addresses") or not on_network else "False"
    # observed only for running machines (see HealthCheckResource.observe); otherwise the record keeps the last
    for kind, key in (("GuestAgentConnected", "agent_connected"), ("Booted", "booted")):
        if machine.get(key) is not None:
            found[kind] = "True" if machine[key] else "False"
    found["NodeReady"] = node_ready(machine, found["AddressAssigned"])
    return found


def node_ready(machine, address_assigned):
    """NodeReady (see the module's docstring): the guest agent's answer, or the address of a guest without one."""
    if machine.get("phase") != "Running":
        return "False"
    if machine.get("agent_connected"):
        return "True"
    if "ever_agent" in (machine.get("health") or {}):
        return "Unknown"  # it answered before: silent now, readiness cannot be observed
    return address_assigned


def transitions(machine, moment):
    """The machine's recorded ``health`` brought up to date: {type: {status, since}} (since = ISO time)."""
    recorded = dict(machine.get("health") or {})
    for kind, status in conditions_of(machine).items():
        if (recorded.get(kind) or {}).get("status") != status:
            recorded[kind] = {"status": status, "since": moment}
    now_seen = conditions_of(machine)
    marks = dict(STARTED, GuestAgentConnected="ever_agent")
    for kind, mark in marks.items():
        if now_seen.get(kind) == "True":
            recorded[mark] = {"status": "True", "since": (recorded.get(mark) or {}).get("since") or moment}
    return recorded


def verdict(desired, machine, health, moment):
    """The reasons ``machine`` is unhealthy (empty when it is healthy)."""
    reasons = []
    for rule in desired["rules"]:
        seen = health.get(rule["type"]) or {}
        if seen.get("status") == rule["status"]:
            held = age(seen.get("since"), moment)
            if held >= rule["timeout"]:
                reasons.append("%s=%s for %ds (timeout %ds)" % (rule["type"], rule["status"], held, rule["timeout"]))
    if desired["startup"] is not None and desired["started_by"] not in health and machine.get("created"):
        waited = age(machine["created"], moment)
        if waited >= desired["startup"]:
            reasons.append("not Ready %ds after its creation (node_startup_timeout %ds)" % (waited, desired["startup"]))
    return reasons


def timing(desired, machine, health):
    """Whether a rule or the startup timeout is still timing the machine: a rule's condition holds, or it has not
    been Ready once since its creation, but not yet for its timeout. Such a machine is not unhealthy yet, nor
    healthy: the machine-api-operator counts it out of currentHealthy."""
    if any((health.get(rule["type"]) or {}).get("status") == rule["status"] for rule in desired["rules"]):
        return True
    return desired["startup"] is not None and desired["started_by"] not in health and bool(machine.get("created"))


def allowed_count(limit, total):
    if "count" in limit:
        return limit["count"]
    return limit["percent"] * total // 100


def plan_check(desired, machines, moment, lost=None):
    """Remediations: pure, from the check, the machines (statuses with their recorded ``health``), the time and,
    with ``unreachable_timeout``, ``lost``: {reachable: {pool URI: bool}, sets: [{name, record, uris}]}, the
    documents of the sets the check covers that record their members (``lost_pool``) and the pools holding them.
    A member on a pool Offline for the timeout is unhealthy (PoolReachable=False); its remediation, whatever
    ``remediation`` says, is its replacement: the set's record says so, and the set's next run makes another
    member and fences this one when its pool is back."""
    covered = [machine for machine in machines
               if all((machine.get("labels") or {}).get(key) == value for key, value in desired["match_labels"].items())]
    unhealthy, waiting = [], []
    for machine in covered:
        health = transitions(machine, moment)
        reasons = verdict(desired, machine, health, moment)
        if reasons:
            unhealthy.append({"name": machine["name"], "pool": machine.get("pool"), "uri": machine.get("uri"),
                              "phase": machine.get("phase"), "reasons": reasons})
        elif timing(desired, machine, health):
            waiting.append(machine["name"])
    stranded, reachability = [], [{"name": machine["name"], "pool": machine.get("pool"),
                                   "condition": lost_pool.condition(True)} for machine in covered]
    sets = (lost or {}).get("sets") or [] if desired.get("unreachable_timeout") is not None else []
    seen = {machine["name"] for machine in machines}
    for entry in sets:
        facts = lost_pool.assess(entry["record"], lost["reachable"], seen, desired["unreachable_timeout"], moment)
        for member in facts["lost"]:
            stranded.append(member)
            reachability.append({"name": member["name"], "pool": member["pool"],
                                 "condition": lost_pool.condition(False, member["since"])})
            if member["replace"]:
                unhealthy.append({"name": member["name"], "pool": member["pool"], "uri": member["uri"],
                                  "phase": "Unknown", "reasons": ["PoolReachable=False for %ds (unreachable_timeout "
                                                                  "%gs)" % (member["for"],
                                                                            desired["unreachable_timeout"])]})
            else:  # its pool's timeout is still timing it
                waiting.append(member["name"])
    total = len(covered) + len(stranded)
    allowed = allowed_count(desired["max_unhealthy"], total)
    facts = {"covered": total, "unhealthy": unhealthy, "waiting": sorted(waiting), "max_unhealthy": allowed,
             "remediation_allowed": len(unhealthy) <= allowed,
             "pool_reachable": sorted(reachability, key=lambda item: item["name"])}
    warnings = []
    if not facts["remediation_allowed"]:
        warnings.append("%d of %d machines are unhealthy, more than max_unhealthy (%d): nothing is remediated"
                        % (len(unhealthy), total, allowed))
    # the sets' records first: the unreachable marks (written whatever max_unhealthy says) and the replacements
    actions = []
    for entry in sets:
        _assessed, document = lost_pool.check_update(
            entry["record"], lost["reachable"], seen, desired["unreachable_timeout"], moment,
            facts["remediation_allowed"])
        if document is None:
            continue
        given_up = sorted(set(document["replaced"]) - set((entry["record"].get("replaced") or {})))
        actions.append(Action("replace" if given_up else "record", entry["name"],
                              {"replaced": sorted(entry["record"].get("replaced") or {})},
                              {"replaced": sorted(document["replaced"])},
                              [step("write_document", keys.set_key(entry["name"]), pool=uri) for uri in entry["uris"]],
                              uri=entry["uris"][0], uris=entry["uris"], document=document,
                              generations=entry.get("generations") or {},
                              reasons=["%s: replaced, its pool unreachable since %s" % (
                                  name, document["replaced"][name]["since"]) for name in given_up]))
    if facts["remediation_allowed"]:
        kind = desired["remediation"]
        actions += [Action(kind, machine["name"], {"phase": machine["phase"]},
                           {"phase": "Terminated" if kind == "delete" else "Running"},
                           [step("delete_machine" if kind == "delete" else "restart_machine", machine["name"],
                                 pool=machine["pool"])], uri=machine["uri"], reasons=machine["reasons"])
                    for machine in unhealthy if machine["phase"] != "Unknown"]
    return Plan(actions, warnings, **facts)


class HealthCheckResource(Resource):
    """One health check over the pools of ``fleet``, for ``converge``."""

    def __init__(self, fleet, params, check_mode=False):
        self.fleet = fleet
        self.params = options.defaulted(options.MACHINE_HEALTH_CHECK, params)
        self.check_mode = check_mode
        self.desired = normalize_check(self.params)
        self.moment = now().isoformat()
        self.plan_facts = None
        self.lost_view = None
        # {(uri, machine): health} the last observation found changed, recorded after the run (record_health)
        self.pending_health = {}
        self._pending_guard = threading.Lock()

    def describe(self):
        return "machine health check %s" % self.desired["name"]

    def holds(self, plan, observed):
        """The members it deletes or restarts, on their pools, for the whole remediation: a restart's stop and
        start are one operation (the machine module's runs inside take the same holds). And the set whose
        document it writes, on each pool it writes it to: machine_set writes the same document."""
        contexts = self.fleet.contexts
        members = [self.fleet.coordination.of(contexts[action.data["uri"]], action.target)
                   for action in plan.actions if action.kind in ("delete", "restart")]
        sets = [self.fleet.coordination.set_of(contexts[uri], action.target)
                for action in plan.actions if action.kind in ("record", "replace")
                for uri in action.data["uris"] if uri in contexts]
        return sets + members

    def observe(self):
        """The machines the check covers, each with the ``health`` its record keeps and the conditions that changed
        since (so timeouts count across runs). It writes nothing: outside check mode the changed conditions are
        recorded once the run is done (``record_health``), each under a hold on its machine."""
        _snapshots, contexts, machines = read_fleet(self.fleet)
        by_uri = {ctx.uri: ctx for ctx in contexts}
        covered = [machine for machine in machines if all((machine.get("labels") or {}).get(key) == value
                                                          for key, value in self.desired["match_labels"].items())]

        def keep(machine):
            ctx = by_uri[machine["uri"]]
            dom = lv.lookup_domain(ctx.conn, machine["name"])
            record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))) if dom else None
            machine["health"] = (record or {}).get("health") or {}
            if dom is not None and machine.get("phase") == "Running":
                self.observe_guest(ctx, dom, machine)
            elif self.desired["boot_marker"] is not None:
                machine["booted"] = False  # the log starts afresh (append=off) when it starts again
            health = transitions(machine, self.moment)
            if not self.check_mode and dom is not None and health != machine["health"]:
                with self._pending_guard:
                    self.pending_health[(machine["uri"], machine["name"])] = health
                machine["health"] = health
        in_parallel(covered, keep, 16)
        self.lost_view = self.observe_sets(contexts) if self.desired["unreachable_timeout"] is not None else None
        return covered

    def observe_sets(self, contexts):
        """The documents of the sets this check covers that record their members, each the newest of those the
        reachable pools hold, with the pools that hold one (where a change is written); and which pools answer."""
        documents = {}
        for ctx in contexts:
            for key in ctx.registry.keys(keys.SET_PREFIX):
                document = ctx.registry.get(key)
                if isinstance(document, dict) and "members" in document and \
                        lost_pool.covers(document, self.desired["match_labels"]):
                    documents.setdefault(document["name"], []).append(
                        (ctx.uri, document, ctx.registry.read_generation(key)))
        reached = {ctx.uri for ctx in contexts}
        return {"reachable": {uri: uri in reached for uri in self.fleet.uris},
                "sets": [{"name": name, "record": lost_pool.trusted([doc for _uri, doc, _gen in held]),
                          "uris": [uri for uri, _doc, _gen in held],
                          "generations": {uri: gen for uri, _doc, gen in held}}
                         for name, held in sorted(documents.items())]}

    def observe_guest(self, ctx, dom, machine):
        """The guest's own signals of a running machine: its agent channel's state (live XML), and whether the
        boot marker is on the console (the log's tail, read only until the record says it was seen)."""
        try:
            live = dx.parse(dom.XMLDesc(0))
        except lv.libvirt.libvirtError:
            return  # it stopped meanwhile: the next run sees it
        target = live.find("devices/channel/target[@name='%s']" % dx.GUEST_AGENT)
        if target is not None:
            machine["agent_connected"] = target.get("state") == "connected"
        marker = self.desired["boot_marker"]
        if marker is None:
            return
        if (machine["health"].get("Booted") or {}).get("status") == "True":
            machine["booted"] = True
            return
        vol = lv.lookup_volume(ctx.storage, "%s-console.log" % machine["name"])
        if vol is None:
            machine["booted"] = False
            return
        size = vol.info()[1]
        tail = storage.download_bytes(ctx.conn, vol, offset=max(0, size - CONSOLE_TAIL))
        machine["booted"] = marker.encode() in tail

    def plan(self, observed):
        plan = plan_check(self.desired, observed, self.moment, self.lost_view)
        if self.plan_facts is None:  # what the run found, before it remediated anything
            self.plan_facts = plan.facts
        return plan

    def apply(self, action, observed):
        super().apply(action, observed)
        if action.kind in ("record", "replace"):
            return
        # the remediated machine starts its health afresh
        with self._pending_guard:
            self.pending_health.pop((action.data["uri"], action.target), None)
        dom = lv.lookup_domain(self.fleet.contexts[action.data["uri"]].conn, action.target)
        if dom is not None:
            update_record(dom, lambda record: record.pop("health", None))

    def record_health(self):
        """Write the conditions the run found changed into each machine's record, holding the machine (so a
        machine task's definition of it and this write never cross). A machine another run holds now is left for
        the next run, which finds the same change; returns a warning naming those."""
        left = []
        with self._pending_guard:
            pending, self.pending_health = sorted(self.pending_health.items()), {}
        for (uri, name), health in pending:
            ctx = self.fleet.contexts.get(uri)
            if ctx is None:
                continue
            try:
                with self.fleet.coordination.machine(ctx.conn, name, ctx.uri, timeout=0):
                    dom = lv.lookup_domain(ctx.conn, name)
                    if dom is not None:
                        update_record(dom, lambda record, health=health: record.__setitem__("health", health))
            except ConflictError:
                left.append(name)
        if not left:
            return []
        return ["the health conditions of %s were not recorded: another run holds %s now (the next run records "
                "them)" % (", ".join(left), "it" if len(left) == 1 else "them")]

    def _delete(self, action, _observed):
        service = MachineService(self.fleet.contexts[action.data["uri"]])
        service.ensure(machine_spec.params({"name": action.target, "state": "absent",
                                            "shutdown_timeout": self.params["shutdown_timeout"]}))

    def _restart(self, action, _observed):
        service = MachineService(self.fleet.contexts[action.data["uri"]])
        service.ensure(machine_spec.params({"name": action.target, "state": "stopped",
                                            "shutdown_timeout": self.params["shutdown_timeout"]}))
        service.ensure(machine_spec.params({"name": action.target, "state": "running"}))

    def _record(self, action, _observed):
        """The set's document, with its marks and replacements, to every reachable pool that holds one."""
        for uri in action.data["uris"]:
            # compare and swap: written only over the document the plan was made from
            self.fleet.contexts[uri].registry.put(keys.set_key(action.target), action.data["document"],
                                                  expect=(action.data.get("generations") or {}).get(uri))

    APPLY = {"delete": _delete, "restart": _restart, "record": _record, "replace": _record}
