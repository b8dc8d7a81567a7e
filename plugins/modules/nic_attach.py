#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: nic_attach
short_description: Attach a NIC to a machine, hot-plugging it when the machine runs
description:
  - Attaches the NIC O(name) on a libvirt network or a host bridge to the machine O(machine).
  - The MAC is derived from the machine and NIC names unless O(mac) is given, so it is the same on every run and
    after a rebuild. A MAC that another NIC on the same network already uses is refused.
  - A running machine gets the NIC hot-plugged (live and persistent), a stopped one in its persistent
    configuration only; O(state=detached) hot-unplugs it and waits until the guest has released it.
  - With O(wait=address) the module waits for the NIC's DHCP lease and returns its address.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: A machine's whole list of NICs, converged with the rest of it.
  - module: machinery.compute.volume_attach
    description: Attach or detach one disk.
  - module: machinery.compute.machine_info
    description: A machine's NICs and their addresses.
attributes:
  check_mode:
    support: full
    description: Validates and computes the change; writes nothing.
  diff_mode:
    support: full
    description: The NIC before and after.
options:
  machine:
    description: Name of the machine.
    type: str
    required: true
  name:
    description: Name of the NIC within the machine.
    type: str
    required: true
  network:
    description: libvirt network.
    type: str
  bridge:
    description: Host bridge.
    type: str
  mac:
    description:
      - MAC address; left out, an attached NIC keeps its MAC and a new one gets a MAC derived from the machine
        and NIC names.
      - A given MAC that differs from the attached NIC's is refused; detach the NIC first.
    type: str
  model:
    description:
      - NIC model; left out, an attached NIC keeps its model and a new one gets V(virtio).
      - A given model that differs from the attached NIC's is refused; detach the NIC first.
    type: str
    choices: [virtio, e1000e, rtl8139]
  state:
    description: Whether the NIC is attached.
    type: str
    choices: [attached, detached]
    default: attached
  wait:
    description: Wait for the NIC's DHCP address (networks only).
    type: str
    choices: [none, address]
    default: none
  wait_timeout:
    description: Seconds to wait for the address.
    type: int
    default: 300
  timeout:
    description: Seconds to wait for the guest to release the NIC on detach.
    type: int
    default: 30
"""

EXAMPLES = r"""
- name: A second NIC on the storage network, with its address
  machinery.compute.nic_attach:
    uri: qemu+ssh://root@hv1/system
    machine: web-1
    name: eth1
    network: storage
    wait: address
  register: nic

- name: Its address
  ansible.builtin.debug:
    var: nic.network_interface.ip_addresses
"""

RETURN = r"""
network_interface:
  description: The NIC.
  returned: always
  type: dict
  contains:
    name:
      description: NIC name.
      type: str
      sample: eth1
    mac:
      description: MAC address.
      type: str
      sample: 52:54:00:ba:a7:f4
    network:
      description: Network or bridge.
      type: str
      sample: default
    ip_addresses:
      description: Addresses from the network's DHCP lease.
      type: list
      elements: str
      sample: ["192.168.122.87"]
    state:
      description: Pending, Attached (libvirt's live or persistent XML shows it) or Detached.
      type: str
      sample: Attached
machine:
  description:
    - The machine's status after the run, in the shape of RV(machinery.compute.machine#module:machine), documented
      key by key there (C(ansible-doc machinery.compute.machine)). Its C(network_interfaces) list the NIC.
  returned: always
  type: dict
  sample:
    name: web-1
    pool: hv1
    phase: Running
    ip_addresses: ["192.168.122.152", "192.168.122.87"]
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
      sample: eth1
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
      sample: {"name": "eth1", "network": "default", "mac": "52:54:00:ba:a7:f4", "model": "virtio", "ephemeral": true}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample: [{"action": "attach_device", "target": "ua-nic-eth1"}, {"action": "write_record", "target": "web-1"}]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.machines.attach import NicAttachment
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class NicAttachModule(MachineryModule):
    argument_spec = options.argument_spec(options.NIC_ATTACH)

    def run(self, ctx):
        return self.attachment_result(NicAttachment(ctx, self.params, self.check_mode).ensure(), "network_interface")


def main():
    NicAttachModule()()


if __name__ == "__main__":
    main()
