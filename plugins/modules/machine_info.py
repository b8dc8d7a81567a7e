#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_info
short_description: List the machines of one pool or of many
description:
  - Read-only listing of the machines this collection created on a pool, or on every pool of O(pools) read in
    parallel, in the same shape as the M(machinery.compute.machine) return, plus one C(kubectl get machines -o wide)
    style table for all of them.
  - A filter that matches nothing gives an empty list, not a failure.
  - With O(pools), a pool that cannot be read is left out with a warning naming it, and the others are listed;
    with O(uri) alone, a pool that cannot be read fails the task naming it.
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
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

- name: One table of every pool's machines
  machinery.compute.machine_info:
    pools:
      - {name: hv1, uri: qemu+ssh://root@hv1/system}
      - {name: hv2, uri: qemu+ssh://root@hv2/system}
  register: fleet
"""

RETURN = r"""
machines:
  description:
    - Each machine's status, sorted by name (and by pool for one name on two pools), in the shape of RV(machinery.compute.machine#module:machine). Every key
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
  description: Lines NAME POOL CLASS PHASE RESTARTS AGE IPS, one table for every pool read.
  returned: always
  type: list
  elements: str
  sample:
    - NAME    POOL   CLASS   PHASE     RESTARTS   AGE   IPS
    - web-1   hv1    small   Running   0          1m    192.168.122.152
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ConnectionFailed
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import read_each
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
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_INFO)

    def run_pools(self, entries):
        lines = check.whole_number(self.params["console_lines"], "console_lines", 0, MAX_CONSOLE_LINES)
        labels = check.labels(self.params["labels"], "labels")
        warnings = []

        def read(ctx, _entry):
            machines = [machine for machine in list_machines(ctx, self.params["include_unmanaged"], keep=False)
                        if selected(machine, self.params["name"], labels, self.params["phase"])]
            if lines > 0 and machines:
                tails = console_tail(ctx, [machine["name"] for machine in machines], lines)
                for machine in machines:
                    machine["console"] = tails[machine["name"]]
            return machines

        def offline(entry, cause):
            if self.params["pools"] is None:  # the one pool asked for: nothing to list is a failure
                raise ConnectionFailed("cannot read the machines of %s: %s" % (entry["uri"], cause), "uri")
            warnings.append("pool %s was not read, so its machines are not listed: %s"
                            % (entry.get("name") or entry["uri"], cause))
            return []
        machines = [machine for listed in read_each(entries, read, offline) for machine in listed]
        machines.sort(key=lambda machine: (machine["name"], machine.get("pool") or "", machine.get("uri") or ""))
        return {"changed": False, "machines": machines, "table": table(machines), "warnings": warnings}


def main():
    MachineInfoModule()()


if __name__ == "__main__":
    main()
