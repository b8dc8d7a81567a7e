#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: volume_attach
short_description: Attach a volume of the pool's storage to a machine, hot-plugging it when the machine runs
description:
  - Attaches the volume O(volume) of the pool's C(machinery) storage pool to the machine O(machine), creating it
    first when O(size) is given and it does not exist.
  - A running machine gets the disk hot-plugged (live and persistent), a stopped one in its persistent
    configuration only. RV(volume.state) is C(Attached) only once libvirt's live (or persistent) XML shows it.
  - O(state=detached) hot-unplugs the disk and waits until the guest has released it (up to O(timeout)).
  - A larger O(size) grows the volume, live when the machine runs; volumes are never shrunk.
  - A volume attached to another machine is refused unless O(shareable=true) (raw volumes only).
  - O(ephemeral=true) volumes are deleted with the machine, and when they are detached; the others survive both
    and can be attached elsewhere.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: A machine's whole list of volumes, converged with the rest of it.
  - module: machinery.compute.nic_attach
    description: Attach or detach one network interface.
  - module: machinery.compute.machine_info
    description: A machine's volumes and their state.
attributes:
  check_mode:
    support: full
    description: Validates and computes the change; writes nothing.
  diff_mode:
    support: full
    description: The attachment before and after.
options:
  machine:
    description: Name of the machine.
    type: str
    required: true
  volume:
    description: Name of the volume in the pool's C(machinery) storage pool.
    type: str
    required: true
  size:
    description: Size (a quantity such as V(10Gi)); creates the volume when missing, grows it when larger.
    type: raw
  format:
    description: Format of a volume that is created.
    type: str
    choices: [qcow2, raw]
    default: qcow2
  device:
    description: Target device; by default the next free name (vdb, vdc, ... or sdb, ... for scsi and sata) that
      no other disk of the machine holds.
    type: str
  bus:
    description:
      - Disk bus; SATA disks cannot be hot-plugged.
      - Left out, an attached volume keeps its bus and a new attachment gets V(virtio); a given bus that differs
        from the attached one is refused (detach the volume first).
    type: str
    choices: [virtio, scsi, sata]
  state:
    description: Whether the volume is attached.
    type: str
    choices: [attached, detached]
    default: attached
  ephemeral:
    description: Delete the volume together with the machine. Unset keeps the recorded value (false when new).
    type: bool
  shareable:
    description: Allow the (raw) volume to be attached to more than one machine.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for the guest to release the disk on detach.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: A 10Gi data disk, hot-plugged into web-1
  machinery.compute.volume_attach:
    uri: qemu+ssh://root@hv1/system
    machine: web-1
    volume: web-1-data.qcow2
    size: 10Gi

- name: Hot-unplug it again
  machinery.compute.volume_attach:
    uri: qemu+ssh://root@hv1/system
    machine: web-1
    volume: web-1-data.qcow2
    state: detached
"""

RETURN = r"""
volume:
  description: The attachment.
  returned: always
  type: dict
  contains:
    name:
      description: Volume name.
      type: str
      sample: web-1-logs
    device:
      description: Target device in the guest's configuration.
      type: str
      sample: vdc
    bus:
      description: Disk bus.
      type: str
      sample: virtio
    size:
      description: Size as a quantity.
      type: str
      sample: 32Gi
    ephemeral:
      description: Whether the volume goes with the machine.
      type: bool
      sample: false
    state:
      description: Pending, Attached (libvirt's live or persistent XML shows it) or Detached.
      type: str
      sample: Attached
machine:
  description:
    - The machine's status after the run, in the shape of RV(machinery.compute.machine#module:machine), documented
      key by key there (C(ansible-doc machinery.compute.machine)). Its C(volumes) list the attachment.
  returned: always
  type: dict
  sample:
    name: web-1
    pool: hv1
    phase: Running
    volumes: [{"name": "web-1-logs", "device": "vdc", "size": "32Gi", "ephemeral": false, "state": "Attached"}]
actions:
  description: The short form of each planned action, in order, for example C(create), C(start), C(update cpu, memory).
  returned: always
  type: list
  elements: str
  sample: ["attach"]
plan:
  description:
    - The actions of the run (or, in check mode, of the run it would make), in order, each with what it changes.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action, for example C(create), C(start), C(update), C(attach), C(register).
      type: str
      sample: attach
    target:
      description: What it acts on (a machine, volume, NIC, storage pool, network or document name).
      type: str
      sample: web-1-logs
    fields:
      description: For C(update), the owned fields it changes.
      type: list
      elements: str
      sample: []
    before:
      description: The owned fields before the action, where it changes some.
      type: dict
      sample: {}
    after:
      description: The owned fields after the action, where it changes some.
      type: dict
      sample: {"volume": "web-1-logs", "device": "vdc", "bus": "virtio", "size": "32Gi"}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample:
        - action: create_volume
          target: web-1-logs
          format: qcow2
          size: 34359738368
        - action: attach_device
          target: ua-vol-web-1-logs
        - action: write_record
          target: web-1
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.machines.attach import VolumeAttachment
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class VolumeAttachModule(MachineryModule):
    argument_spec = options.argument_spec(options.VOLUME_ATTACH)

    def run(self, ctx):
        return self.attachment_result(VolumeAttachment(ctx, self.params, self.check_mode).ensure(), "volume")


def main():
    VolumeAttachModule()()


if __name__ == "__main__":
    main()
