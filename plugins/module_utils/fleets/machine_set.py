# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Machine sets (OpenShift's MachineSet on libvirt pools), converged through observe -> plan -> apply.

A set is a name, a replica count, a selector and a machine template. Its members are the machines on its pools
whose labels match the selector and that carry its owner label (``machinery.compute/machine-set``); matching
machines that no set owns are adopted, machines another set owns are left alone. Every member carries the hash
of the template it was made from (``machinery.compute/template-hash``), so members made from an older template
are known. The set's definition is kept in every pool's registry (document ``set-<name>``), without the
template's secrets, so machine_set_info and the health checks find it without the playbook.

Planning is pure (``plan_set``): scale up places new members one by one on the pools holding the fewest
members that can take them (``spread``) or the fullest ones (``binpack``), through the scheduler's filters;
scale down takes the members marked ``machinery.compute/delete-machine`` first, then those not running, then
by ``delete_policy``; a rollout replaces out-of-date members in waves that never leave fewer than
``replicas - max_unavailable`` members running.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules
from ansible_collections.machinery.compute.plugins.module_utils.pools import scheduler
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import freeze, thaw
from ansible_collections.machinery.compute.plugins.module_utils.core.progress import Progress
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Action, Plan, Resource, step
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.fleets import lost_pool
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import in_parallel
from ansible_collections.machinery.compute.plugins.module_utils.coordination import keys
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine import MachineService
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import (
    AVAILABILITY_CONDITIONS, age, list_machines, now, table)
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

OWNER_LABEL = "machinery.compute/machine-set"
HASH_LABEL = "machinery.compute/template-hash"
DELETE_LABEL = "machinery.compute/delete-machine"
# the template takes what the machine module takes, but name and uri (the set names its members)
TEMPLATE_KEYS = tuple(item.name for item in options.MACHINE + options.SCHEDULING if item.argument and
                      item.name not in ("name", "uri", "unique_across", "adopt", "allow_move", "rebuild", "wait",
                                        "wait_timeout"))
SCHEDULING_KEYS = tuple(item.name for item in options.SCHEDULING)
NOT_RUNNING = ("Failed", "Shutdown", "Terminating", "Terminated")


def set_key(name):
    return keys.set_key(name)


