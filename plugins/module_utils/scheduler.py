# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Placing machines on pools: filters, score, a ledger. Pure functions over pool snapshots (no libvirt).

A pool snapshot is a dict: name, uri, state (Ready | Error | Offline), labels, taints [{key, value, effect}],
classes {name: {cpu, memory}}, allocatable {cpu, memory}, allocated {cpu, memory}, machines (names defined
there), and for pools that could not be read, ``problem``.
"""

from __future__ import annotations

import hashlib
from collections import Counter

from ansible_collections.machinery.compute.plugins.module_utils import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.errors import MachineryError, ValidationError

STRATEGIES = ("spread", "binpack")
OPERATORS = ("Equal", "Exists")
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")


class Unschedulable(MachineryError):
    reason = "Unschedulable"


def normalize_machine(spec, index=0):
    where = "terms[%d]" % index
    if not isinstance(spec, dict):
        raise ValidationError("a machine spec must be a mapping with at least name and machine_class", where)
    name = check.dns_label(spec.get("name"), where + ".name")
    size = None
    if spec.get("machine_class"):
        machine_class = check.dns_label(spec.get("machine_class"), where + ".machine_class")
    elif spec.get("cpu") is not None and spec.get("memory") is not None:
        machine_class = None
        size = {"cpu": check.cpu_count(spec["cpu"], where + ".cpu"),
                "memory": check.memory_bytes(spec["memory"], where + ".memory")}
    else:
        raise ValidationError("give machine_class, or cpu and memory", where + ".machine_class")
    selector = spec.get("machine_pool_selector") or {}
    if not isinstance(selector, dict):
        raise ValidationError("must be a mapping of labels", where + ".machine_pool_selector")
    tolerations = []
    for position, item in enumerate(spec.get("tolerations") or []):
        field = "%s.tolerations[%d]" % (where, position)
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping with key, operator, value, effect", field)
        operator = check.one_of(item.get("operator") or "Equal", OPERATORS, field + ".operator")
        if operator == "Equal" and not item.get("key"):
            raise ValidationError("operator Equal needs a key", field + ".key")
        effect = item.get("effect") or ""
        if effect:
            check.one_of(effect, SCHEDULING_EFFECTS, field + ".effect")
        tolerations.append({"key": item.get("key") or "", "operator": operator,
                            "value": str(item.get("value") or ""), "effect": effect})
    return {"name": name, "machine_class": machine_class, "size": size,
            "machine_pool_selector": {str(k): str(v) for k, v in selector.items()},
            "tolerations": tolerations, "machine_pool": spec.get("machine_pool")}


def tolerates(toleration, taint):
    """IronCore/Kubernetes toleration matching: key, operator Equal/Exists, value, effect (empty matches all)."""
    if toleration["effect"] and toleration["effect"] != taint["effect"]:
        return False
    if toleration["operator"] == "Exists":
        return not toleration["key"] or toleration["key"] == taint["key"]
    return toleration["key"] == taint["key"] and toleration["value"] == (taint.get("value") or "")


def untolerated(machine, pool):
    return [taint for taint in pool.get("taints") or [] if taint["effect"] in SCHEDULING_EFFECTS
            and not any(tolerates(toleration, taint) for toleration in machine["tolerations"])]


class Ledger:
    """What this call has placed so far, on top of what each pool already has allocated."""

    def __init__(self):
        self.extra = {}

    def add(self, pool_name, cpu, memory):
        cpu_used, memory_used = self.extra.get(pool_name, (0, 0))
        self.extra[pool_name] = (cpu_used + cpu, memory_used + memory)

    def free(self, pool):
        cpu_used, memory_used = self.extra.get(pool["name"], (0, 0))
        return (pool["allocatable"]["cpu"] - pool["allocated"]["cpu"] - cpu_used,
                pool["allocatable"]["memory"] - pool["allocated"]["memory"] - memory_used)


def rejections(machine, pool, ledger):
    """Why ``pool`` cannot take ``machine``: an empty list when it can. Filters run in the documented order."""
    if pool.get("state") != "Ready":
        return ["pool %s" % ("unreachable" if pool.get("state") == "Offline" else "not ready")]
    if untolerated(machine, pool):
        return ["taint not tolerated"]
    labels = pool.get("labels") or {}
    if any(labels.get(key) != value for key, value in machine["machine_pool_selector"].items()):
        return ["selector not matched"]
    size = size_on(machine, pool)
    if size is None:
        return ["class %s not published" % machine["machine_class"]]
    free_cpu, free_memory = ledger.free(pool)
    reasons = []
    if size["cpu"] > free_cpu:
        reasons.append("insufficient cpu")
    if size["memory"] > free_memory:
        reasons.append("insufficient memory")
    return reasons


def size_on(machine, pool):
    """The machine's size on ``pool``: its class as published there, or its explicit cpu and memory."""
    if machine["size"] is not None:
        return machine["size"]
    return (pool.get("classes") or {}).get(machine["machine_class"])


