#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_class_info
short_description: List the machine classes published on pools and how many more of each fit
description:
  - Read-only listing of the classes M(machinery.compute.machine_class) published, one entry per class and pool,
    with how many more machines of the class fit on that pool now.
  - The pools are read in parallel, one libvirt connection each.
  - A pool that cannot be reached contributes nothing and gives a warning, not a failure; a host that is not
    registered as a pool contributes nothing. Nothing to list gives an empty list.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_class
    description: Publish or delete a class.
  - module: machinery.compute.machine_pool_info
    description: The pools, with the classes available on each.
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  name:
    description: Only classes with these names.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Where does another large machine fit
  machinery.compute.machine_class_info:
    pools:
      - qemu+ssh://root@hv1/system
      - qemu+ssh://root@hv2/system
    name: [large]
  register: large

- name: Pools with room for one more
  ansible.builtin.debug:
    msg: "{{ large.machine_classes | selectattr('allocatable', 'gt', 0) | map(attribute='pool') }}"

- name: The classes of the pool the group's module_defaults name
  module_defaults:
    group/machinery.compute.machinery:
      uri: qemu+ssh://root@hv1/system
  machinery.compute.machine_class_info: {}
"""

RETURN = r"""
machine_classes:
  description: The classes, by pool in the order given, then by name.
  returned: always
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
    pool:
      description: Name of the pool that publishes it.
      type: str
      sample: hv1
    uri:
      description: libvirt URI of that pool.
      type: str
      sample: qemu+ssh://root@hv1/system
    allocatable:
      description: How many more machines of the class fit on that pool, after overcommit and reservations.
      type: int
      sample: 3
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import read_snapshots
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineClassInfoModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_CLASS_INFO)

    def run_pools(self, entries):
        names = self.params["name"]
        classes, warnings = [], []
        for snapshot in read_snapshots(entries):
            if snapshot["state"] == "Offline":
                warnings.append("pool %s is offline: %s" % (snapshot["name"], snapshot["problem"]))
                continue
            status = snapshot.get("status")  # none when machine_pool never registered the host
            for published in (status or {}).get("available_machine_classes", []):
                if not names or published["name"] in names:
                    classes.append({"name": published["name"], "cpu": published["cpu"],
                                    "memory": published["memory"], "pool": status["name"], "uri": status["uri"],
                                    "allocatable": published["allocatable"]})
        return {"changed": False, "machine_classes": classes, "warnings": warnings}


def main():
    MachineClassInfoModule()()


if __name__ == "__main__":
    main()
