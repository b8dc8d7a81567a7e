# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Placing machines on pools: filters, score, a ledger. Pure functions over pool snapshots (no libvirt).

A pool snapshot is a dict: name, uri, state (Ready | Error | Offline), labels, taints [{key, value, effect}],
classes {name: {cpu, memory}}, allocatable {cpu, memory}, allocated {cpu, memory}, machines (names defined
there), and for pools that could not be read, ``problem``. Optionally ``storage`` {allocatable, allocated} in
bytes (a snapshot without it is not filtered on storage) and ``server_groups`` {machine: {name, policy}} of the
machines defined there that belong to a server group (placement_rules.py).

What a machine needs of storage is what is known before anything is resolved on a pool: its root disk, the
larger of ``root_size`` and the image's virtual size when the caller read it (``image_sizes``: the local image
files; a URL is only read on download and a published image on its pool, so they count 0 here), plus each new
empty volume's ``size`` and each image volume's size or image size as far as known (an existing volume adds
nothing). The admission check on the pool counts every disk at its real size under its lock.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity
from ansible_collections.machinery.compute.plugins.module_utils.pools import placement_rules as rules

STRATEGIES = ("spread", "binpack")
OPERATORS = ("Equal", "Exists")
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
# What the scheduler reads of a machine spec. A misspelt key (tolerance, machine_pool_selectors) is refused, not
# silently ignored, since the machine would be placed as if it were not there.
SPEC_KEYS = ("name", "machine_class", "cpu", "memory", "machine_pool_selector", "tolerations", "machine_pool",
             "root_size", "volumes", "server_group")
TOLERATION_KEYS = ("key", "operator", "value", "effect")


def unknown_keys(item, known, field, what="the keys are"):
    unknown = sorted(str(key) for key in item if key not in known)
    if unknown:
        shown = [key for key in known if key in SPEC_KEYS] or list(known)
        more = " and the options of machinery.compute.machine" if len(shown) < len(known) else ""
        raise ValidationError("unknown key%s %s; %s %s%s"
                              % ("s" if len(unknown) > 1 else "", ", ".join(unknown), what, ", ".join(shown), more),
                              field)


class Unschedulable(MachineryError):
    reason = "Unschedulable"


def machine_request(prm, field="terms[0]", image_sizes=None):
    """What the scheduler reads of a machine: its params as machine_spec.params validated them (name, class or
    explicit size, machine_pool_selector, tolerations, machine_pool), checked for nothing but what placement
    needs."""
    size = None
    if prm.get("machine_class"):
        machine_class = prm["machine_class"]
    elif prm.get("cpu") is not None and prm.get("memory") is not None:
        machine_class = None
        size = {"cpu": prm["cpu"], "memory": prm["memory"]}
    else:
        raise ValidationError("give machine_class, or cpu and memory", field + ".machine_class")
    group = prm.get("server_group")
    return {"name": prm["name"], "machine_class": machine_class, "size": size,
            "machine_pool_selector": dict(prm.get("machine_pool_selector") or {}),
            "tolerations": [dict(item) for item in prm.get("tolerations") or []],
            "machine_pool": prm.get("machine_pool"), "storage": storage_need(prm, image_sizes),
            "server_group": {"name": group["name"], "policy": group["policy"]} if group else None}


def storage_need(prm, image_sizes=None):
    """Bytes of new disks the params ask for, as far as known before anything is resolved (see the module's
    docstring); ``image_sizes`` {image source: virtual bytes} of the images the caller could read."""
    sizes = image_sizes or {}
    need = max(prm.get("root_size") or 0, sizes.get(prm["image"], 0)) if prm.get("image") else 0
    for vol in prm.get("volumes") or ():
        if vol.get("volume") is None:  # an existing volume takes no new room
            need += max(vol.get("size") or 0, sizes.get(vol.get("image"), 0) if vol.get("image") else 0)
    return need


def normalize_tolerations(items, field):
    """A list of tolerations, validated; None when there are none (so a record that never had any and one
    given an empty list compare equal)."""
    if items is None:
        return None
    if not isinstance(items, list):
        raise ValidationError("must be a list of tolerations (key, operator, value, effect)", field)
    return [normalize_toleration(item, "%s[%d]" % (field, position)) for position, item in enumerate(items)] or None


