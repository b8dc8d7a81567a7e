#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_backup
short_description: Back up a machine's disks, list, restore and prune its backups
description:
  - A backup is a full, standalone qcow2 copy of each of the machine's own disks (its root and data volumes; not
    the cloud-init seed, not shareable disks), kept as volumes in the pool's storage named
    C(<machine>.backup.<backup>.<device>.qcow2), and listed in the pool's registry. Everything goes through the
    libvirt connection, so it works over any URI.
  - A running machine is backed up with a libvirt push-mode backup job, which copies each disk as it was when the
    job began while the guest runs on. When the guest agent answers, the guest's file systems are frozen while the
    job begins (C(quiesced=true)); otherwise the copy is crash-consistent and C(reason) says why.
  - A stopped machine is backed up by cloning its disk volumes through the storage driver.
  - Every run returns the machine's backups as RV(backups).
  - The collection runs no scheduler. Schedule backups with an AWX / Automation Controller schedule on a job
    template, or cron on the controller (see C(docs/backups.md) in the collection).
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: Stop a machine before a restore and start it again; its C(guest) shows whether the agent answers.
  - module: machinery.compute.machine_info
    description: Find the machines to back up, by name or labels.
  - module: machinery.compute.machine_pool
    description: The pool whose storage holds the backup volumes.
attributes:
  check_mode:
    support: full
    description: Computes the same plan and writes nothing.
  diff_mode:
    support: full
    description: Shows the backups taken, deleted, pruned or restored.
options:
  machine:
    description: The machine, on the pool at O(uri).
    type: str
    required: true
  name:
    description:
      - Name of the backup, a DNS-1123 label.
      - With O(state=present) a backup of that name is taken unless it exists. Without a name, every run takes a
        new backup named after the time (V(b20250101-020000)), which is what a scheduled run wants.
      - Required with O(state=absent) and O(restore=true).
    type: str
  state:
    description: V(present) takes the backup O(name) if it does not exist; V(absent) deletes it.
    type: str
    choices: [present, absent]
    default: present
  restore:
    description:
      - Copy backup O(name) back over the machine's disks. The machine must be stopped.
      - Restoring the same backup again before the machine was started is no change.
    type: bool
    default: false
  retention:
    description:
      - Prune the machine's backups after this run's backup. The newest backup is always kept.
    type: dict
    suboptions:
      count:
        description: Keep at most this many backups (at least 1).
        type: int
      days:
        description: Delete backups older than this many days (at least 1).
        type: int
  timeout:
    description: Seconds to wait for a backup job of a running machine; it is cancelled after that.
    type: int
    default: 600
"""

EXAMPLES = r"""
- name: Nightly backup, keeping a week of them (run from an AWX schedule or cron)
  machinery.compute.machine_backup:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    retention: {count: 7, days: 7}

- name: A named backup before an upgrade
  machinery.compute.machine_backup:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade

- name: Stop the machine, restore the backup, start it again
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: db-1
    state: stopped
- machinery.compute.machine_backup:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade
    restore: true
- machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: db-1
    state: running

- name: Delete it
  machinery.compute.machine_backup:
    uri: qemu+ssh://root@hv1/system
    machine: db-1
    name: before-upgrade
    state: absent
"""

RETURN = r"""
backup:
  description: The backup taken by this run (its name, in check mode), or null.
  returned: always
  type: dict
  sample:
    name: b20260310-020000
    created: '2026-03-10T02:00:00+00:00'
    method: push
    quiesced: true
    reason: file systems frozen through the guest agent while the backup began
    disks:
      - {"device": "vda", "volume": "db-1.backup.b20260310-020000.vda.qcow2", "size": 2147483648}
      - {"device": "vdb", "volume": "db-1.backup.b20260310-020000.vdb.qcow2", "size": 10737418240}
backups:
  description: The machine's backups after the run, oldest first.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The backup's name.
      type: str
      sample: b20260310-020000
    created:
      description: When it was taken (UTC, ISO 8601).
      type: str
      sample: '2026-03-10T02:00:00+00:00'
    method:
      description: C(push) (a backup job of the running machine) or C(copy) (volumes cloned while it was stopped).
      type: str
      sample: push
    quiesced:
      description: Whether the guest's file systems were frozen through the guest agent.
      type: bool
      sample: false
    reason:
      description: Why the backup is or is not quiesced.
      type: str
      sample: 'the guest agent did not freeze the file systems (Guest agent is not responding: QEMU guest agent is
        not connected): the backup is crash-consistent'
    disks:
      description: Each disk copied, with C(device), C(volume) and C(size) in bytes.
      type: list
      elements: dict
      sample: [{"device": "vda", "volume": "db-1.backup.b20260310-020000.vda.qcow2", "size": 2147483648}]
actions:
  description: The short form of each planned action (C(backup), C(delete), C(restore), C(prune retention)).
  returned: always
  type: list
  elements: str
  sample: ["backup", "prune retention"]
plan:
  description: The actions of the run (or, in check mode, of the run it would make), each with its libvirt steps.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action.
      type: str
      sample: backup
    target:
      description: The backup (or, for C(prune), the machine).
      type: str
      sample: b20260310-020000
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
      sample: {"backup": "b20260310-020000", "devices": ["vda", "vdb"], "method": "push"}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample:
        - {"action": "fs_freeze", "target": "db-1"}
        - {"action": "backup_begin", "target": "db-1"}
        - {"action": "fs_thaw", "target": "db-1"}
        - {"action": "wait_job", "target": "db-1"}
        - {"action": "write_document", "target": "backups-db-1"}
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.machines.backups import BackupResource, shown
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineBackupModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE_BACKUP)

    def run(self, ctx):
        ctx.require_registration()
        resource = BackupResource(ctx, self.params)
        plan, seen = converge(resource, self.check_mode)
        backups = plan.facts["remaining"] if self.check_mode else seen["backups"]
        taken = plan.find("backup")
        backup = shown(resource.report) if resource.report else ({"name": taken.target} if taken else None)
        return self.converged(plan, backup=backup,
                              backups=[shown(entry) for entry in sorted(backups, key=lambda e: e["created"])])


def main():
    MachineBackupModule()()


if __name__ == "__main__":
    main()