def count_of(value, total, field, round_up):
    """An int, or a percentage of ``total`` (``25%``), as Kubernetes counts max_surge and max_unavailable."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = int(value.strip()[:-1])
        except ValueError:
            raise ValidationError("%r is not a number or a percentage such as 25%%" % (value,), field) from None
        if not 0 <= percent <= 100:
            raise ValidationError("must be between 0%% and 100%%, got %s" % value, field)
        whole, part = divmod(percent * total, 100)
        return whole + (1 if round_up and part else 0)
    return check.whole_number(value, field, minimum=0)


def template_hash(template):
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def public_template(template):
    """The template as the pools' registries keep it: every secret of the machine's options (Ignition,
    cloud-init user-data, an encrypted volume's passphrase: the no_log options of ``options.MACHINE``) replaced by
    ``<secret>``; the template's hash tells a changed secret, the secret itself is never stored."""
    kept = copy.deepcopy(template)
    for path in options.secret_paths(options.MACHINE):
        _mask(kept, path)
    return kept


def _mask(value, path):
    """Replace what ``path`` (option names; a list on the way is walked item by item) names inside ``value``."""
    if isinstance(value, list):
        for item in value:
            _mask(item, path)
        return
    if not isinstance(value, dict) or path[0] not in value:
        return
    if len(path) == 1:
        if value[path[0]] is not None:
            value[path[0]] = "<secret>"
        return
    _mask(value[path[0]], path[1:])


def normalize_set(params):
    """The desired set, validated; errors name the field."""
    params = options.defaulted(options.MACHINE_SET, params)
    name = check.dns_label(params.get("name"), "name")
    if len(name) > 57:
        raise ValidationError("%r is too long: members are named <set>-<5 characters>, at most 63" % name, "name")
    desired = {"name": name, "state": check.one_of(params["state"], options.PRESENCE, "state")}
    if desired["state"] == "absent":
        return desired
    replicas = check.whole_number(params.get("replicas"), "replicas", minimum=0)
    template = params.get("template")
    if not isinstance(template, dict):
        raise ValidationError("must be a mapping of machine options (those of machinery.compute.machine but name "
                              "and uri)", "template")
    unknown = sorted(str(key) for key in template if key not in TEMPLATE_KEYS)
    if unknown:
        raise ValidationError("unknown option%s %s; a template takes %s" % (
            "s" if len(unknown) > 1 else "", ", ".join(unknown), ", ".join(TEMPLATE_KEYS)), "template")
    labels = check.labels(template.get("labels"), "template.labels")
    for key in (OWNER_LABEL, HASH_LABEL, DELETE_LABEL):
        if key in labels:
            raise ValidationError("%s is set by the machine set itself" % key, "template.labels.%s" % key)
    selector = params.get("selector") or {}
    if not isinstance(selector, dict):
        raise ValidationError("must be a mapping with match_labels", "selector")
    unknown = sorted(str(key) for key in selector if key != "match_labels")
    if unknown:
        raise ValidationError("unknown key %s; a selector has match_labels" % ", ".join(unknown), "selector")
    match = check.labels(selector.get("match_labels"), "selector.match_labels")
    if not match:
        raise ValidationError("needs at least one label, or the set would take every machine", "selector.match_labels")
    missing = sorted(key for key, value in match.items() if labels.get(key) != value)
    if missing:
        raise ValidationError("does not match the template's labels (%s): a new member would not be a member"
                              % ", ".join("%s=%s" % (key, match[key]) for key in missing), "selector")
    template = dict(template, labels=labels)
    # the template's options are checked once, as every machine's are; members are made from the result
    member = machine_spec.params(dict(template, name="%s-00000" % name), "template", scheduling=True)
    if member["state"] in ("absent", "restarted"):
        raise ValidationError("a member's state is what every run keeps it in: running, present, stopped, paused "
                              "or suspended (delete members with replicas or state: absent on the set; restart "
                              "them with machinery.compute.machine)", "template.state")
    rollout = params.get("rollout")
    if rollout is not None:
        if not isinstance(rollout, dict):
            raise ValidationError("must be a mapping with max_unavailable and max_surge", "rollout")
        surge = count_of(rollout.get("max_surge", options.default(options.MACHINE_SET, "rollout.max_surge")),
                         replicas, "rollout.max_surge", True)
        unavailable = count_of(rollout.get("max_unavailable",
                                           options.default(options.MACHINE_SET, "rollout.max_unavailable")),
                               replicas, "rollout.max_unavailable", False)
        if surge == 0 and unavailable == 0:
            raise ValidationError("max_surge and max_unavailable cannot both be 0: nothing could be replaced",
                                  "rollout")
        rollout = {"max_surge": surge, "max_unavailable": unavailable}
    desired.update(replicas=replicas, selector={"match_labels": match}, template=template, member=member,
                   template_hash=template_hash(template),
                   delete_policy=check.one_of(params["delete_policy"], options.DELETE_POLICIES,
                                              "delete_policy"),
                   strategy=check.one_of(params["strategy"], options.STRATEGIES, "strategy"),
                   rollout=rollout, topology_spread=placement_rules.spread_constraints(params.get("topology_spread")),
                   unreachable_timeout=None if params.get("unreachable_timeout") is None else
                   lost_pool.seconds(params["unreachable_timeout"], "unreachable_timeout"),
                   # the template's local image files, read once: the scheduler counts their size as storage
                   image_sizes=machine_spec.local_image_sizes([member]))
    return desired


def definition(desired, members_made=0, created=None):
    """The document every pool of the set keeps; ``members_made`` counts the member names handed out and
    ``created`` is when the set was first recorded (each absent until known: the documents of sets made before
    them stay as they were)."""
    document = {key: desired[key] for key in ("name", "replicas", "selector", "delete_policy", "strategy",
                                              "rollout", "template_hash")}
    document["template"] = public_template(desired["template"])
    if desired.get("topology_spread"):  # only when given: the documents of sets without one stay as they were
        document["topology_spread"] = desired["topology_spread"]
    if members_made:
        document["members_made"] = members_made
    if created:
        document["created"] = created
    return document


def lost_member(set_name, desired, entry):
    """A member on an Offline pool, as the set counts it until it is replaced: its phase is Unknown."""
    return {"name": entry["name"], "pool": entry["pool"], "uri": entry["uri"], "phase": "Unknown", "lost": True,
            "labels": {OWNER_LABEL: set_name, HASH_LABEL: desired["template_hash"]}}


# --- observation, classified --------------------------------------------------------------------------------

def classify(name, match, machines):
    """(members, orphans, foreign) among ``machines`` (statuses with pool and uri): members carry this set's
    owner label, orphans match the selector with no owner, foreign ones belong to another set."""
    members, orphans, foreign = [], [], []
    for machine in machines:
        labels = machine.get("labels") or {}
        if any(labels.get(key) != value for key, value in match.items()):
            continue
        owner = labels.get(OWNER_LABEL)
        if owner == name:
            members.append(machine)
        elif owner:
            foreign.append(machine)
        else:
            orphans.append(machine)
    return members, orphans, foreign


def member_name(set_name, taken, counter=0):
    """The first name <set>-<5 hex> not in ``taken``, derived from the set's name (stable, so a check-mode
    run shows the names the real run will use)."""
    while True:
        candidate = "%s-%s" % (set_name, hashlib.sha256(("%s/%d" % (set_name, counter)).encode()).hexdigest()[:5])
        if candidate not in taken:
            return candidate, counter + 1
        counter += 1


def victims(members, count, policy, seed):
    """The ``count`` members to delete: marked first, then those not running, then by the delete policy."""
    def rank(member):
        marked = (member.get("labels") or {}).get(DELETE_LABEL) not in (None, "", "false")
        return (0 if marked else 1, 0 if member.get("phase") in NOT_RUNNING else 1)
    ordered = sorted(members, key=lambda member: member["name"])
    if policy == "Random":
        random.Random(seed).shuffle(ordered)
    elif policy in ("Newest", "Oldest"):
        ordered.sort(key=lambda member: member.get("created") or "", reverse=policy == "Newest")
    ordered.sort(key=rank)  # stable: the policy's order within each rank
    return ordered[:count]


def place(desired, names, snapshots, members):
    """Pool snapshot for each new member: spread puts each on the pools with the fewest members of the set that
    can take it (so no pool holds two more than another while capacity allows), binpack on the fullest."""
    pools = copy.deepcopy([snapshot for snapshot in snapshots if snapshot.get("state") == "Ready"])
    count = {pool["name"]: 0 for pool in pools}
    for member in members:
        if member.get("pool") in count:
            count[member["pool"]] += 1
    spread = desired.get("topology_spread")
    group = desired["member"].get("server_group")
    by_name = {pool["name"]: pool for pool in pools}
    for member in members:
        # members planned in earlier waves are in no snapshot yet, and the set's spread and group count them (those
        # a rollout deletes are still in them: a hard rule is kept, never broken, while the old ones go)
        pool = by_name.get(member.get("pool"))
        if pool is None:
            continue
        if member["name"] not in (pool.get("machines") or ()):
            pool["machines"] = list(pool.get("machines") or ()) + [member["name"]]
        if group:
            pool["server_groups"] = dict(pool.get("server_groups") or {}, **{member["name"]: thaw(group)})
    placements = []
    placed_names = []
    for name in names:
        machine = dict(desired["member"], name=name)
        # a server group's rules and a topology spread see every pool at once (an affinity group's members may be
        # on any of them, a spread counts domains across pools)
        groups = sorted({count[pool["name"]] for pool in pools}) if desired["strategy"] == "spread" and \
            not machine.get("server_group") and not spread else [None]
        placed = None
        reason = "no pool is Ready"
        for level in groups:
            candidates = [pool for pool in pools if level is None or count[pool["name"]] == level]
            found = scheduler.schedule([machine], candidates, desired["strategy"], strict=False, field="template",
                                       topology_spread=spread, image_sizes=desired.get("image_sizes"),
                                       spread_members=[member["name"] for member in members] + placed_names)[0]
            reason = found["reason"]
            if found["pool"] is not None:
                placed = next(pool for pool in candidates if pool["name"] == found["pool"])
                break
        if placed is None:
            placements.append((name, None, reason))
            continue
        request = scheduler.machine_request(machine, "template", desired.get("image_sizes"))
        size = scheduler.size_on(request, placed)
        placed["allocated"] = {"cpu": placed["allocated"]["cpu"] + size["cpu"],
                               "memory": placed["allocated"]["memory"] + size["memory"]}
        if placed.get("storage"):
            placed["storage"] = dict(placed["storage"], allocated=placed["storage"]["allocated"] + request["storage"])
        if request["server_group"]:
            placed["server_groups"] = dict(placed.get("server_groups") or {}, **{name: request["server_group"]})
        placed.setdefault("machines", []).append(name)
        placed_names.append(name)
        count[placed["name"]] += 1
        placements.append((name, placed, reason))
    return placements


def _create(desired, name, pool, wave=0):
    return Action("create", name, {}, {"pool": pool["name"], "template_hash": desired["template_hash"]},
                  [step("create_machine", name, pool=pool["name"])], uri=pool["uri"], pool=pool["name"], wave=wave)


def _delete(member, wave=0, why="scale down"):
    return Action("delete", member["name"], {"pool": member["pool"]}, {},
                  [step("delete_machine", member["name"], pool=member["pool"])], uri=member["uri"],
                  pool=member["pool"], wave=wave, why=why)


def _fence(name, entry, volumes):
    return Action("fence", name, {"pool": entry["pool"], "phase": "Replaced"}, {"phase": "Terminated"},
                  [step("destroy", name, pool=entry["pool"]), step("undefine", name, pool=entry["pool"])],
                  uri=entry["uri"], pool=entry["pool"], volumes=volumes, why="replaced while its pool was unreachable")


def _reclaim(name, entry, volumes):
    return Action("reclaim", name, {}, {}, [step("delete_volume", volume, pool=entry["pool"]) for volume in volumes],
                  uri=entry["uri"], pool=entry["pool"], volumes=volumes)


def lost_pools(desired, observed, seen, moment):
    """The set's standing with pools it cannot reach (``lost_pool.assess``) and the fences and reclaims for the
    members it replaced whose pool is back. Returns (facts, actions, warnings)."""
    record = lost_pool.trusted([pool.get("definition") for pool in observed["pools"]])
    reachable = {pool["uri"]: pool.get("state") != "Offline" for pool in observed["pools"]}
    facts = lost_pool.assess(record, reachable, seen, desired["unreachable_timeout"], moment)
    found = observed.get("replaced_found") or {}
    fence, reclaim, settled, foreign = lost_pool.fence_plan(facts["replaced"], reachable, found, desired["name"])
    actions = [_fence(name, facts["replaced"][name], reclaim.get(name, [])) for name in fence]
    actions += [_reclaim(name, facts["replaced"][name], volumes) for name, volumes in sorted(reclaim.items())
                if volumes]
    warnings = ["%s on pool %s is not a member of set %s (it does not carry its owner label): left alone, though "
                "the set replaced a member of that name there" % (name, facts["replaced"][name]["pool"], desired["name"])
                for name in foreign]
    # what the record says after the run: the fenced and reclaimed members are gone from their pool
    facts.update(record=record, fenced=fence, foreign=foreign,
                 kept=sorted(set(facts["replaced"]) - set(fence) - set(reclaim) - set(settled) - set(foreign)),
                 newly_replaced=[entry["name"] for entry in facts["lost"] if entry["replace"]])
    return facts, actions, warnings


def plan_set(desired, observed, moment=None):
    """The set's plan: pure, from the desired set, the observation (``MachineSetResource.observe``) and the time
    (``moment``, ISO): when a set first recorded is made, and how long pools were unreachable."""
    name = desired["name"]
    members, orphans, _foreign = classify(name, (desired.get("selector") or {}).get("match_labels")
                                          or {OWNER_LABEL: name}, observed["machines"])
    actions, warnings = [], []
    if desired["state"] == "absent":
        actions += [_delete(member, why="set deleted") for member in members]
        actions += [Action("forget", pool["name"], steps=[step("delete_document", set_key(name))], uri=pool["uri"])
                    for pool in observed["pools"] if pool.get("definition") is not None]
        return Plan(actions)
    lost, first = None, []
    everyone = members + orphans
    taken = {machine["name"] for machine in observed["machines"]}
    if desired.get("unreachable_timeout") is not None:
        seen = {member["name"]: member for member in everyone}
        lost, first, warned = lost_pools(desired, observed, seen, moment)
        warnings += warned
        # a replaced member's copy on a pool that is back is no member: it is fenced
        everyone = [member for member in everyone if member["name"] not in lost["replaced"]]
        everyone = everyone + [lost_member(name, desired, entry) for entry in lost["lost"] if not entry["replace"]]
        # a replaced member's name is never given again while the record knows it: one identity, one machine
        taken |= set((lost["record"] or {}).get("members") or {}) | set(lost["replaced"])
        for entry in lost["lost"]:
            warnings.append("%s: pool %s unreachable for %ds (since %s)%s" % (
                entry["name"], entry["pool"], entry["for"], entry["since"],
                "; replaced on the reachable pools" if entry["replace"] else
                "; replaced after %gs (unreachable_timeout)" % desired["unreachable_timeout"]))
    for orphan in orphans:
        actions.append(Action("adopt", orphan["name"], {"labels": orphan.get("labels") or {}},
                              {"labels": dict(orphan.get("labels") or {}, **{OWNER_LABEL: name})},
                              [step("update_labels", orphan["name"], pool=orphan["pool"])], uri=orphan["uri"],
                              pool=orphan["pool"], labels=dict(orphan.get("labels") or {}, **{OWNER_LABEL: name})))
    counter = members_made(observed["pools"])
    planned = list(everyone)
    if len(everyone) < desired["replicas"]:
        names, after = [], {}
        for _index in range(desired["replicas"] - len(everyone)):
            new, after[new] = member_name(name, taken, after[names[-1]] if names else counter)
            taken.add(new)
            names.append(new)
        unplaced = []
        for new, pool, reason in place(desired, names, observed["snapshots"], everyone):
            if pool is None:
                unplaced.append((new, reason))
            else:
                actions.append(_create(desired, new, pool))
                counter = max(counter, after[new])
        # only the names of members made are handed out: a set the pools have no room for records nothing new,
        # so the next run (and this one's verification) plans the same names again instead of new ones
        warnings += unplaced_warnings(unplaced, len(names))
    elif len(everyone) > desired["replicas"]:
        seed = "%s/%s" % (name, ",".join(sorted(member["name"] for member in everyone)))
        here = [member for member in everyone if not member.get("lost")]  # one on an Offline pool cannot go
        doomed = victims(here, min(len(here), len(everyone) - desired["replicas"]), desired["delete_policy"], seed)
        actions += [_delete(member) for member in doomed]
        everyone = [member for member in everyone if member not in doomed]
    stale = [member for member in everyone
             if (member.get("labels") or {}).get(HASH_LABEL) != desired["template_hash"]]
    if stale and desired.get("rollout"):
        coming = sum(1 for action in actions if action.kind == "create")
        waves, stopped, counter = rollout_waves(desired, everyone, stale, observed["snapshots"], taken, counter,
                                                coming)
        actions += waves
        warnings += stopped
    elif stale:
        warnings.append("%d member(s) were made from another template (%s); they are replaced only with rollout"
                        % (len(stale), ", ".join(sorted(member["name"] for member in stale))))
    # the record goes first, with how many member names were handed out: a replacement never takes the name of
    # the member it replaces, as OpenShift's do not, even when this run fails before it is made
    recorded = [pool["definition"] for pool in observed["pools"] if pool.get("definition") is not None]
    # when the set was first recorded (its AGE); a set recorded before the field was kept has none
    created = next((item.get("created") for item in recorded if item.get("created")), None) if recorded \
        else moment
    document = definition(desired, counter, created)
    if lost is not None:
        document = lost_pool.with_revision(dict(document, **lost_pool.lost_document(
            desired["unreachable_timeout"], membership(planned, actions), lost["unreachable"],
            {key: lost["replaced"][key] for key in lost["kept"]})), lost["record"])
    # with unreachable_timeout, the diff shows what the record says of unreachable pools and replaced members
    shown = ({}, {}) if lost is None else (
        {"unreachable": dict((lost["record"] or {}).get("unreachable") or {}),
         "replaced": sorted((lost["record"] or {}).get("replaced") or {})},
        {"unreachable": dict(document["unreachable"]), "replaced": sorted(document["replaced"])})
    records = [Action("record", pool["name"], shown[0], shown[1], steps=[step("write_document", set_key(name))],
                      uri=pool["uri"], document=document, generation=pool.get("generation"))
               for pool in observed["pools"] if pool.get("state") == "Ready" and pool.get("definition") != document]
    # fences come before anything else, the set's record next (so a new member never runs before it is known)
    return Plan(first + records + actions, warnings, stale=sorted(member["name"] for member in stale), lost=lost)


def membership(members, actions):
    """{member: {pool, uri}} once ``actions`` are carried out, as the set's record keeps it."""
    kept = {member["name"]: {"pool": member["pool"], "uri": member["uri"]} for member in members}
    for action in actions:
        if action.kind == "create":
            kept[action.target] = {"pool": action.data["pool"], "uri": action.data["uri"]}
        elif action.kind == "delete":
            kept.pop(action.target, None)
    return kept


def unplaced_warnings(unplaced, wanted, shown=3):
    """One warning per reason for the new members no pool has room for (``unplaced``: (name, reason) pairs of
    ``wanted`` new ones), naming a few: a set of 5000 on pools that hold 60 says so in one line, not 4940."""
    by_reason = {}
    for name, reason in unplaced:
        by_reason.setdefault(reason.replace(" for %s" % name, "").replace(name, "<member>"), []).append(name)
    lines = []
    for reason, names in by_reason.items():
        more = " and %d more" % (len(names) - shown) if len(names) > shown else ""
        lines.append("%d of %d new member(s) cannot be placed (%s%s): %s"
                     % (len(names), wanted, ", ".join(names[:shown]), more, reason))
    return lines


def members_made(pools):
    """How many member names the set has handed out, by the pools' records (the most any of them says)."""
    return max([int((pool.get("definition") or {}).get("members_made") or 0) for pool in pools] or [0])


def rollout_waves(desired, members, stale, snapshots, taken, counter, coming=0):
    """Replace ``stale`` members in waves that never leave fewer than ``replicas - max_unavailable`` members
    running (the floor) nor more than ``replicas + max_surge`` members in all. With a surge each wave first makes
    new members (and waits for them to run), then deletes the old ones the floor allows; without, it deletes
    first, then makes as many as replicas allow. A member not running costs the floor nothing to delete.
    ``coming`` new members are made before the first wave (a scale up). Returns (actions, warnings, the name
    counter after the names it handed out)."""
    replicas = desired["replicas"]
    surge, unavailable = desired["rollout"]["max_surge"], desired["rollout"]["max_unavailable"]
    floor = max(replicas - unavailable, 0)
    present = [member for member in members if member not in stale]
    fresh = len(present) + coming
    running = sum(1 for member in members if member.get("phase") == "Running") + coming
    queue = sorted(stale, key=lambda member: (member.get("phase") == "Running", member["name"]))
    actions, warnings = [], []
    wave = 0
    while queue or fresh < replicas:
        wave += 1
        deletes, creates = [], []
        if not surge:
            running = _leave(queue, running, floor, wave, deletes)
        making = max(0, min(replicas + surge - fresh - len(queue), replicas - fresh))
        names = []
        for _index in range(making):
            new, counter = member_name(desired["name"], taken, counter)
            taken.add(new)
            names.append(new)
        unplaced = []
        for new, pool, reason in place(desired, names, snapshots, present + queue):
            if pool is None:
                unplaced.append((new, reason))
                continue
            creates.append(_create(desired, new, pool, wave))
            present.append({"name": new, "pool": pool["name"], "phase": "Running"})
        warnings += unplaced_warnings(unplaced, len(names))
        fresh += len(creates)
        running += len(creates)
        if surge:
            running = _leave(queue, running, floor, wave, deletes)
        if not deletes and not creates:
            warnings.append("the rollout stops at wave %d: %d member(s) running, the floor is %d (replicas - "
                            "max_unavailable), and no new member can be made" % (wave, running, floor))
            break
        actions += creates + deletes if surge else deletes + creates
    return actions, warnings, counter


def _leave(queue, running, floor, wave, deletes):
    """Take from ``queue`` the old members that can go now: those not running, and running ones while
    ``running`` stays at least ``floor``; their deletes go to ``deletes``. Returns the members left running."""
    while queue and (queue[0].get("phase") != "Running" or running - 1 >= floor):
        member = queue.pop(0)
        running -= member.get("phase") == "Running"
        deletes.append(_delete(member, wave, "rollout"))
    return running


def member_spec(desired, name, wait, wait_timeout, unique_across=()):
    """The machine params of a new member, from the template's (checked once, in normalize_set); the
    scheduling keys stay with the set."""
    spec = {key: value for key, value in desired["member"].items() if key not in SCHEDULING_KEYS}
    spec["labels"] = dict(spec.get("labels") or {}, **{OWNER_LABEL: desired["name"],
                                                       HASH_LABEL: desired["template_hash"]})
    spec.update(name=name, wait=wait, wait_timeout=wait_timeout, unique_across=list(unique_across))
    if spec.get("run_strategy") is None:
        spec["run_strategy"] = member_strategy(desired)
    return freeze(spec)


def member_strategy(desired):
    """The run strategy of a new member whose template names none: the one the template's state implies, as for a
    machine (running, the default, is always; present manual; stopped halted), but manual rather than always in a
    set that replaces the members of an unreachable pool (unreachable_timeout), since a host that comes back must
    not start the copies the set replaced meanwhile (it has no agent to stop them); the set's runs and its health
    check bring such members back."""
    implied = machine_spec.STATE_STRATEGY[desired["member"]["state"]]
    if desired.get("unreachable_timeout") is not None and implied == "always":
        return "manual"
    return implied


def counts(desired, members):
    """replicas, ready_replicas (Running) and available_replicas (Running with every availability condition
    True: Ready, VolumesReady, NetworkInterfacesReady)."""
    ready = [member for member in members if member.get("phase") == "Running"]
    available = [member for member in ready
                 if all(condition["status"] == "True" for condition in member.get("conditions") or []
                        if condition["type"] in AVAILABILITY_CONDITIONS)]
    return {"replicas": len(members), "desired_replicas": desired.get("replicas", 0),
            "ready_replicas": len(ready), "available_replicas": len(available)}


# --- observe and apply over the fleet -----------------------------------------------------------------------

def read_fleet(fleet):
    """Snapshots for the scheduler, every machine's status, and each pool's record of ``set_key`` documents."""
    snapshots = fleet.snapshots()
    contexts = [fleet.contexts[snapshot["uri"]] for snapshot in snapshots if snapshot["uri"] in fleet.contexts
                and snapshot.get("state") != "Offline"]
    # the sets count machines by their conditions, not by what their guest agents say: not asked
    listings = in_parallel(contexts, lambda ctx: list_machines(ctx, guest=False), len(contexts) or 1)
    machines = []
    for ctx, listing in zip(contexts, listings):
        for machine in listing:
            machine["pool"] = machine.get("pool") or ctx.name or ctx.uri
            machines.append(machine)
    return snapshots, contexts, machines


class MachineSetResource(Resource):
    """One machine set over the pools of ``fleet`` (fleet.Fleet), for ``converge``."""

    def __init__(self, fleet, params, check_mode=False):
        self.fleet = fleet
        self.params = options.defaulted(options.MACHINE_SET, params)
        self.check_mode = check_mode
        self.desired = normalize_set(self.params)
        self.failures = []
        self.moment = now().isoformat()  # one clock reading per run: its plans and its verification agree
        self.unreachable = set()
        self.prepared = {}  # member -> machine.Prepared of its create (prepare_creates)

    def describe(self):
        return "machine set %s" % self.desired["name"]

    def holds(self, plan, observed):
        """The set, on every pool of the run that answers: a second run of the set waits, then plans from what
        the first one left (never more members than the larger replicas). Each member's create or delete then
        holds that member too (the machine resource's converge)."""
        return [self.fleet.coordination.set_of(self.fleet.contexts[pool["uri"]], self.desired["name"])
                for pool in observed["pools"] if pool["state"] != "Offline" and pool["uri"] in self.fleet.contexts]

    def observe(self):
        snapshots, contexts, machines = read_fleet(self.fleet)
        pools = []
        for ctx in contexts:
            pools.append({"name": ctx.name or ctx.uri, "uri": ctx.uri, "state": "Ready" if ctx.registration
                          else "Error", "definition": ctx.registry.get(set_key(self.desired["name"])),
                          "generation": ctx.registry.read_generation(set_key(self.desired["name"]))})
        reached = {ctx.uri for ctx in contexts}
        # the pools that could not be read: members there are unknown (lost_pool)
        pools += [{"name": snapshot["name"], "uri": snapshot["uri"], "state": "Offline", "definition": None}
                  for snapshot in snapshots if snapshot["uri"] not in reached]
        if any(machine["name"] == self.desired["name"] for machine in machines):
            raise ValidationError("a machine named %s exists on the pools: a set and its members' prefix would be "
                                  "confused with it; pick another name" % self.desired["name"], "name")
        observed = {"snapshots": snapshots, "machines": machines, "pools": pools}
        self.unreachable = {pool["uri"] for pool in pools if pool["state"] == "Offline"}
        if self.desired.get("unreachable_timeout") is not None:
            record = lost_pool.trusted([pool["definition"] for pool in pools])
            observed["replaced_found"] = read_replaced((record or {}).get("replaced") or {},
                                                       {ctx.uri: ctx for ctx in contexts})
        return observed

    def plan(self, observed):
        return plan_set(self.desired, observed, self.moment)

    def apply_plan(self, plan, observed):
        """Records and adoptions first; then each wave's creates and deletes, in parallel within a step (a
        rollout's creates run, and wait for Running, before its deletes)."""
        for action in plan.actions:
            self.applier(action.handler)  # a kind without a method is a bug: found before anything is done
        # the stale copies of replaced members go first, before the set records or makes anything
        steps = [[a for a in plan.actions if a.kind == "fence"], [a for a in plan.actions if a.kind == "reclaim"],
                 [a for a in plan.actions if a.kind in ("record", "forget")],
                 [a for a in plan.actions if a.kind == "adopt"]]
        waves = sorted({a.data.get("wave", 0) for a in plan.actions if a.kind in ("create", "delete")})
        surge_first = not self.desired.get("rollout") or self.desired["rollout"]["max_surge"] > 0
        for wave in waves:
            creates = [a for a in plan.actions if a.kind == "create" and a.data.get("wave", 0) == wave]
            deletes = [a for a in plan.actions if a.kind == "delete" and a.data.get("wave", 0) == wave]
            steps += [creates, deletes] if surge_first or wave == 0 else [deletes, creates]
        # what the one waiting sees: each member's create or delete as it ends ("4 of 6 actions done")
        progress = Progress("actions", total=sum(len(group) for group in steps))

        def one(action):
            name = "%s %s" % (action.kind, action.target)
            # a run paused past its lease while another run took the set over stops here (HoldLost), before it
            # changes a member the other run decided about
            self.fence(name)
            progress.begin(name)
            try:
                return self.apply_one(action, observed)
            finally:
                progress.end(name)
        for group in steps:
            self.prepare_creates(group)
            outcomes = in_parallel(group, one, self.params["workers"])
            for action, outcome in zip(group, outcomes):
                if isinstance(outcome, MachineryError):
                    self.failures.append({"action": action.kind, "target": action.target,
                                          "pool": action.data.get("pool"), "msg": str(outcome),
                                          "done": list(outcome.done)})
                else:
                    self.note_done(action)
            if self.failures:
                failure = MachineryError("%d action(s) of the set failed: %s" % (len(self.failures), "; ".join(
                    "%s %s on %s: %s" % (f["action"], f["target"], f["pool"], f["msg"]) for f in self.failures)))
                # a failed member's own steps done before its failure (a domain defined, a volume deleted)
                failure.done = ["%s: %s" % (f["target"], step) for f in self.failures for step in f["done"]]
                raise failure

    def apply(self, action, observed):
        failure = self.apply_one(action, observed)
        if failure is not None:
            raise failure

    def apply_one(self, action, observed):
        """Apply one action on its pool: the failure (a MachineryError) or None, so that a wave runs whole."""
        ctx = self.fleet.contexts[action.data["uri"]]
        method = self.applier(action.handler)
        try:
            method(self, action, observed)
        except MachineryError as exc:
            return exc
        except lv.libvirt.libvirtError as exc:
            return MachineryError("libvirt error on pool %s: %s" % (ctx.name or ctx.uri, lv.describe(exc)))
        return None

    def _service(self, action):
        return MachineService(self.fleet.contexts[action.data["uri"]])

    def _record(self, action, _observed):
        # compare and swap: written only over the document the plan was made from
        self.fleet.contexts[action.data["uri"]].registry.put(set_key(self.desired["name"]), action.data["document"],
                                                             expect=action.data.get("generation"))

    def _forget(self, action, _observed):
        self.fleet.contexts[action.data["uri"]].registry.remove(set_key(self.desired["name"]))

    def _member_spec(self, action):
        # a new member's name is checked free on every pool; with unreachable_timeout, on those that answer (the
        # set's record holds the names of its members on the others, and a new name avoids them)
        unique = self.fleet.uris if self.desired.get("unreachable_timeout") is None else \
            [uri for uri in self.fleet.uris if uri in self.fleet.contexts and uri not in self.unreachable]
        return member_spec(self.desired, action.target, self.params["wait"], self.params["wait_timeout"], unique)

    def prepare_creates(self, group):
        """The creates of a step planned in check mode first, as machine_batch's preflight does: each member's
        spec is normalized once and reused by its create, and every create of the step is planned on its pool
        before the first is made, so the pool's journal lists them all at once (admission.Admission.journal). A
        member that cannot be planned now is left to its create, which says why."""
        creates = [action for action in group if action.kind == "create"]

        def prepare(action):
            try:
                outcome = MachineService(self.fleet.contexts[action.data["uri"]], True).ensure(
                    self._member_spec(action))
            except (MachineryError, lv.libvirt.libvirtError):
                return None
            return outcome.prepared
        for action, prepared in zip(creates, in_parallel(creates, prepare, self.params["workers"])):
            self.prepared[action.target] = prepared

    def _create(self, action, _observed):
        self._service(action).ensure(self._member_spec(action), self.prepared.pop(action.target, None))

    def _delete(self, action, _observed):
        self._service(action).ensure(machine_spec.params({"name": action.target, "state": "absent",
                                                          "shutdown_timeout": self.params["shutdown_timeout"]}))

    def _adopt(self, action, _observed):
        self._service(action).ensure(machine_spec.params({"name": action.target, "state": "present",
                                                          "labels": action.data["labels"]}))

    def _fence(self, action, _observed):
        """Destroy and undefine a replaced member that its pool still holds, keeping its volumes: their names go
        to the pool's journal first (``pending-<member>``), so a run cut off after the undefine still knows them.
        Only a domain carrying this set's owner label is touched, under a hold on it (a machine task on the
        member waits, or is waited for)."""
        ctx = self.fleet.contexts[action.data["uri"]]
        with ctx.coordination.of(ctx, action.target):
            self._fence_held(ctx, action)

    def _fence_held(self, ctx, action):
        dom = lv.lookup_domain(ctx.conn, action.target)
        if dom is None:
            return
        record = dx.read_record(dx.parse(dom.XMLDesc(lv.libvirt.VIR_DOMAIN_XML_INACTIVE))) or {}
        if ((record.get("spec") or {}).get("labels") or {}).get(OWNER_LABEL) != self.desired["name"]:
            raise MachineryError("%s on pool %s is not a member of set %s: not fenced" % (
                action.target, action.data["pool"], self.desired["name"]))
        if action.data["volumes"]:
            ctx.registry.put(keys.pending_key(action.target), {"machine": action.target,
                                                               "volumes": action.data["volumes"]})
        if dom.isActive():
            writer.write(dom, "destroy")  # no ACPI shutdown: another member took its place already
        lv.undefine_domain(dom, action.target)

    def _reclaim(self, action, _observed):
        """Remove the volumes a fenced member made for itself (its record's, never a volume it was given), then
        its journal, under a hold on the member's name."""
        ctx = self.fleet.contexts[action.data["uri"]]
        with ctx.coordination.of(ctx, action.target):
            storage.refresh(ctx.storage)
            for volume in action.data["volumes"]:
                storage.delete_volume(ctx.storage, volume)
            ctx.registry.remove(keys.pending_key(action.target))

    APPLY = {"record": _record, "forget": _forget, "create": _create, "delete": _delete, "adopt": _adopt,
             "fence": _fence, "reclaim": _reclaim}


def read_replaced(replaced, contexts):
    """What each replaced member left on its pool, for the pools in ``contexts`` ({uri: PoolContext}):
    {member: {exists, owner, volumes, journal}}. ``volumes`` are those its record says it made for itself."""
    found = {}
    for name, entry in sorted(replaced.items()):
        ctx = contexts.get(entry.get("uri"))
        if ctx is None:
            continue
        reading = ctx.listing().get(name)
        journal = ctx.registry.get(keys.pending_key(name)) or {}
        there = {"exists": reading is not None, "owner": None, "volumes": [], "journal": journal.get("volumes")}
        if reading is not None:
            record = reading.record or {}
            there["owner"] = ((record.get("spec") or {}).get("labels") or {}).get(OWNER_LABEL)
            there["volumes"] = machine_spec.ephemeral_volumes(record)
        found[name] = there
    return found


def set_status(desired, observed, plan):
    """The module's return for the set: counts, members, out-of-date members and a table."""
    members, orphans, _foreign = classify(desired["name"], (desired.get("selector") or {}).get("match_labels")
                                          or {OWNER_LABEL: desired["name"]}, observed["machines"])
    members = sorted(members + orphans, key=lambda machine: machine["name"])
    current = desired.get("template_hash")
    lost = (plan.facts.get("lost") if plan is not None else None) or {}
    # a member on a pool the run could not read is counted until it is replaced, its phase Unknown
    members = [member for member in members if member["name"] not in (lost.get("replaced") or {})]
    members += [lost_member(desired["name"], desired, entry) for entry in lost.get("lost") or ()
                if not entry["replace"]]
    members.sort(key=lambda machine: machine["name"])
    since = {entry["name"]: entry["since"] for entry in lost.get("lost") or ()}
    shown = [{"name": member["name"], "pool": member.get("pool"), "phase": member["phase"],
              "template_current": (member.get("labels") or {}).get(HASH_LABEL) == current,
              "ip_addresses": member.get("ip_addresses") or [],
              "conditions": [lost_pool.condition(not member.get("lost"), since.get(member["name"]))]}
             for member in members]
    result = counts(desired, members) if desired["state"] == "present" else {"replicas": len(members)}
    created = next((pool["definition"]["created"] for pool in observed.get("pools") or []
                    if (pool.get("definition") or {}).get("created")), None)
    result.update(members=shown, out_of_date=[m["name"] for m in shown if not m["template_current"]],
                  table=table([member for member in members if not member.get("lost")]), created=created,
                  age=age(created) if created else None)
    if plan is not None:
        result["planned_members"] = sorted(a.target for a in plan.actions if a.kind == "create")
        names = {pool["uri"]: pool["name"] for pool in observed["pools"]}
        result.update(unreachable_pools=[{"name": names.get(uri, uri), "uri": uri, "since": mark} for uri, mark in
                                         sorted((lost.get("unreachable") or {}).items())],
                      replaced_members=[dict(lost["replaced"][name], name=name)
                                        for name in lost.get("newly_replaced") or ()],
                      fenced_members=sorted(a.target for a in plan.actions if a.kind == "fence"))
    return result


def list_sets(fleet, names=None):
    """Every set recorded in the pools' registries (filtered by ``names``), with its members' counts."""
    _snapshots, contexts, machines = read_fleet(fleet)
    found = {}
    for ctx in contexts:
        for key in ctx.registry.keys(keys.SET_PREFIX):
            document = ctx.registry.get(key)
            if not document or (names and document["name"] not in names):
                continue
            entry = found.setdefault(document["name"], dict(document, pools=[]))
            entry["pools"].append(ctx.name or ctx.uri)
    sets = []
    for name, document in sorted(found.items()):
        members, _orphans, _foreign = classify(name, document["selector"]["match_labels"], machines)
        shown = dict(document, **counts(document, members))
        shown.update(members=sorted(member["name"] for member in members),
                     out_of_date=sorted(member["name"] for member in members
                                        if (member.get("labels") or {}).get(HASH_LABEL) != document["template_hash"]))
        sets.append(shown)
    return sets