def normalize_toleration(item, field):
    """A toleration as Kubernetes validates it: key and value by the label rules, Equal needs a key, Exists
    takes no value."""
    if not isinstance(item, dict):
        raise ValidationError("must be a mapping with key, operator, value, effect", field)
    unknown_keys(item, TOLERATION_KEYS, field)
    operator = check.one_of(item.get("operator") or "Equal", OPERATORS, field + ".operator")
    key = check.label_key(item["key"], field + ".key") if item.get("key") not in (None, "") else ""
    value = check.label_value(item.get("value"), field + ".value")
    if operator == "Equal" and not key:
        raise ValidationError("operator Equal needs a key", field + ".key")
    if operator == "Exists" and value:
        raise ValidationError("operator Exists matches any value; give none", field + ".value")
    effect = item.get("effect") or ""
    if effect:
        check.one_of(effect, SCHEDULING_EFFECTS, field + ".effect")
    return {"key": key, "operator": operator, "value": value, "effect": effect}


def tolerates(toleration, taint):
    """IronCore/Kubernetes toleration matching: key, operator Equal/Exists, value, effect (empty matches all)."""
    if toleration["effect"] and toleration["effect"] != taint["effect"]:
        return False
    if toleration["operator"] == "Exists":
        return not toleration["key"] or toleration["key"] == taint["key"]
    return toleration["key"] == taint["key"] and toleration["value"] == (taint.get("value") or "")


def must_leave(taints, tolerations):
    """True when a machine with these (recorded) tolerations may not stay on a pool with these taints: some
    NoExecute taint is not tolerated. NoSchedule only keeps new machines away."""
    return any(taint.get("effect") == "NoExecute"
               and not any(tolerates(toleration, taint) for toleration in tolerations or [])
               for taint in taints or [])


def untolerated(machine, pool):
    return [taint for taint in pool.get("taints") or [] if taint["effect"] in SCHEDULING_EFFECTS
            and not any(tolerates(toleration, taint) for toleration in machine["tolerations"])]


class Ledger:
    """Free cpu, memory and storage of every pool, and the server groups of the machines on it, less (plus)
    what this call has placed so far. Free storage is None for a pool whose snapshot does not tell it."""

    def __init__(self, pools=()):
        self.free_cpu = {}
        self.free_memory = {}
        self.free_storage = {}
        self.groups = {}  # pool name -> {machine name: server group name}
        self.counted = {}  # pool name -> machines a topology spread counts there
        for pool in pools:
            self.track(pool)

    def track(self, pool):
        if pool["name"] not in self.free_cpu:
            self.free_cpu[pool["name"]] = round(pool["allocatable"]["cpu"] - pool["allocated"]["cpu"], 3)
            self.free_memory[pool["name"]] = pool["allocatable"]["memory"] - pool["allocated"]["memory"]
            storage = pool.get("storage")
            self.free_storage[pool["name"]] = storage["allocatable"] - storage["allocated"] if storage else None
            self.groups[pool["name"]] = {machine: group["name"] for machine, group
                                         in (pool.get("server_groups") or {}).items() if group}

    def add(self, pool_name, cpu, memory, storage=0, machine=None, group=None):
        self.free_cpu[pool_name] = round(self.free_cpu[pool_name] - cpu, 3)  # millicores: no float drift
        self.free_memory[pool_name] -= memory
        if self.free_storage.get(pool_name) is not None:
            self.free_storage[pool_name] -= storage
        if group:
            self.groups.setdefault(pool_name, {})[machine] = group["name"]

    def free(self, pool):
        self.track(pool)
        return self.free_cpu[pool["name"]], self.free_memory[pool["name"]]


def static_rejections(machine, pool):
    """The filters that do not depend on what is already placed, in the documented order ([] if all pass)."""
    if pool.get("state") != "Ready":
        return ["pool %s" % ("unreachable" if pool.get("state") == "Offline" else "not ready")]
    if untolerated(machine, pool):
        return ["taint not tolerated"]
    labels = pool.get("labels") or {}
    unmatched = sorted((key, value) for key, value in machine["machine_pool_selector"].items()
                       if labels.get(key) != value)
    if unmatched:
        # the label keys name what to fix (a vitistack region or zone becomes a topology label, for one)
        return ["selector not matched (%s)" % ", ".join("%s=%s" % pair for pair in unmatched)]
    if size_on(machine, pool) is None:
        return ["class %s not published" % machine["machine_class"]]
    return []


