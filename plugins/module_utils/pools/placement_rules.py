# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Placement rules between machines: server groups and topology spread. Pure functions over the machines the
scheduler knows of.

A server group is a name and a policy. The members of a group are the machines whose record names it (a pool
snapshot lists them in ``server_groups``: {machine: {name, policy}}) and the machines a batch has placed so far
(the scheduler's ledger books them). The group's policy is the one of the machine being placed.

- ``affinity``: every member on one pool. A machine goes to a pool that holds members, or anywhere when the
  group has none yet; a pool without members is refused.
- ``anti-affinity``: no two members on one pool. A pool holding a member is refused.
- ``soft-affinity`` and ``soft-anti-affinity``: the same wishes as weights, never a refusal. They rank the pools
  before the strategy's score does (most members first, or fewest), so the strategy decides between pools that
  serve the rule equally.
"""

from __future__ import annotations

from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.options import SERVER_GROUP_POLICIES, SPREAD_WHEN

POLICIES = SERVER_GROUP_POLICIES
HARD = ("affinity", "anti-affinity")


def describe(group):
    return "server group %s (%s)" % (group["name"], group["policy"])


def members_by_pool(groups, group_name, except_machine=None):
    """{pool name: sorted member names} of the group, from ``groups`` ({pool name: {machine: group name}})."""
    found = {}
    for pool_name, machines in groups.items():
        names = sorted(machine for machine, name in machines.items() if name == group_name and machine != except_machine)
        if names:
            found[pool_name] = names
    return found


def refusal(group, pool_name, members):
    """Why a hard rule keeps the machine off ``pool_name`` (a short reason naming the group and its policy), or
    None; ``members`` as members_by_pool returns them."""
    if not group or group["policy"] not in HARD:
        return None
    if group["policy"] == "anti-affinity" and pool_name in members:
        return "%s has a member there" % describe(group)
    if group["policy"] == "affinity" and members and pool_name not in members:
        return "%s has its members on %s" % (describe(group), ", ".join(sorted(members)))
    return None


def rank(group, pool_name, members):
    """The soft rule's rank of a pool (lower is better; 0 for no soft rule): soft-affinity prefers the pools
    with the most members, soft-anti-affinity those with the fewest."""
    if not group:
        return 0
    count = len(members.get(pool_name, ()))
    if group["policy"] == "soft-affinity":
        return -count
    if group["policy"] == "soft-anti-affinity":
        return count
    return 0


def admission_refusal(group, pool_name, others, elsewhere=None):
    """The hard rule checked under the admission locks: an anti-affinity member among ``others`` ([(machine
    name, its group or None)] defined on the pool), or, for affinity, members ``elsewhere`` ([(pool, machine)]
    of the group on the peer pools whose locks are held too; None when no peers were looked at) and none here."""
    if not group or group.get("policy") not in HARD:
        return None
    here = sorted(name for name, theirs in others if theirs and theirs.get("name") == group["name"])
    if group["policy"] == "anti-affinity" and here:
        return "%s: pool %s already has member %s" % (describe(group), pool_name, ", ".join(here))
    if group["policy"] == "affinity" and elsewhere and not here:
        return "%s: its members are on %s, not on pool %s" % (
            describe(group), ", ".join("%s (%s)" % (pool, machine) for pool, machine in sorted(elsewhere)), pool_name)
    return None


# --- topology spread (Kubernetes' topologySpreadConstraints, over pools) ----------------------------------------
#
# A batch or a set spreads its own machines (the machines it names: those already on the pools where they are,
# those it places as it places them) over the values of a pool label, the topology key: a domain is one value,
# the pools carrying it its members. The skew of placing a machine in a domain is the machines counted there
# after it, less the fewest counted in any eligible domain (one holding a pool the machine's own filters let
# it use). ``refuse`` keeps the machine off a domain whose skew would exceed ``max_skew`` (and off the pools
# without the label); ``schedule_anyway`` prefers the domains of least skew and never refuses.


def spread_constraints(items, field="topology_spread"):
    """The constraints, checked and with their defaults (max_skew 1, refuse); [] for None."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise ValidationError("must be a list of mappings with topology_key, max_skew, when_unsatisfiable", field)
    constraints = []
    for index, item in enumerate(items):
        where = "%s[%d]" % (field, index)
        if not isinstance(item, dict):
            raise ValidationError("must be a mapping with topology_key, max_skew, when_unsatisfiable", where)
        unknown = sorted(str(key) for key in item if key not in ("topology_key", "max_skew", "when_unsatisfiable"))
        if unknown:
            raise ValidationError("unknown key %s; the keys are topology_key, max_skew, when_unsatisfiable"
                                  % ", ".join(unknown), where)
        key = check.label_key(item.get("topology_key"), where + ".topology_key")
        skew = 1 if item.get("max_skew") is None else item["max_skew"]
        if isinstance(skew, bool) or not isinstance(skew, int) or skew < 1:
            raise ValidationError("must be a whole number of at least 1, got %r" % (skew,), where + ".max_skew")
        when = check.one_of(item.get("when_unsatisfiable") or "refuse", SPREAD_WHEN, where + ".when_unsatisfiable")
        constraints.append({"topology_key": key, "max_skew": skew, "when_unsatisfiable": when})
    return constraints


def spread_domains(constraints, eligible, counts):
    """For each constraint, {domain value: machines counted} over the ``eligible`` pools that carry its key: read
    once per machine placed, then asked per pool."""
    found = []
    for constraint in constraints:
        domains = {}
        for pool in eligible:
            value = (pool.get("labels") or {}).get(constraint["topology_key"])
            if value is not None:
                domains[value] = domains.get(value, 0) + counts.get(pool["name"], 0)
        found.append(domains)
    return found


def _skew(constraint, domains, pool):
    """The skew one more machine on ``pool`` makes, or None when the pool lacks the key."""
    value = (pool.get("labels") or {}).get(constraint["topology_key"])
    if value is None:
        return None
    return domains.get(value, 0) + 1 - min(domains.values() or [0])


def spread_refusal(constraints, pool, domains):
    """Why a ``refuse`` constraint keeps the machine off ``pool``, or None (``domains`` from spread_domains)."""
    for constraint, counted in zip(constraints, domains):
        if constraint["when_unsatisfiable"] != "refuse":
            continue
        skew = _skew(constraint, counted, pool)
        if skew is None:
            return "topology spread on %s: pool has no such label" % constraint["topology_key"]
        if skew > constraint["max_skew"]:
            return "topology spread on %s would exceed max_skew %d" % (constraint["topology_key"], constraint["max_skew"])
    return None


def spread_rank(constraints, pool, domains):
    """The summed skew of the ``schedule_anyway`` constraints on ``pool`` (lower is better; a pool without the
    key ranks after every pool with it)."""
    total = 0
    for constraint, counted in zip(constraints, domains):
        if constraint["when_unsatisfiable"] == "schedule_anyway":
            skew = _skew(constraint, counted, pool)
            total += sum(counted.values()) + 2 if skew is None else skew
    return total
