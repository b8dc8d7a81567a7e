#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_set
short_description: Keep a set of machines at its replica count across pools (a MachineSet)
description:
  - OpenShift's MachineSet on libvirt pools. The members of the set are the machines on its pools whose labels
    match O(selector) and that carry the set's owner label C(machinery.compute/machine-set). Matching machines
    that no set owns are adopted; machines another set owns are left alone.
  - New members are named C(<name>-<5 characters>), unique across the pools, placed through the scheduler's
    filters (taints, the template's C(machine_pool_selector), the class, capacity) and spread over the pools so that
    no pool holds two members more than another while capacity allows (O(strategy=binpack) fills pools
    instead). Scaling down deletes the members labelled C(machinery.compute/delete-machine) first, then those
    not running, then by O(delete_policy); in parallel.
  - Every member carries the hash of the template it was made from (C(machinery.compute/template-hash)). A
    changed template applies to new members only and the return lists the out-of-date ones, as in OpenShift;
    with O(rollout), out-of-date members are replaced in waves that never leave fewer than
    C(replicas - max_unavailable) members running.
  - The set's definition is recorded in the registry of each of its pools (without the template's secrets), so
    M(machinery.compute.machine_set_info) and the health checks find it without the playbook's variables.
  - With O(unreachable_timeout), the record also keeps where each member is, so a run that cannot reach a pool
    still counts the members there (phase C(Unknown), condition C(PoolReachable=False)); once the pool has been
    unreachable that long, counted from the first run that found it so, they are replaced on reachable pools.
    When the pool answers again, what is left of the replaced members there is fenced before anything else
    (destroyed, undefined, then the volumes they made for themselves removed), so no more than O(replicas)
    members run. Only a machine carrying the set's owner label is ever fenced.
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_set_info
    description: List sets, their members and what is out of date.
  - module: machinery.compute.machine_health_check
    description: Remediate a set's unhealthy members.
  - module: machinery.compute.machine
    description: The options of a set's O(template).
attributes:
  check_mode:
    support: full
    description: Reads the pools and returns the plan (members to create, adopt or delete, and where); writes nothing.
  diff_mode:
    support: full
    description: Each action's members before and after.
