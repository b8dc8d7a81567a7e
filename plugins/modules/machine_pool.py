#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_pool
short_description: Register a libvirt host as a machine pool
description:
  - Prepares one libvirt host as a pool of machines and records its registration on the host itself.
  - Ensures a C(dir) storage pool C(machinery) at O(storage_path) for disks, seed ISOs and Ignition files, a
    registry storage pool beside it for the registration and the published classes, and the O(networks).
  - Everything goes through the libvirt connection, so any URI works; nothing is copied over SSH.
  - With O(virt_type=auto) the module starts a tiny transient KVM guest once and keeps C(kvm) only if that
    guest really runs; a C(/dev/kvm) that exists but fails guests gives C(qemu) (TCG).
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.action_group
attributes:
  check_mode:
    support: full
    description: Computes the same change and writes nothing (the KVM probe is skipped).
  diff_mode:
    support: full
    description: Shows the registration before and after.
options:
  name:
    description: Name of the pool, a DNS-1123 label.
    type: str
    required: true
  state:
    description:
      - V(absent) removes the registration and the published classes; it refuses while machines exist unless
        O(force=true). Storage pools, networks and volumes are kept.
    type: str
    choices: [present, absent]
    default: present
  labels:
    description: Labels that machine pool selectors match.
    type: dict
  taints:
    description: Taints that machines must tolerate to be scheduled here.
    type: list
    elements: dict
    suboptions:
      key:
        description: Taint key.
        type: str
        required: true
      value:
        description: Taint value.
        type: str
      effect:
        description: Taint effect.
        type: str
        choices: [NoSchedule, NoExecute]
        default: NoSchedule
  overcommit:
    description: Overcommit ratios applied to the host capacity left after O(reserved).
    type: dict
    suboptions:
      cpu:
        description: CPU overcommit ratio.
        type: float
        default: 1.0
      memory:
        description: Memory overcommit ratio.
        type: float
        default: 1.0
  reserved:
    description: Host resources kept for the host itself.
    type: dict
    suboptions:
      cpu:
        description: CPUs kept for the host.
        type: int
        default: 0
      memory:
        description: Memory kept for the host, a quantity such as V(2Gi).
        type: raw
  storage_path:
    description: Directory on the pool host for the machines' volumes.
    type: str
    default: /var/lib/libvirt/machinery
  networks:
    description:
      - Networks machines on this pool may use; the first one is the default for machines that list no NIC.
      - A network with O(networks[].cidr) is created (NAT or isolated, with DHCP) when it does not exist.
    type: list
    elements: dict
    suboptions:
      name:
        description: Network name.
        type: str
        required: true
      cidr:
        description: IPv4 subnet, for example V(192.168.100.0/24).
        type: str
      mode:
        description: Forwarding mode for a network that is created.
        type: str
        choices: [nat, isolated]
        default: nat
  virt_type:
    description: Hypervisor type for machines on this pool; V(auto) measures it once and remembers it.
    type: str
    choices: [auto, kvm, qemu]
    default: auto
  force:
    description: Allow O(state=absent) while machines exist.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Register a hypervisor as pool hv1
  machinery.compute.machine_pool:
    uri: qemu+ssh://root@hv1/system
    name: hv1
    labels:
      zone: a
    reserved:
      cpu: 1
      memory: 2Gi
    networks:
      - name: machinery
        cidr: 192.168.100.0/24
"""

RETURN = r"""
pool:
  description: Status of the pool after the run; null when absent or in check mode before registration.
  returned: always
  type: dict
  contains:
    name:
      description: Pool name.
      type: str
    state:
      description: Ready, or Error when its storage or a network is not active.
      type: str
    virt_type:
      description: kvm or qemu.
      type: str
    capacity:
      description: Host CPUs and memory.
      type: dict
    allocated:
      description: Sum of the sizes of the machines defined on the pool.
      type: dict
    allocatable:
      description: Capacity less reservations, times overcommit.
      type: dict
    available_machine_classes:
      description: Published classes with how many more of each fit.
      type: list
      elements: dict
    machine_count:
      description: Number of machines defined on the pool.
      type: int
"""

from ansible_collections.machinery.compute.plugins.module_utils.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.pools import ensure_pool


class MachinePoolModule(MachineryModule):
    argument_spec = dict(
        name=dict(type="str", required=True),
        state=dict(type="str", choices=["present", "absent"], default="present"),
        labels=dict(type="dict"),
        taints=dict(type="list", elements="dict", options=dict(
            key=dict(type="str", required=True, no_log=False),
            value=dict(type="str"),
            effect=dict(type="str", choices=["NoSchedule", "NoExecute"], default="NoSchedule"),
        )),
        overcommit=dict(type="dict", options=dict(cpu=dict(type="float", default=1.0),
                                                  memory=dict(type="float", default=1.0))),
        reserved=dict(type="dict", options=dict(cpu=dict(type="int", default=0), memory=dict(type="raw"))),
        storage_path=dict(type="str", default="/var/lib/libvirt/machinery"),
        networks=dict(type="list", elements="dict", options=dict(
            name=dict(type="str", required=True),
            cidr=dict(type="str"),
            mode=dict(type="str", choices=["nat", "isolated"], default="nat"),
        )),
        virt_type=dict(type="str", choices=["auto", "kvm", "qemu"], default="auto"),
        force=dict(type="bool", default=False),
    )

    def run(self, ctx):
        changed, before, after, status = ensure_pool(ctx, self.params, self.check_mode)
        return {"changed": changed, "pool": status, "diff": self.diff(before, after)}


def main():
    MachinePoolModule()()


if __name__ == "__main__":
    main()