def capacity_rejections(machine, pool, ledger, details=None, spread=(), domains=()):
    """Why the pool cannot take the machine now: cpu, memory, storage, then a server group's hard rule, then a
    topology spread's (``spread`` constraints, ``domains`` as placement_rules.spread_domains counts them).
    ``details`` gets, for a pool short of storage, its name, its free storage and the need, as in
    'pool1: storage 3Gi free, needs 10Gi'."""
    size = size_on(machine, pool)
    free_cpu, free_memory = ledger.free(pool)
    reasons = []
    if size["cpu"] > free_cpu:
        reasons.append("insufficient cpu")
    if size["memory"] > free_memory:
        reasons.append("insufficient memory")
    free_storage = ledger.free_storage.get(pool["name"])
    if free_storage is not None and machine.get("storage", 0) > free_storage:
        reasons.append("insufficient storage")
        if details is not None:
            details.append("%s: storage %s free, needs %s" % (pool["name"], _quantity(max(free_storage, 0)),
                                                              _quantity(machine["storage"])))
    if not reasons and machine.get("server_group"):
        refused = rules.refusal(machine["server_group"], pool["name"],
                                rules.members_by_pool(ledger.groups, machine["server_group"]["name"], machine["name"]))
        if refused:
            reasons.append(refused)
    if not reasons and spread:
        refused = rules.spread_refusal(spread, pool, domains)
        if refused:
            reasons.append(refused)
    return reasons


def _quantity(number):
    shown = format_quantity(number)
    return shown if not shown.isdigit() or number < 2 ** 20 else _gib(number)


def shape(machine):
    """What the static filters look at: machines of one shape pass or fail them on the same pools."""
    size = machine["size"]
    return (machine["machine_class"], tuple(sorted(machine["machine_pool_selector"].items())),
            tuple(tuple(sorted(toleration.items())) for toleration in machine["tolerations"]),
            (size["cpu"], size["memory"]) if size else None)


def size_on(machine, pool):
    """The machine's size on ``pool``: its class as published there, or its explicit cpu and memory."""
    if machine["size"] is not None:
        return machine["size"]
    return (pool.get("classes") or {}).get(machine["machine_class"])


def tie_breaker(machine_name, pool_name):
    """Stable across runs and hosts, but not the same pool for every machine."""
    return hashlib.sha256(("%s\0%s" % (machine_name, pool_name)).encode()).hexdigest()


def unschedulable_message(machine, pools, per_pool, details=()):
    counts = Counter(reason for reasons in per_pool.values() for reason in reasons)
    detail = ", ".join("%d %s" % (count, reason) for reason, count in counts.most_common())
    shown = " (%s)" % "; ".join(details) if details else ""
    return "0/%d pools available for %s: %s%s" % (len(pools), machine["name"], detail or "no pools given", shown)


def shape_entries(machine, pools):
    """For one machine shape: the static verdict per pool, and (pool, cpu, memory) of the pools that pass."""
    verdicts = {}
    passing = []
    for pool in pools:
        verdicts[pool["name"]] = static_rejections(machine, pool)
        if not verdicts[pool["name"]]:
            size = size_on(machine, pool)
            passing.append((pool, size["cpu"], size["memory"]))
    return verdicts, passing


