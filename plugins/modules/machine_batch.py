#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_batch
short_description: Schedule and converge many machines across pools at once
description:
  - Converges a list of machines over a fleet of pools in one process, with one libvirt connection per pool
    and the machines converged in parallel threads. This is what the C(machinery.compute.machines) role runs.
  - Machines without C(machine_pool) are placed with the same scheduler as the C(machinery.compute.scheduler)
    lookup (a machine that already exists on a pool stays there); each is then converged like
    M(machinery.compute.machine) would, with its name kept unique across the pools under their admission locks.
  - A machine that a concurrent run crowded out (its pool filled up, or its name appeared on another pool
    first) is rescheduled against fresh pool snapshots, at most O(retries) times.
  - Machines with C(state=absent) are deleted from every pool that has them.
  - Every machine is validated before anything is written; one invalid machine fails the whole run.
  - Without O(pools), the machines go to the one pool at O(uri), which C(module_defaults) of the action group
    can set for every module of a play.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: One machine, with the same options as each entry of O(machines).
  - module: machinery.compute.machine_info
    description: List the machines the batch made.
  - module: machinery.compute.machine_pool_info
    description: The pools' capacity the scheduler places against.
attributes:
  check_mode:
    support: full
    description: Schedules, validates and computes every machine's plan; writes nothing.
  diff_mode:
    support: full
    description: The owned fields of each changed machine, before and after, keyed by machine name.
options:
  machines:
    description:
      - The machines, each a mapping of the options of M(machinery.compute.machine) (except C(uri) and
        C(unique_across)), plus the scheduling keys C(machine_pool_selector) (labels) and C(machine_pool) (pin
        to a pool by name). The machine's C(tolerations) (key, operator, value, effect) steer the scheduler too,
        and are recorded with the machine.
      - Each machine's C(run_strategy) is the machine module's, derived from its C(state) when left out (a
        running machine is V(always), autostarted by its host and started again by every converge). As there,
        a change of strategy or autostart is part of the machine's create, start or stop, and an action of its own
        (C(update run_strategy)) only when its power stays as it is.
      - The scheduler also filters and weighs on storage (a machine's root disk, C(root_size) or its local image's
        virtual size, and its new volumes) and on the machine's C(server_group) (C(name), C(policy) V(affinity),
        V(anti-affinity), V(soft-affinity) or V(soft-anti-affinity)); members on the pools and the machines placed
        before it in this batch count, and a hard rule refuses the machine naming its group rather than break it.
        See C(docs/placement.md).
    type: list
    elements: dict
    required: true
  topology_spread:
    description:
      - Spread the machines of O(machines) over the values of pool labels, as Kubernetes' C(topologySpreadConstraints) spread pods
        over node labels. A domain is one value of O(topology_spread[].topology_key); the pools with that value
        are its members.
      - The machines of O(machines) count, those that exist already where they are and those placed by this run as
        they are placed.
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
  defaults:
    description:
      - Options every machine of O(machines) takes unless it sets them itself, for example C(wait) or
        C(machine_class). A machine's own key wins whole, so a machine with its own C(labels) does not merge
        them with these. The keys are those of an element of O(machines), except C(name).
      - Merging here costs nothing per machine on the controller, where a Jinja C(combine) over a long list of
        machines is slow; the C(machinery.compute.machines) role passes its C(machines_wait),
        C(machines_wait_timeout) and C(machines_shutdown_timeout) this way.
    type: dict
  strategy:
    description: Scheduling strategy.
    type: str
    choices: [spread, binpack]
    default: spread
  retries:
    description: How often a machine crowded out by a concurrent run is rescheduled (0 to 100).
    type: int
    default: 3
  workers:
    description: Machines converged at the same time (1 to 256).
    type: int
    default: 16
  return_machines:
    description:
      - Which machines RV(machines) and RV(placements) list. V(all) lists every machine of O(machines); V(changed)
        only those this run changed (or would change, in check mode); V(none) none of them.
      - RV(table), RV(counts) and RV(failures) always cover every machine. A status is about 1.4 KB of JSON that
        the module encodes and ansible-core carries back and keeps in the task's result; over thousands of
        machines V(changed) or V(none) saves that (0.3-0.9 s of a role run creating 1,000, see
        C(docs/performance.md)).
    type: str
    choices: [all, changed, none]
    default: all
