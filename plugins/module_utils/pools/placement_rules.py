# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Placement rules between machines: server groups. Pure functions over the members the scheduler knows of.

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

from ansible_collections.machinery.compute.plugins.module_utils.core.options import SERVER_GROUP_POLICIES

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


def admission_refusal(group, pool_name, others):
    """The hard rule a pool alone can check under its admission lock: an anti-affinity member among ``others``
    ([(machine name, its group or None)] defined on the pool). Affinity needs the other pools, so the scheduler
    is its only check."""
    if not group or group.get("policy") != "anti-affinity":
        return None
    taken = sorted(name for name, theirs in others if theirs and theirs.get("name") == group["name"])
    if taken:
        return "%s: pool %s already has member %s" % (describe(group), pool_name, ", ".join(taken))
    return None
