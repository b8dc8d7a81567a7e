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
  - An option left out keeps the pool's registered value (the return shows it); an option given sets exactly
    what it says, so O(labels={}) or O(taints=[]) clear them. The same holds for each sub-option of
    O(overcommit) and O(reserved). A first registration gets the values described for each option.
  - With O(virt_type=auto) the module starts a tiny transient KVM guest once and keeps C(kvm) only if that
    guest really runs; a C(/dev/kvm) that exists but fails guests gives C(qemu) (TCG).
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_pool_info
    description: List pools with their capacity and state.
  - module: machinery.compute.machine_class
    description: Publish classes on a pool.
  - module: machinery.compute.machine
    description: Machines on a pool.
attributes:
  check_mode:
    support: full
    description: Computes the same change and writes nothing (the KVM probe is skipped).
  diff_mode:
    support: full
    description: Shows the registration before and after.
options:
  name:
    description:
      - Name of the pool, a DNS-1123 label.
      - A host registered under another name can be renamed only while it holds no machines.
    type: str
    required: true
  state:
    description:
      - V(absent) removes the registration, the published classes and the registry storage pool that held them;
        it refuses while machines exist unless O(force=true). The machines' storage pool, its volumes (image
        caches included) and the networks are kept.
    type: str
    choices: [present, absent]
    default: present
  labels:
    description:
      - Labels that machine pool selectors match; they replace the registered labels as a whole.
      - Left out, the registered labels are kept (none for a new pool); V({}) removes them all.
      - Keys and values follow the Kubernetes label rules; values must be strings (quote V("true") or V("1")).
    type: dict
  taints:
    description:
      - Taints that machines must tolerate to be scheduled here; they replace the registered taints as a whole.
      - Left out, the registered taints are kept (none for a new pool); V([]) removes them all.
    type: list
    elements: dict
    suboptions:
      key:
        description: Taint key, by the rules of a label key; one taint per key and effect.
        type: str
        required: true
      value:
        description: Taint value, a string by the rules of a label value (quote values such as V("true") in YAML,
          or it is refused rather than turned into C(True)).
        type: raw
      effect:
        description: Taint effect.
        type: str
        choices: [NoSchedule, NoExecute]
        default: NoSchedule
  overcommit:
    description:
      - Overcommit ratios applied to the host capacity left after O(reserved).
      - A ratio left out (or the whole option) keeps the registered ratio; a new pool gets V(1.0).
    type: dict
    suboptions:
      cpu:
        description: CPU overcommit ratio; left out, the registered one (V(1.0) for a new pool).
        type: float
      memory:
        description: Memory overcommit ratio; left out, the registered one (V(1.0) for a new pool).
        type: float
      storage:
        description:
          - Storage overcommit ratio. Thin disks (qcow2 overlays, empty qcow2 volumes) count their virtual size
            against the storage pool's capacity times this ratio, so 1.0 never promises more than the disk has.
          - Left out, the registered one (V(1.0) for a new pool).
        type: float
  reserved:
    description:
      - Host resources kept for the host itself.
      - A sub-option left out (or the whole option) keeps the registered value; a new pool reserves nothing.
    type: dict
    suboptions:
      cpu:
        description: CPUs kept for the host; left out, the registered number (V(0) for a new pool).
        type: int
      memory:
        description:
          - Memory kept for the host, a quantity such as V(2Gi).
          - Left out, the registered amount (none for a new pool).
        type: raw
      storage:
        description:
          - Storage kept free on the pool's storage path, a quantity such as V(20Gi).
          - Left out, the registered amount (none for a new pool).
        type: raw
  storage_path:
    description:
      - Directory on the pool host for the machines' volumes.
      - Left out, the registered directory; C(/var/lib/libvirt/machinery) for a new pool.
    type: str
  networks:
    description:
      - Networks machines on this pool may use; the first one is the default for machines that list no NIC.
      - A network with O(networks[].cidr) is created (NAT or isolated, with DHCP) when it does not exist.
      - The list replaces the registered networks as a whole; left out, the registered networks are kept (none
        for a new pool).
    type: list
    elements: dict
    suboptions:
      name:
        description: Network name.
        type: str
        required: true
      cidr:
        description:
          - IPv4 subnet, for example V(192.168.100.0/24), at least a V(/28).
          - It must not overlap the loopback, link-local, multicast, V(0.0.0.0/8) or V(240.0.0.0/4) ranges, the
            other O(networks), or a network the host has already; that is checked before anything is created.
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
  prune_images:
    description:
      - Delete the image caches of the pool (C(image-<sha256>.*) in its storage) that no machine's disk is
        backed by any more. Each is checked again right before it goes.
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
      sample: hv1
    uri:
      description: The libvirt URI the pool was reached by.
      type: str
      sample: qemu+ssh://root@hv1/system
    labels:
      description: The registered labels.
      type: dict
      sample: {"zone": "a"}
    taints:
      description: The registered taints.
      type: list
      elements: dict
      sample: [{"key": "maintenance", "value": "", "effect": "NoSchedule"}]
    overcommit:
      description: The registered overcommit ratios.
      type: dict
      sample: {"cpu": 4.0, "memory": 1.0, "storage": 1.0}
    reserved:
      description: The registered reservations, memory and storage as quantities.
      type: dict
      sample: {"cpu": 1, "memory": "2Gi", "storage": "0"}
    storage_path:
      description: The registered directory of the machines' volumes.
      type: str
      sample: /var/lib/libvirt/machinery
    networks:
      description: The registered networks, by name.
      type: list
      elements: str
      sample: [machinery]
    state:
      description: Ready, or Error when its storage or a network is not active.
      type: str
      sample: Ready
    virt_type:
      description: kvm or qemu.
      type: str
      sample: kvm
    capacity:
      description: Host CPUs and memory.
      type: dict
      sample: {"cpu": 16, "memory": "64Gi"}
    allocated:
      description: Sum of the sizes of the machines defined on the pool.
      type: dict
      sample: {"cpu": 4, "memory": "8Gi"}
    allocatable:
      description: Capacity less reservations, times overcommit.
      type: dict
      sample: {"cpu": 32, "memory": "60Gi"}
    storage:
      description:
        - The machines' storage as quantities - C(capacity) and C(available) of the storage pool, C(allocated)
          (the virtual size of every machine disk) and C(allocatable) (capacity less C(reserved.storage), times
          C(overcommit.storage)).
      type: dict
      sample: {"capacity": "900Gi", "available": "812Gi", "allocated": "120Gi", "allocatable": "900Gi"}
    available_machine_classes:
      description: Published classes with how many of each the pool holds (C(capacity)) and how many more fit
        (C(allocatable)).
      type: list
      elements: dict
      sample: [{"name": "small", "cpu": 1, "memory": "512Mi", "capacity": 64, "allocatable": 28}]
    machine_count:
      description: Number of machines defined on the pool.
      type: int
      sample: 4
    must_leave:
      description:
        - Names of the machines on the pool that tolerate none of its C(NoExecute) taints (by the tolerations in
          their records), in order; empty without such a taint. The C(drain) role moves exactly these.
      type: list
      elements: str
      sample: [web-1, web-2]
actions:
  description: The short form of each planned action, in order, for example C(create), C(start), C(update cpu, memory).
  returned: always
  type: list
  elements: str
  sample: ["register"]
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
      sample: register
    target:
      description: What it acts on (a machine, volume, NIC, storage pool, network or document name).
      type: str
      sample: hv1
    fields:
      description: For C(update), the owned fields it changes.
      type: list
      elements: str
      sample: ["labels"]
    before:
      description: The owned fields before the action, where it changes some.
      type: dict
      sample: {"labels": {"zone": "a"}}
    after:
      description: The owned fields after the action, where it changes some.
      type: dict
      sample: {"labels": {"zone": "b"}}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample: [{"action": "write_document", "target": "pool"}]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.pools.pool_registration import ensure_pool


class MachinePoolModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE_POOL)

    def run(self, ctx):
        plan, status = ensure_pool(ctx, self.params, self.check_mode)
        return self.converged(plan, pool=status)


def main():
    MachinePoolModule()()


if __name__ == "__main__":
    main()