"""

EXAMPLES = r"""
- name: Three machines over two hypervisors
  machinery.compute.machine_batch:
    pools:
      - qemu+ssh://root@hv1/system
      - {name: hv2, uri: qemu+ssh://root@hv2/system}
    machines:
      - {name: web-1, machine_class: small, image: /var/lib/images/fcos.qcow2, wait: address}
      - {name: web-2, machine_class: small, image: /var/lib/images/fcos.qcow2, wait: address}
      - {name: old-1, state: absent}
  register: fleet

- name: Where they went
  ansible.builtin.debug:
    var: fleet.table

- name: One pool for every module of the play, machine_batch included
  module_defaults:
    group/machinery.compute.machinery:
      uri: qemu+ssh://root@hv1/system
  block:
    - name: Two machines on hv1
      machinery.compute.machine_batch:
        machines:
          - {name: db-1, machine_class: large, image: /var/lib/images/fcos.qcow2}
          - {name: db-2, machine_class: large, image: /var/lib/images/fcos.qcow2}
      register: fleet

- name: Where they went (hv1)
  ansible.builtin.debug:
    var: fleet.table
"""

RETURN = r"""
machines:
  description:
    - Each machine's status after the run, in the shape of RV(machinery.compute.machine#module:machine), documented
      key by key there (C(ansible-doc machinery.compute.machine)).
    - Only the machines O(return_machines) asks for.
  returned: always
  type: list
  elements: dict
  sample:
    - name: web-1
      pool: hv1
      uri: qemu+ssh://root@hv1/system
      phase: Running
      machine_class: small
      ip_addresses: ["192.168.122.152"]
placements:
  description:
    - Where each machine was placed and why (name, pool, uri, reason).
    - Only the machines O(return_machines) asks for.
  returned: always
  type: list
  elements: dict
  sample:
    - name: web-1
      pool: hv1
      uri: qemu+ssh://root@hv1/system
      reason: 'spread: 2/2 pools fit; hv1 has 30 cpu and 9.8Gi free after placement'
failures:
  description: Machines that could not be converged, with name, pool, reason, field and msg.
  returned: always
  type: list
  elements: dict
  sample:
    - name: db-2
      pool: hv2
      reason: PoolFull
      field: null
      msg: 'pool hv2 is full: 1 cpu and 4Gi asked, 0 cpu and 2Gi free'
counts:
  description: How many machines of O(machines) are in each phase after the run (a deleted one is C(Terminated)).
  returned: always
  type: dict
  sample: {Running: 2, Terminated: 1}
table:
  description: Lines NAME POOL CLASS PHASE RESTARTS AGE IPS of the machines.
  returned: always
  type: list
  elements: str
  sample:
    - NAME    POOL   CLASS   PHASE     RESTARTS   AGE   IPS
    - web-1   hv1    small   Running   0          1m    192.168.122.152
attempts:
  description: Scheduling rounds taken (more than one when machines were rescheduled).
  returned: always
  type: int
  sample: 1
"""


from ansible_collections.machinery.compute.plugins.module_utils.fleets import batch
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import with_done
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule

FAILURES_SHOWN = 10  # in msg; every failure is in the failures return


class MachineBatchModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_BATCH)

    def run_pools(self, entries):
        specs = batch.validated(self.params["machines"], self.params["defaults"])
        for spec in specs:
            self.hide_secrets(spec)
        outcome = batch.converge(entries, specs, self.params["strategy"], self.params["retries"],
                                 self.params["workers"], self.check_mode, self.url_opener(),
                                 self.params["topology_spread"], self.coordination)
        result = dict(batch.summary(outcome, specs, self.params["return_machines"]), changed=outcome.changed,
                      warnings=outcome.warnings,
                      diff=self.diff(outcome.before, outcome.after) if outcome.changed else None)
        if outcome.failures:
            shown = outcome.failures[:FAILURES_SHOWN]
            more = len(outcome.failures) - len(shown)
            named = ["%s%s: %s" % (failure["name"], " on pool %s" % failure["pool"] if failure.get("pool") else "",
                                   failure["msg"]) for failure in shown]
            tail = "; and %d more (see failures)" % more if more else ""
            result["msg"] = "%d of %d machines failed: %s%s" % (len(outcome.failures), len(specs), "; ".join(named), tail)
            if not self.check_mode:
                result["done"] = outcome.done()
                result["msg"] = with_done(result["msg"], result["done"])
            result["failed"] = True
        return result


def main():
    MachineBatchModule()()


if __name__ == "__main__":
    main()
