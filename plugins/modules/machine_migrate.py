#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_migrate
short_description: Move a machine to another pool, cold or live, resumable when interrupted
description:
  - Moves the machine O(machine) off the pool at O(uri) to the pool O(target), or to the pool the scheduler picks
    among O(pools) when O(target) is not given (the filters and score of the C(machinery.compute.scheduler)
    lookup; the machine keeps its own cpu and memory, its class must be published on the target, and a pool
    with a C(NoSchedule) or C(NoExecute) taint that the tolerations in the machine's record do not tolerate is
    never picked).
  - A cold move works between any two pools over any URI, through libvirt alone. The guest is shut down (ACPI,
    then forced after O(shutdown_timeout)); every file it has in its pool's storage (disks, seed ISO, Ignition
    file, console log) is streamed into the target's storage with its holes kept, so a thin qcow2 overlay stays
    thin and the base image is cached on the target by its checksum (streamed from the source's cache when the
    target lacks it, its sha256 verified); the domain is defined on the target with the same name, UUID, MACs,
    record and labels, started if it ran, and only then deleted from the source.
  - A live move uses libvirt's peer-to-peer migration with an incremental copy of the writable disks (onto
    overlays prepared on the target); the read-only files are streamed first. It needs the source host's libvirt
    daemon to reach the target's URI and QEMU to reach QEMU. Two pools behind unix sockets of this controller
    (the lab's pools) migrate over unix sockets beside the target's socket.
  - Before its first write a move puts a journal C(move-<machine>) into the registry of both pools. A run that
    dies leaves the machine whole on one pool and the journal behind, and the next run of this module for that
    machine resolves it; before the copy was defined on the target, the partial copy is deleted and the move made
    again; after that, the move is finished. A move that fails before the source is deleted is rolled back at
    once (the copy deleted, the guest started again on the source).
  - A machine that is no longer on O(uri), or already on O(target), is left alone, so a re-run changes nothing.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.action_group
  - machinery.compute.connection.HOLD
seealso:
  - module: machinery.compute.machine
    description: Create, change or delete one machine.
  - module: machinery.compute.machine_pool_info
    description: The pools a machine can move to.
  - module: machinery.compute.machine_info
    description: Where each machine runs.
attributes:
  check_mode:
    support: full
    description: Picks the target, checks it and plans every step; writes nothing.
  diff_mode:
    support: full
    description: The pool of the machine before and after.
options:
  uri:
    description:
      - libvirt URI of the pool the machine is moved off. The common option of the action group, so
        C(module_defaults) of C(group/machinery.compute.machinery) may set it.
      - When not given, the machine is looked for among O(pools), and O(target) is required.
    type: str
  pools:
    description:
      - The fleet, as libvirt URIs or mappings with C(uri) and an optional C(name). The scheduler picks a target
        among them, O(target) may name one of them, and an interrupted move is looked for on them.
    type: list
    elements: raw
  machine:
    description: Name of the machine.
    type: str
    required: true
  target:
    description:
      - The pool to move the machine to, by the name it has in O(pools) (or its registered name) or by libvirt URI.
      - When not given, the scheduler picks one of O(pools) other than the machine's own, by O(strategy).
    type: str
  mode:
    description:
      - V(cold) shuts the guest down and copies its files; V(live) migrates the running guest; V(auto) is V(live)
        for a running machine where the two daemons share this controller's file system (unix socket URIs, as in
        the lab) and V(cold) otherwise, since between real hosts only a try can tell whether they reach each other.
      - V(live) of a stopped machine fails naming O(mode).
    type: str
    choices: [cold, live, auto]
    default: auto
  policy:
    description:
      - How a live move is run (KubeVirt's MigrationPolicy, Nova's live-migration timeout). Left out, libvirt's
        defaults, no timeout.
      - Only O(policy.max_parallel) applies to a cold move (its copies are streams of the collection's own).
    type: dict
    suboptions:
      bandwidth:
        description:
          - The most the migration may send per second, a quantity (V(100Mi), or V(100Mi/s)); libvirt counts in
            whole MiB per second, so less than V(1Mi) is refused.
        type: raw
      max_downtime:
        description: Milliseconds the guest may be paused at the switch-over (virDomainMigrateSetMaxDowntime).
        type: int
      completion_timeout_per_gib:
        description:
          - Seconds the move may take per GiB of the guest's memory (a 512Mi guest gets half); then O(policy.on_timeout).
        type: int
      on_timeout:
        description:
          - V(abort) cancels the migration; the machine runs on at the source, whole, the copy on the target is
            removed, and the run fails naming O(policy.completion_timeout_per_gib).
          - V(postcopy) switches to post-copy (the guest runs on the target, fetching the pages it lacks), which
            always completes; where the daemons cannot, the migration fails as it would without a policy.
        type: str
        choices: [abort, postcopy]
        default: abort
      auto_converge:
        description: Let QEMU slow the guest's CPUs down while it dirties memory faster than it is copied.
        type: bool
        default: false
      max_parallel:
        description:
          - At most this many moves at once on the source and the target pools; a move waits (up to 900 s) for
            the others' journals to go.
        type: int
  strategy:
    description: Scheduling strategy when the scheduler picks the target.
    type: str
    choices: [spread, binpack]
    default: spread
  shutdown_timeout:
    description: Seconds the guest has to power off after the ACPI request before it is forced off (cold moves).
    type: int
    default: 60
  wait:
    description:
      - What to wait for once the machine is on the target. V(running) and V(none) return once its domain runs;
        V(address) waits for a DHCP lease on one of its networks.
    type: str
    choices: [none, running, address]
    default: running
  wait_timeout:
    description: Seconds to wait for an address with O(wait=address).
    type: int
    default: 300
requirements:
  - libvirt-python
  - lxml
notes:
  - UEFI variables are not carried by a cold move; the target's libvirt starts the machine with fresh ones from
    its template.
  - A volume shared with another machine cannot move with one of them; the move is refused naming it.
  - The module runs where the play runs it (usually the controller, the URIs pointing at the pool hosts).
"""

EXAMPLES = r"""
- name: Move web-1 off hv1 to whichever pool fits it best
  machinery.compute.machine_migrate:
    uri: qemu+ssh://root@hv1/system
    pools:
      - {name: hv2, uri: qemu+ssh://root@hv2/system}
      - {name: hv3, uri: qemu+ssh://root@hv3/system}
    machine: web-1
    mode: cold
  register: moved

- name: Downtime of the move
  ansible.builtin.debug:
    msg: "{{ moved.machine.name }} is on {{ moved.target.pool }} after {{ moved.downtime }} s of downtime"

- name: Move db-1 live to hv3
  machinery.compute.machine_migrate:
    pools:
      - {name: hv1, uri: qemu+ssh://root@hv1/system}
      - {name: hv3, uri: qemu+ssh://root@hv3/system}
    machine: db-1
    target: hv3
    mode: live
"""

RETURN = r"""
machine:
  description:
    - The machine where it is after the run (in check mode, where it is now), in the shape of
      RV(machinery.compute.machine#module:machine), documented key by key there
      (C(ansible-doc machinery.compute.machine)).
  returned: always
  type: dict
  sample:
    name: web-1
    pool: hv2
    uri: qemu+ssh://root@hv2/system
    phase: Running
source:
  description: The pool the machine was moved off (pool, uri); null when nothing moved.
  returned: always
  type: dict
  sample: {"pool": "hv1", "uri": "qemu+ssh://root@hv1/system"}
target:
  description: The pool the machine was moved to (pool, uri); null when nothing moved.
  returned: always
  type: dict
  sample: {"pool": "hv2", "uri": "qemu+ssh://root@hv2/system"}
mode:
  description: How it moved, V(cold) or V(live); null when nothing moved.
  returned: always
  type: str
  sample: cold
reason:
  description: Why the target was chosen (the scheduler's reason), when a move was planned.
  returned: always
  type: str
  sample: 'spread: 1/1 pools fit; hv2 has 30 cpu and 9.8Gi free after placement'
downtime:
  description:
    - Seconds the guest did not run, for a running machine that moved. Cold, from the shutdown request until the
      domain runs on the target; live, the pause libvirt measured at the switch-over.
  returned: always
  type: float
  sample: 2.4
migration:
  description:
    - What a live move's watch saw, polling the source's job every half second (also written as progress while it
      runs, when an action plugin watches), or null for a cold move or none.
  returned: always
  type: dict
  sample: {"seconds": 14.2, "timeout": 16.0, "timed_out": null, "iterations": 4, "samples": 27,
           "progress": {"data_remaining": 1048576, "memory_remaining": 1048576, "dirty_rate": 1200,
                        "iteration": 3, "memory_bps": 104857600}}
actions:
  description: The plan's actions (V(move), or V(finish), V(discard), V(discard_copy) or V(roll_back) for a move
    a dead run left).
  returned: always
  type: list
  elements: str
  sample: ["move"]
plan:
  description: Each action with its pool before and after and every libvirt step, in order.
  returned: always
  type: list
  elements: dict
  sample:
    - action: move
      target: web-1
      before:
        pool: hv1
      after:
        pool: hv2
        mode: cold
      steps:
      - action: shutdown
        target: web-1
        pool: hv1
      - action: copy_volume
        target: web-1-root.qcow2
        pool: hv2
      - action: define
        target: web-1
        pool: hv2
      - action: start
        target: web-1
        pool: hv2
      - action: undefine
        target: web-1
        pool: hv1
"""

from ansible_collections.machinery.compute.plugins.module_utils.fleets import migrate
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import pool_entries
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineMigrateModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_MIGRATE)

    def pool_entries(self):
        """The fleet is ``pools`` alone: ``uri`` names the source, which need not be one of them."""
        return pool_entries(self.params["pools"]) if self.params["pools"] is not None else []

    def run_pools(self, entries):
        plan, result = migrate.run(entries, self.params, self.check_mode, self.url_opener(),
                                   self.coordination)
        return self.converged(plan, **result)


def main():
    MachineMigrateModule()()


if __name__ == "__main__":
    main()
