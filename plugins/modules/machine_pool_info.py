#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_pool_info
short_description: List machine pools with their capacity, allocation and the classes that still fit
description:
  - Read-only listing of the libvirt hosts registered as pools by M(machinery.compute.machine_pool), each in the
    shape of that module's C(pool) return.
  - The pools are read in parallel, one libvirt connection each.
  - A pool that cannot be reached is listed with RV(pools[].state=Offline) and the cause in RV(pools[].problems),
    and a warning; it does not fail the task.
  - A host that is reachable but not registered as a pool is left out, and so is a pool that a filter does not
    match; nothing to list gives an empty list, not a failure.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_pool
    description: Register, change or remove a pool.
  - module: machinery.compute.machine_class_info
    description: List the classes published on the pools.
  - module: machinery.compute.machine_info
    description: List the machines on the pools.
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  name:
    description: Only pools with these names (the registered name; for an offline pool the given name or URI).
    type: list
    elements: str
  labels:
    description: Only pools that carry all of these labels with these values. Offline pools have none to match.
    type: dict
"""

EXAMPLES = r"""
- name: Every pool of the fleet
  machinery.compute.machine_pool_info:
    pools:
      - qemu+ssh://root@hv1/system
      - {name: hv2, uri: qemu+ssh://root@hv2/system}
  register: fleet

- name: Pools that are not Ready
  ansible.builtin.debug:
    msg: "{{ item.name }}: {{ item.state }} {{ item.problems }}"
  loop: "{{ fleet.pools | rejectattr('state', 'eq', 'Ready') }}"

- name: Zone a pools, the URI from the group's module_defaults
  module_defaults:
    group/machinery.compute.machinery:
      uri: qemu+ssh://root@hv1/system
  machinery.compute.machine_pool_info:
    labels:
      zone: a
"""

RETURN = r"""
pools:
  description: The pools, in the order given, in the shape of M(machinery.compute.machine_pool)'s C(pool).
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Pool name.
      type: str
      sample: hv1
    uri:
      description: libvirt URI the pool was read through.
      type: str
      sample: qemu+ssh://root@hv1/system
    labels:
      description: Labels of the pool.
      type: dict
      sample: {"zone": "a"}
    taints:
      description: Taints of the pool (key, value, effect).
      type: list
      elements: dict
      sample: [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]
    overcommit:
      description: Overcommit ratios of the pool; null when it cannot be reached.
      type: dict
      sample: {"cpu": 4.0, "memory": 1.0, "storage": 1.0}
    reserved:
      description: What the pool keeps for its host, memory and storage as quantities; null when it cannot be reached.
      type: dict
      sample: {"cpu": 1, "memory": "2Gi", "storage": "0"}
    storage_path:
      description: Directory of the machines' volumes; null when it cannot be reached.
      type: str
      sample: /var/lib/libvirt/machinery
    networks:
      description: The pool's networks, by name; empty when it cannot be reached.
      type: list
      elements: str
      sample: [machinery]
    state:
      description: Ready; Error when its storage or a network is not active; Offline when it cannot be reached.
      type: str
      sample: Ready
    problems:
      description: What makes the pool Error or Offline; empty when it is Ready.
      type: list
      elements: str
      sample: []
    virt_type:
      description: kvm or qemu; null when Offline.
      type: str
      sample: kvm
    capacity:
      description: Host CPUs and memory (a quantity); null when Offline.
      type: dict
      sample: {"cpu": 8, "memory": "32Gi"}
    allocated:
      description: Sum of the sizes of the machines defined on the pool; null when Offline.
      type: dict
      sample: {"cpu": 4, "memory": "8Gi"}
    allocatable:
      description: Capacity less reservations, times overcommit; nothing when Offline.
      type: dict
      sample: {"cpu": 32, "memory": "60Gi"}
    storage:
      description:
        - The machines' storage as quantities - C(capacity) and C(available) of the storage pool, C(allocated)
          (the virtual size of every machine disk) and C(allocatable) (capacity less C(reserved.storage), times
          C(overcommit.storage)). Null when Offline.
      type: dict
      sample: {"capacity": "900Gi", "available": "812Gi", "allocated": "120Gi", "allocatable": "900Gi"}
    available_machine_classes:
      description: Published classes with how many of each the pool holds and how many more fit.
      type: list
      elements: dict
      contains:
        name:
          description: Class name.
          type: str
          sample: small
        cpu:
          description: Virtual CPUs of the class.
          type: int
          sample: 1
        memory:
          description: Memory of the class, a quantity.
          type: str
          sample: 512Mi
        capacity:
          description: How many machines of the class the pool holds when it runs nothing (its allocatable
            cpu and memory over the class's).
          type: int
          sample: 64
        allocatable:
          description: How many more machines of the class fit on the pool.
          type: int
          sample: 28
    machine_count:
      description: Number of machines defined on the pool; null when Offline.
      type: int
      sample: 4
    must_leave:
      description:
        - Names of the machines on the pool that tolerate none of its C(NoExecute) taints (by the tolerations in
          their records), in order; empty without such a taint. The C(drain) role moves exactly these.
      type: list
      elements: str
      sample: [web-1, web-2]
    hypervisor:
      description: Versions of libvirt and QEMU and the host name; null when Offline.
      type: dict
      sample: {"hostname": "hv1", "libvirt": "9.0.0", "qemu": "7.2.22"}
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import read_snapshots
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


def offline_status(snapshot):
    """An unreachable pool in the shape of a pool status: what could not be read is null, and it offers nothing."""
    return {"name": snapshot["name"], "uri": snapshot["uri"], "labels": {}, "taints": [], "state": "Offline",
            "problems": [snapshot["problem"]], "virt_type": None, "capacity": None, "allocated": None,
            "allocatable": {"cpu": 0, "memory": "0"}, "storage": None, "available_machine_classes": [],
            "machine_count": None, "must_leave": [], "overcommit": None, "reserved": None, "storage_path": None,
            "networks": [], "hypervisor": None}


def selected(status, names, labels):
    if names and status["name"] not in names:
        return False
    return all(status["labels"].get(key) == value for key, value in labels.items())


class MachinePoolInfoModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_POOL_INFO)

    def run_pools(self, entries):
        statuses, warnings = [], []
        for snapshot in read_snapshots(entries):
            if snapshot["state"] == "Offline":
                warnings.append("pool %s is offline: %s" % (snapshot["name"], snapshot["problem"]))
                statuses.append(offline_status(snapshot))
            elif "status" in snapshot:
                statuses.append(snapshot["status"])
            # else: a host that machine_pool never registered is no pool
        wanted = check.labels(self.params["labels"], "labels")
        pools = [status for status in statuses if selected(status, self.params["name"], wanted)]
        return {"changed": False, "pools": pools, "warnings": warnings}


def main():
    MachinePoolInfoModule()()


if __name__ == "__main__":
    main()
