#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_class
short_description: Publish a machine class (a named size) on a pool
description:
  - A machine class is a named size, O(cpu) and O(memory), that machines on the pool refer to by name.
  - The class is stored on the pool host itself, in the pool's registry, through the libvirt connection alone.
  - Deleting a class that machines on the pool still use fails unless O(force=true).
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_class_info
    description: List the classes published on pools.
  - module: machinery.compute.machine_pool
    description: Register the pools classes are published on.
  - module: machinery.compute.machine
    description: Machines sized by a class.
attributes:
  check_mode:
    support: full
    description: Computes the same change and writes nothing.
  diff_mode:
    support: full
    description: Shows the class before and after.
options:
  name:
    description:
      - Name of the class, a Kubernetes object name, that is a DNS-1123 subdomain of at most 253 characters (lower
        case letters, digits, C(-) and C(.)), so a cloud instance type such as C(t3.medium) is a class name as
        written.
    type: str
    required: true
  cpu:
    description:
      - CPUs, 1 to 256. A whole number (V(2), also V(2000m)) is that many virtual CPUs; a fraction in
        millicores or as a decimal (V(500m), V(0.5), V(1.5), at least V(10m)) is the vCPUs it rounds up to, held
        to that fraction by a CFS quota, and counted by the pool's capacity as that fraction.
      - Required to publish a new class; left out, a published class keeps its number.
    type: raw
  memory:
    description:
      - Memory as a Kubernetes quantity (V(512Mi), V(16Gi), V(1.5G)) or a number of bytes. At least 16Mi.
      - Required to publish a new class; left out, a published class keeps its memory.
    type: raw
  state:
    description: Whether the class is published on the pool.
    type: str
    choices: [present, absent]
    default: present
  force:
    description: Delete the class even when machines on the pool still use it (they keep their size).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Publish a small class on a pool
  machinery.compute.machine_class:
    uri: qemu+ssh://root@hv1/system
    name: small
    cpu: 1
    memory: 512Mi

- name: Withdraw it
  machinery.compute.machine_class:
    uri: qemu+ssh://root@hv1/system
    name: small
    state: absent
"""

RETURN = r"""
machine_class:
  description: The class as published after the run; null when absent.
  returned: always
  type: dict
  sample: {"name": "small", "cpu": 1, "memory": "512Mi"}
actions:
  description: The short form of each planned action, in order, for example C(create), C(start), C(update cpu, memory).
  returned: always
  type: list
  elements: str
  sample: ["publish"]
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
      sample: publish
    target:
      description: What it acts on (a machine, volume, NIC, storage pool, network or document name).
      type: str
      sample: small
    fields:
      description: For C(update), the owned fields it changes.
      type: list
      elements: str
      sample: ["memory"]
    before:
      description: The owned fields before the action, where it changes some.
      type: dict
      sample: {"cpu": 1, "memory": "256Mi", "name": "small"}
    after:
      description: The owned fields after the action, where it changes some.
      type: dict
      sample: {"cpu": 1, "memory": "512Mi", "name": "small"}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample: [{"action": "write_document", "target": "class-small"}]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.pools.classes import ensure_class
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineClassModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE_CLASS)

    def run(self, ctx):
        plan, published = ensure_class(ctx, self.params, self.check_mode)
        return self.converged(plan, machine_class=published)


def main():
    MachineClassModule()()


if __name__ == "__main__":
    main()
