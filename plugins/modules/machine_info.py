#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_info
short_description: List the machines of a pool
description:
  - Read-only listing of the machines this collection created on a pool, in the same shape as the
    M(machinery.compute.machine) return, plus a C(kubectl get machines -o wide) style table.
  - A filter that matches nothing gives an empty list, not a failure.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: Create, change or delete one machine.
  - module: machinery.compute.machine_pool_info
    description: List the pools.
  - module: machinery.compute.machine_set_info
    description: List the machine sets.
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  name:
    description: Only machines with these names.
    type: list
    elements: str
  labels:
    description:
      - Only machines that carry all of these labels with these values.
      - Values are strings, as labels are (quote V("true") or V("1")); any other value is refused.
    type: dict
  phase:
    description: Only machines in one of these phases.
    type: list
    elements: str
    choices: [Pending, Running, Shutdown, Terminating, Failed]
  include_unmanaged:
    description: Also list domains this collection did not create.
    type: bool
    default: false
  console_lines:
    description:
      - Return the last this many lines of each machine's serial console log as RV(machines[].console).
      - The log is read through the libvirt connection, so this works over any URI. V(0) reads nothing.
      - At most V(10000); a negative number is refused.
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Running machines of app web
  machinery.compute.machine_info:
    uri: qemu+ssh://root@hv1/system
    labels:
      app: web
    phase: [Running]
  register: web

- name: Show the table
  ansible.builtin.debug:
    var: web.table
"""

RETURN = r"""
machines:
  description:
    - Each machine's status, sorted by name, in the shape of RV(machinery.compute.machine#module:machine). Every key
      of it (phase, conditions, network interfaces, volumes, guest facts and the rest) is documented there, once
      for all the modules, in C(ansible-doc machinery.compute.machine).
  returned: always
  type: list
  elements: dict
  sample:
    - name: web-1
      pool: hv1
      uri: qemu+ssh://root@hv1/system
      phase: Running
      ip_addresses: ["192.168.122.152"]
      age: 1m
  contains:
    console:
      description: The last O(console_lines) lines of the serial console log.
      returned: when O(console_lines) is above 0
      type: list
      elements: str
      sample: ["MACHINERY-READY", "MACHINERY-BLOCK-ADDED vdc 65536"]
table:
  description: Lines NAME POOL CLASS PHASE RESTARTS AGE IPS.
  returned: always
  type: list
  elements: str
  sample:
    - NAME    POOL   CLASS   PHASE     RESTARTS   AGE   IPS
    - web-1   hv1    small   Running   0          1m    192.168.122.152
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import console_tail, list_machines, table
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


def selected(machine, names, labels, phases):
    if names and machine["name"] not in names:
        return False
    if phases and machine["phase"] not in phases:
        return False
    return all(machine["labels"].get(key) == value for key, value in labels.items())


MAX_CONSOLE_LINES = 10000


class MachineInfoModule(MachineryModule):
    argument_spec = options.argument_spec(options.MACHINE_INFO)

    def run(self, ctx):
        lines = check.whole_number(self.params["console_lines"], "console_lines", 0, MAX_CONSOLE_LINES)
        # compared with labels as machines keep them: strings (a YAML true or 1 would silently never match)
        labels = check.labels(self.params["labels"], "labels")
        machines = [machine for machine in list_machines(ctx, self.params["include_unmanaged"])
                    if selected(machine, self.params["name"], labels, self.params["phase"])]
        if lines > 0 and machines:
            tails = console_tail(ctx, [machine["name"] for machine in machines], lines)
            for machine in machines:
                machine["console"] = tails[machine["name"]]
        return {"changed": False, "machines": machines, "table": table(machines)}


def main():
    MachineInfoModule()()


if __name__ == "__main__":
    main()