def _share(free, total):
    return free / total if total > 0 else 0.0


def score(pool, size, ledger):
    """Normalized free capacity left after placing ``size``: the mean of the cpu and memory shares."""
    free_cpu, free_memory = ledger.free(pool)
    return (_share(free_cpu - size["cpu"], pool["allocatable"]["cpu"]) +
            _share(free_memory - size["memory"], pool["allocatable"]["memory"])) / 2


def tie_breaker(machine_name, pool_name):
    """Stable across runs and hosts, but not the same pool for every machine."""
    return hashlib.sha256(("%s\0%s" % (machine_name, pool_name)).encode()).hexdigest()


def unschedulable_message(machine, pools, per_pool):
    counts = Counter(reason for reasons in per_pool.values() for reason in reasons)
    detail = ", ".join("%d %s" % (count, reason) for reason, count in counts.most_common())
    return "0/%d pools available for %s: %s" % (len(pools), machine["name"], detail or "no pools given")


def place_one(machine, pools, ledger, strategy):
    """(pool, reason) for one machine; raises Unschedulable with the per-filter summary."""
    by_name = {pool["name"]: pool for pool in pools}
    existing = [pool for pool in pools if machine["name"] in (pool.get("machines") or ())]
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
    per_pool = {pool["name"]: rejections(machine, pool, ledger) for pool in candidates}
    fitting = [pool for pool in candidates if not per_pool[pool["name"]]]
    if not fitting:
        raise Unschedulable(unschedulable_message(machine, candidates, per_pool), "machine_pool")

    def rank(pool):
        value = score(pool, size_on(machine, pool), ledger)
        return (-value if strategy == "spread" else value, tie_breaker(machine["name"], pool["name"]))

    chosen = min(fitting, key=rank)
    size = size_on(machine, chosen)
    ledger.add(chosen["name"], size["cpu"], size["memory"])
    left_cpu, left_memory = ledger.free(chosen)
    reason = "%s: %d/%d pools fit; %s has %d cpu and %s free after placement" % (
        strategy, len(fitting), len(candidates), chosen["name"], left_cpu, _gib(left_memory))
    return chosen, reason


def _gib(number):
    return "%.1fGi" % (number / 2 ** 30)


def schedule(specs, pools, strategy="spread", strict=True):
    """[{name, pool, uri, reason}] in the order of ``specs``, placed one by one against one ledger.

    With ``strict`` every machine that fits nowhere is reported in one Unschedulable error; without it such a
    machine comes back with pool and uri None and the reason in ``reason``.
    """
    check.one_of(strategy, STRATEGIES, "strategy")
    machines = [normalize_machine(spec, index) for index, spec in enumerate(specs)]
    seen = set()
    for index, machine in enumerate(machines):
        if machine["name"] in seen:
            raise ValidationError("machine %s is listed twice" % machine["name"], "terms[%d].name" % index)
        seen.add(machine["name"])
    ledger = Ledger()
    placements = []
    failures = []
    for machine in machines:
        try:
            pool, reason = place_one(machine, pools, ledger, strategy)
            placements.append({"name": machine["name"], "pool": pool["name"], "uri": pool["uri"], "reason": reason})
        except Unschedulable as exc:
            failures.append(exc.message)
            placements.append({"name": machine["name"], "pool": None, "uri": None, "reason": exc.message})
    if failures and strict:
        raise Unschedulable("; ".join(failures), "machine_pool")
    return placements
