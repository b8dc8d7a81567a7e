#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_snapshot
short_description: Take, list, revert and delete snapshots of a machine
description:
  - A snapshot is a libvirt internal snapshot kept inside each of the machine's qcow2 disk files, so the
    machine's disks stay the thin overlays on the cached image that the collection made; nothing is copied.
  - A running machine is snapshotted with its memory and device state (a checkpoint, O(memory=true));
    reverting to it brings the guest back running at that instant. A stopped machine is snapshotted disk-only;
    reverting to it leaves the machine stopped with its disks as they were.
  - libvirt takes internal snapshots of a running machine only with its memory, so O(memory=false) on a running
    machine is refused, and so is O(memory=true) on a stopped one.
  - A machine with an encrypted (LUKS) volume or a shareable raw volume is refused, naming the disks, since an
    internal snapshot lives inside a qcow2 file. The cloud-init seed (a read-only cdrom) is left out.
  - Reverting restores the machine's definition as it was at the snapshot too (its size, volumes and NICs).
  - Every run returns the machine's snapshots as RV(snapshots). A machine deleted with the
    M(machinery.compute.machine) module takes its snapshots along; a machine with snapshots cannot be moved by
    M(machinery.compute.machine_migrate) (delete its snapshots first).
version_added: 0.4.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: Start or stop a machine; deleting it deletes its snapshots.
  - module: machinery.compute.machine_backup
    description: Full copies of a machine's disks in the pool's storage, which outlive the machine.
  - module: machinery.compute.machine_migrate
    description: Refuses to move a machine that has snapshots.
attributes:
  check_mode:
    support: full
    description: Computes the same plan and writes nothing.
  diff_mode:
    support: full
    description: Shows the snapshots taken, deleted, pruned or reverted to.
options:
  machine:
    description: The machine, on the pool at O(uri).
    type: str
    required: true
  name:
    description:
      - Name of the snapshot, a DNS-1123 label.
      - With O(state=present) a snapshot of that name is taken unless it exists (an existing one is left alone).
        Without a name, every run takes a new snapshot named after the time (V(s20250101-020000)).
      - Required with O(state=absent) and O(state=reverted).
    type: str
  memory:
    description:
      - Whether the snapshot saves the guest's memory and device state as well as its disks.
      - When left out, a running machine is snapshotted with its memory and a stopped one without.
      - V(true) needs a running machine, V(false) a stopped one.
    type: bool
  state:
    description:
      - V(present) takes the snapshot O(name) if it does not exist; V(absent) deletes it.
      - V(reverted) brings the machine back to the snapshot O(name). Reverting to a snapshot of a stopped machine
        again, before the machine was started, is no change; a snapshot with memory is reverted to on every run
        (a running guest has moved on from any instant).
    type: str
    choices: [present, absent, reverted]
    default: present
  retention:
    description:
      - Delete the machine's oldest snapshots beyond O(retention.count) after this run's snapshot. The newest is
        always kept; snapshots not taken by this module are never deleted by retention.
    type: dict
    suboptions:
      count:
        description: Keep at most this many snapshots (at least 1).
        type: int
"""

EXAMPLES = r"""
- name: A snapshot with memory of a running machine before an upgrade
  machinery.compute.machine_snapshot:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade

- name: Back to it after a failed upgrade (the guest runs again from that instant)
  machinery.compute.machine_snapshot:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade
    state: reverted

- name: A snapshot named after the time, keeping the last 3
  machinery.compute.machine_snapshot:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    retention: {count: 3}

- name: Delete it
  machinery.compute.machine_snapshot:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade
    state: absent
"""

RETURN = r"""
snapshots:
  description: The machine's snapshots after the run (in check mode, as the run would leave them), oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The snapshot's name.
      type: str
      sample: before-upgrade
    created:
      description: When it was taken (UTC, ISO 8601).
      type: str
      sample: '2026-03-10T02:00:00.412093+00:00'
    memory:
      description: Whether it holds the guest's memory and device state (a checkpoint of a running machine).
      type: bool
      sample: true
    state:
      description: The machine's state when it was taken (C(running), C(paused) or C(shutoff)); a revert brings
        the machine back to it.
      type: str
      sample: running
    disks:
      description: The devices whose disks hold the snapshot.
      type: list
      elements: str
      sample: ["vda", "vdb"]
    current:
      description: Whether it is libvirt's current snapshot (the last taken or reverted to).
      type: bool
      sample: true
actions:
  description: The short form of each planned action (C(create), C(delete), C(revert), C(prune retention)).
  returned: always
  type: list
  elements: str
  sample: ["create", "prune retention"]
plan:
  description: The actions of the run (or, in check mode, of the run it would make), each with its libvirt steps.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action.
      type: str
      sample: create
    target:
      description: The snapshot (or, for C(prune), the machine).
      type: str
      sample: before-upgrade
    fields:
      description: What it changes, where it names fields.
      type: list
      elements: str
      sample: ["retention"]
    before:
      description: Before the action.
      type: dict
      sample: {}
    after:
      description: After the action.
      type: dict
      sample: {"snapshot": "before-upgrade", "memory": true, "state": "running", "disks": ["vda", "vdb"]}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample:
        - {"action": "snapshot_create", "target": "before-upgrade", "memory": true}
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.machines.snapshots import SnapshotResource, shown


class MachineSnapshotModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE_SNAPSHOT)

    def run(self, ctx):
        resource = SnapshotResource(ctx, self.params)
        plan, seen = converge(resource, self.check_mode)
        snapshots = plan.facts["remaining"] if self.check_mode else seen["snapshots"]
        return self.converged(plan, snapshots=[shown(entry) for entry in snapshots])


def main():
    MachineSnapshotModule()()


if __name__ == "__main__":
    main()
