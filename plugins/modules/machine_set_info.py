#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_set_info
short_description: The machine sets recorded on pools, with their members
description:
  - Reads the set definitions that M(machinery.compute.machine_set) recorded in the pools' registries and
    counts their members, without the playbook that made them.
  - Returns an empty list when no set matches. Never changes anything.
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_set
    description: Create, scale, roll out or delete a set.
  - module: machinery.compute.machine_health_check
    description: Remediate a set's unhealthy members.
  - module: machinery.compute.machine_info
    description: List machines, members or not.
attributes:
  check_mode:
    support: full
    description: The same read as without check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
options:
  name:
    description: Only these sets.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Every set of the fleet
  machinery.compute.machine_set_info:
    pools: "{{ fleet }}"
  register: sets
"""

RETURN = r"""
machine_sets:
  description:
    - Each set with name, replicas (members now), desired_replicas, ready_replicas, available_replicas, selector,
      template (its secrets shown as C(<secret>)), template_hash, delete_policy, strategy, rollout, the pools
      that record it, members and out_of_date.
    - What the set's record keeps besides, when it has it - C(members_made) (how many member names the set has
      handed out), C(created) (when the set was first recorded), C(topology_spread), and with
      C(unreachable_timeout) the pools found unreachable (C(unreachable), since when), the members replaced
      because of them (C(replaced)) and the record's C(revision); see the machine_set module and the lost-pool
      guide.
  returned: always
  type: list
  elements: dict
  sample:
    - name: workers
      replicas: 2
      desired_replicas: 2
      ready_replicas: 2
      available_replicas: 2
      selector:
        match_labels:
          app: workers
      template:
        machine_class: small
        image: /srv/images/fedora-coreos.qcow2
        labels:
          app: workers
      template_hash: d813bc9d0c
      delete_policy: Random
      strategy: spread
      rollout: null
      pools:
      - hv1
      - hv2
      members:
      - workers-483bc
      - workers-910e8
      out_of_date: []
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets.machine_set import list_sets
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineSetInfoModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_SET_INFO)

    def run_pools(self, entries):
        fleet = Fleet(entries)
        try:
            return {"changed": False, "machine_sets": list_sets(fleet, self.params["name"])}
        finally:
            fleet.close()


def main():
    MachineSetInfoModule()()


if __name__ == "__main__":
    main()