def place_one(machine, pools, ledger, strategy, static_cache=None, by_name=None, owners=None, spread=()):
    """(pool, reason) for one machine; raises Unschedulable with the per-filter summary.

    ``static_cache`` keeps the static filters' verdicts per machine shape across one batch; ``by_name`` and
    ``owners`` (machine name -> pools that have it) are indexes a batch builds once; ``spread`` the checked
    topology spread constraints of a batch (placement_rules.spread_constraints), counted in ``ledger.counted``."""
    by_name = by_name or {pool["name"]: pool for pool in pools}
    if owners is None:
        existing = [pool for pool in pools if machine["name"] in (pool.get("machines") or ())]
    else:
        existing = owners.get(machine["name"], [])
    if existing:
        pool = sorted(existing, key=lambda item: item["name"])[0]
        return pool, "already exists on pool %s" % pool["name"]
    candidates = pools
    if machine.get("machine_pool"):
        if machine["machine_pool"] not in by_name:
            raise Unschedulable("%s asks for pool %s, which is not among the pools given (%s)"
                                % (machine["name"], machine["machine_pool"], ", ".join(sorted(by_name))),
                                "machine_pool")
        candidates = [by_name[machine["machine_pool"]]]
    key = (shape(machine), machine.get("machine_pool"))
    cached = static_cache.get(key) if static_cache is not None else None
    if cached is None:
        cached = shape_entries(machine, candidates)
        if static_cache is not None:
            static_cache[key] = cached
    verdicts, passing = cached
    free_cpu, free_memory, free_storage = ledger.free_cpu, ledger.free_memory, ledger.free_storage
    for pool in candidates:
        ledger.track(pool)
    group = machine.get("server_group")
    members = rules.members_by_pool(ledger.groups, group["name"], machine["name"]) if group else {}
    need = machine.get("storage", 0)
    # a topology spread's domains: those of the pools the machine's own filters let it use
    domains = rules.spread_domains(spread, [entry[0] for entry in passing], ledger.counted) if spread else ()
    ruled = bool(group or spread)
    spreading = strategy == "spread"
    best_key = None
    ties = []
    fitting = 0
    for pool, cpu, memory in passing:
        name = pool["name"]
        left_cpu = round(free_cpu[name] - cpu, 3)
        left_memory = free_memory[name] - memory
        left_storage = free_storage.get(name)
        if left_storage is not None:
            left_storage -= need
        if left_cpu < 0 or left_memory < 0 or (left_storage is not None and left_storage < 0):
            continue
        if ruled and (rules.refusal(group, name, members) or (spread and rules.spread_refusal(spread, pool, domains))):
            continue
        fitting += 1
        total_cpu = pool["allocatable"]["cpu"]
        total_memory = pool["allocatable"]["memory"]
        value = (left_cpu / total_cpu if total_cpu > 0 else 0.0) + (left_memory / total_memory if total_memory > 0 else 0.0)
        if left_storage is None:
            value /= 2
        else:  # weighed as cpu and memory are, where the snapshot tells it
            total_storage = pool["storage"]["allocatable"]
            value = (value + (left_storage / total_storage if total_storage > 0 else 0.0)) / 3
        rank = -value if spreading else value
        if ruled:  # a soft rule ranks the pools before the strategy does
            rank = (rules.rank(group, name, members), rules.spread_rank(spread, pool, domains) if spread else 0, rank)
        if best_key is None or rank < best_key:
            best_key, ties = rank, [(pool, cpu, memory)]
        elif rank == best_key:
            ties.append((pool, cpu, memory))
    if not ties:
        details = []
        per_pool = {pool["name"]: verdicts[pool["name"]] or
                    capacity_rejections(machine, pool, ledger, details, spread, domains) for pool in candidates}
        raise Unschedulable(unschedulable_message(machine, candidates, per_pool, details), "machine_pool")
    chosen, cpu, memory = ties[0] if len(ties) == 1 else \
        min(ties, key=lambda entry: tie_breaker(machine["name"], entry[0]["name"]))
    ledger.add(chosen["name"], cpu, memory, need, machine["name"], group)
    left_cpu, left_memory = ledger.free(chosen)
    reason = "%s: %d/%d pools fit; %s has %s cpu and %s free after placement" % (
        strategy, fitting, len(candidates), chosen["name"], check.cpu_text(round(left_cpu, 3)), _gib(left_memory))
    return chosen, reason


def _gib(number):
    return "%.1fGi" % (number / 2 ** 30)


def schedule(specs, pools, strategy="spread", strict=True, field="terms", topology_spread=None, spread_members=None,
             image_sizes=None):
    """[{name, pool, uri, reason}] in the order of ``specs`` (machine params, as machine_spec.params returns
    them), placed one by one against one ledger.

    With ``strict`` every machine that fits nowhere is reported in one Unschedulable error; without it such a
    machine comes back with pool and uri None and the reason in ``reason``. ``topology_spread`` spreads the
    machines named in ``spread_members`` (default: those of ``specs``) that are on the pools, and those placed
    here, over the values of pool labels (placement_rules.py). ``image_sizes`` {image source: virtual bytes}
    are the images the caller read (machine_spec.local_image_sizes), counted in the machines' storage.
    """
    check.one_of(strategy, STRATEGIES, "strategy")
    spread = rules.spread_constraints(topology_spread)
    machines = [machine_request(spec, "%s[%d]" % (field, index), image_sizes) for index, spec in enumerate(specs)]
    seen = set()
    for index, machine in enumerate(machines):
        if machine["name"] in seen:
            raise ValidationError("machine %s is listed twice" % machine["name"], "%s[%d].name" % (field, index))
        seen.add(machine["name"])
    ledger = Ledger(pools)
    placements = []
    failures = []
    static_cache = {}
    by_name = {pool["name"]: pool for pool in pools}
    owners = {}
    for pool in pools:
        for name in pool.get("machines") or ():
            owners.setdefault(name, []).append(pool)
    if spread:
        counted = set(spread_members if spread_members is not None else (machine["name"] for machine in machines))
        ledger.counted = {pool["name"]: sum(1 for name in pool.get("machines") or () if name in counted)
                          for pool in pools}
    for machine in machines:
        try:
            pool, reason = place_one(machine, pools, ledger, strategy, static_cache, by_name, owners, spread)
            if spread and machine["name"] not in owners:
                ledger.counted[pool["name"]] = ledger.counted.get(pool["name"], 0) + 1
            placements.append({"name": machine["name"], "pool": pool["name"], "uri": pool["uri"], "reason": reason})
        except Unschedulable as exc:
            failures.append(exc.message)
            placements.append({"name": machine["name"], "pool": None, "uri": None, "reason": exc.message})
    if failures and strict:
        raise Unschedulable("; ".join(failures), "machine_pool")
    return placements