options:
  name:
    description: Set name, a DNS-1123 label of at most 57 characters (members add a dash and 5 characters).
    type: str
    required: true
  state:
    description: V(absent) deletes every member and the set's definition.
    type: str
    choices: [present, absent]
    default: present
  replicas:
    description: How many members the set keeps. Required with O(state=present).
    type: int
  selector:
    description: Which machines are members; it must match the template's labels.
    type: dict
    suboptions:
      match_labels:
        description: Labels a member has (all of them).
        type: dict
        required: true
  template:
    description:
      - A member as M(machinery.compute.machine) takes it (every option but C(name), C(uri), C(adopt),
        C(unique_across), C(wait) and C(wait_timeout)), plus C(machine_pool_selector) and C(tolerations) for
        the scheduler. Its C(labels) must include O(selector.match_labels).
      - Members take the template's C(run_strategy). Left out, members get the one the template's C(state)
        implies, as a machine does - V(always) for V(running), the default (autostarted by their host, restarted
        after a crash), V(manual) for V(present), V(halted) for V(stopped) - but V(manual) rather than V(always) in a
        set with O(unreachable_timeout) - a host that comes back must not start the copies the set replaced while
        it was unreachable, so its members are not autostarted.
      - The template's C(state) is one a member is kept in (V(running), V(present), V(stopped), V(paused),
        V(suspended)); V(absent) and V(restarted) are refused, naming C(template.state).
      - With a C(server_group) (C(name), C(policy)) every member joins the group and new members are placed by
        its rule over all Ready pools (with V(anti-affinity), one member per pool at most; a member that
        fits nowhere is reported, not created).
      - Required with O(state=present).
    type: dict
  topology_spread:
    description:
      - Spread the members of the set over the values of pool labels, as Kubernetes' C(topologySpreadConstraints) spread pods
        over node labels. A domain is one value of O(topology_spread[].topology_key); the pools with that value
        are its members.
      - The members of the set count, and each new member is placed by the constraints over all Ready pools at
        once (the even spread over member counts is then not applied).
      - The skew of a placement is the number of those machines in the chosen domain after it, less the fewest in
        any domain of a pool the machine's own filters (readiness, taints, selector, class) let it use.
    type: list
    elements: dict
    suboptions:
      topology_key:
        description: The pool label whose values are the domains (as O(machinery.compute.machine_pool#module:labels) gives them).
        type: str
        required: true
      max_skew:
        description: The largest skew allowed (at least 1).
        type: int
        default: 1
      when_unsatisfiable:
        description:
          - V(refuse) keeps a machine off a domain whose skew would exceed O(topology_spread[].max_skew), and off the
            pools without the label; a machine that fits nowhere then is reported, not created.
          - V(schedule_anyway) prefers the domains of least skew and never refuses.
        type: str
        choices: [refuse, schedule_anyway]
        default: refuse
  delete_policy:
    description: Which members go first when the set shrinks, after the marked ones and those not running.
    type: str
    choices: [Random, Newest, Oldest]
    default: Random
  strategy:
    description: V(spread) keeps the members even over the pools; V(binpack) fills pools.
    type: str
    choices: [spread, binpack]
    default: spread
  rollout:
    description:
      - Replace members made from an older template, in waves. Without it, only new members get the new
        template.
      - Each is a number or a percentage of O(replicas); the surge rounds up, the unavailable down.
    type: dict
    suboptions:
      max_surge:
        description: Members made above O(replicas) during a wave.
        type: raw
        default: 1
      max_unavailable:
        description:
          - Members that may be missing below O(replicas) during a wave. Running members never drop below
            O(replicas) - O(rollout.max_unavailable); members that are not running are replaced first.
        type: raw
        default: 0
  wait:
    description: What a new member waits for.
    type: str
    choices: [none, running, address]
    default: running
  wait_timeout:
    description: Seconds a new member waits for O(wait).
    type: int
    default: 300
  shutdown_timeout:
    description: Seconds of graceful ACPI shutdown before a deleted member is forced off.
    type: int
    default: 60
  workers:
    description: Members created or deleted at the same time.
    type: int
    default: 16
  unreachable_timeout:
    description:
      - How long a pool of the set may stay unreachable (its libvirtd refuses or does not answer) before its
        members are replaced on the other pools, as V(90s), V(5m), V(1h30m) or a number of seconds, whole or not
        (V(3.5)); V(0s) replaces them at once. The first run that finds the pool unreachable records when (in the
        set's record on the reachable pools) and reports it; a run after the timeout replaces. A pool found
        reachable again loses its mark.
      - Without it, the members of a pool the run cannot reach are not seen; the set then tries to make others
        and fails, naming that pool, as it cannot make sure their names are free there. Nothing is replaced.
      - Run the set on a schedule for the timeout to elapse, as a health check.
    type: str
"""

EXAMPLES = r"""
- name: Three web machines over the fleet
  machinery.compute.machine_set:
    name: web
    pools: "{{ fleet }}"
    replicas: 3
    selector:
      match_labels: {app: web}
    template:
      machine_class: small
      image: /var/lib/images/fcos.qcow2
      labels: {app: web}
      ignition: "{{ lookup('file', 'web.ign') }}"
    wait: address
  register: web

- name: Replace the members one by one after a template change
  machinery.compute.machine_set:
    name: web
    pools: "{{ fleet }}"
    replicas: 3
    selector:
      match_labels: {app: web}
    template:
      machine_class: medium
      image: /var/lib/images/fcos.qcow2
      labels: {app: web}
    rollout: {max_surge: 1, max_unavailable: 0}
"""

RETURN = r"""
replicas:
  description: Members after the run (in check mode, now).
  returned: always
  type: int
  sample: 3
desired_replicas:
  description: O(replicas).
  returned: when O(state=present)
  type: int
  sample: 3
ready_replicas:
  description: Members whose phase is Running.
  returned: when O(state=present)
  type: int
  sample: 3
available_replicas:
  description: Running members whose conditions are all True.
  returned: when O(state=present)
  type: int
  sample: 3
members:
  description:
    - Each member with name, pool, phase, template_current, ip_addresses and conditions (C(PoolReachable), with
      C(since) when it is C(False)).
    - A member on an unreachable pool that is not replaced yet shows phase C(Unknown).
  returned: always
  type: list
  elements: dict
  sample:
    - name: workers-483bc
      pool: hv1
      phase: Running
      ip_addresses: []
      template_current: true
      conditions:
      - type: PoolReachable
        status: "True"
    - name: workers-910e8
      pool: hv2
      phase: Running
      ip_addresses: []
      template_current: true
      conditions:
      - type: PoolReachable
        status: "False"
        since: "2026-01-01T10:00:00+00:00"
out_of_date:
  description: Members made from another template than the current one.
  returned: always
  type: list
  elements: str
  sample: ["workers-1f2aa"]
created:
  description: When the set was first recorded on the pools (ISO 8601, UTC); null for a set not recorded yet (check
    mode) or recorded by a release that did not keep it.
  returned: always
  type: str
  sample: "2026-11-25T03:10:00+00:00"
age:
  description: How long ago C(created) was, as kubectl shows an age (V(45s), V(12m), V(3h), V(2d)); null with it.
  returned: always
  type: str
  sample: 12m
planned_members:
  description: Names of the members the run creates (or would create in check mode).
  returned: always
  type: list
  elements: str
  sample: ["workers-910e8"]
unreachable_pools:
  description: The pools of the set found unreachable, with name, uri and since when (with O(unreachable_timeout)).
  returned: always
  type: list
  elements: dict
  sample:
    - name: hv3
      uri: qemu+ssh://root@hv3/system
      since: "2026-01-01T10:00:00+00:00"
replaced_members:
  description: The members this run gave up on, their pool unreachable for O(unreachable_timeout), with name, pool,
    uri and since when their pool was unreachable; the set makes others in their place.
  returned: always
  type: list
  elements: dict
  sample:
    - name: workers-1f2aa
      pool: hv3
      uri: qemu+ssh://root@hv3/system
      since: "2026-01-01T10:00:00+00:00"
fenced_members:
  description: Replaced members found again on their pool and fenced (destroyed and undefined) by this run.
  returned: always
  type: list
  elements: str
  sample: ["workers-1f2aa"]
table:
  description: Lines NAME POOL CLASS PHASE RESTARTS AGE IPS of the members.
  returned: always
  type: list
  elements: str
  sample:
    - NAME            POOL   CLASS   PHASE     RESTARTS   AGE   IPS
    - workers-483bc   hv1    small   Running   0          3m    <none>
    - workers-910e8   hv2    small   Running   0          4s    <none>
actions:
  description: The short form of each planned action (fence, reclaim, record, adopt, create, delete, forget), in
    order.
  returned: always
  type: list
  elements: str
  sample: ["create"]
plan:
  description: Each action with its target (a member or a pool), what it changes, its wave and libvirt steps.
  returned: always
  type: list
  elements: dict
  sample:
    - action: create
      target: workers-910e8
      before: {}
      after:
        pool: hv2
        template_hash: d813bc9d0c
      steps:
      - action: create_machine
        target: workers-910e8
        pool: hv2
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import MachineSetResource, set_status
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineSetModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_SET)
    module_kwargs = {"required_if": [("state", "present", ("replicas", "template", "selector"))]}

    def run_pools(self, entries):
        template = self.params.get("template") or {}
        self.hide_secrets(template)
        fleet = Fleet(entries, self.url_opener(), self.coordination)
        try:
            resource = MachineSetResource(fleet, self.params, self.check_mode)
            plan, observed = converge(resource, self.check_mode)
            return self.converged(plan, **set_status(resource.desired, observed, plan))
        finally:
            fleet.close()


def main():
    MachineSetModule()()


if __name__ == "__main__":
    main()
