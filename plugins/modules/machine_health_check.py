#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_health_check
short_description: Find unhealthy machines across pools and remediate them (a MachineHealthCheck)
description:
  - OpenShift's MachineHealthCheck on libvirt pools. The check covers the machines of its pools whose labels
    match O(selector). A machine is unhealthy when one of O(unhealthy_conditions) has held for its timeout (the
    conditions are OR-ed), or when it has never been Ready O(node_startup_timeout) after its creation.
  - 'Conditions, from what libvirt shows: C(Ready) (the domain runs), C(VolumesReady) and
    C(NetworkInterfacesReady) (from the machine status), C(Failed) (crashed, or paused by an I/O error),
    C(AddressAssigned) (a machine with a NIC on a libvirt network has a DHCP lease), C(GuestAgentConnected) (the
    guest agent of a running machine has its channel open: the agent answers) and C(Booted) (the line
    O(boot_marker) is on the serial console since the machine last started), and C(BootstrapReady) of the
    machine status (vitistack''s: the guest agent answered).'
  - 'C(NodeReady) is the guest''s readiness, what a Kubernetes Node''s Ready means: V(True) when the machine runs
    and its guest agent answers, or - for a guest without an agent - when it has a DHCP lease on its libvirt
    network (or no NIC on one); V(False) when it does not run or runs with neither; V(Unknown) when an agent
    that answered before is silent. OpenShift MachineHealthCheck documents (machinery.compute.manifest) check
    their C(Ready) as C(NodeReady), and their O(node_startup_timeout) waits for it.'
  - Since when a condition holds is kept in the machine's record; every run records the conditions that changed,
    so a timeout counts from the first observation of the bad state, across runs. Run the check periodically
    (an AWX schedule, a cron job) for timeouts to elapse.
  - When more machines are unhealthy than O(max_unhealthy) allows, nothing is remediated and the return says
    C(remediation_allowed=false). Remediation V(delete) deletes the machine, so its set (see
    M(machinery.compute.machine_set)) makes a replacement on its next run; V(restart) power-cycles it in place.
  - With O(unreachable_timeout), the members of the sets the check covers that sit on a pool unreachable that
    long are unhealthy (C(PoolReachable=False)) and count against O(max_unhealthy); their remediation is their
    replacement, whatever O(remediation) says (their pool cannot be asked to do anything). The set's record says
    they are replaced, and the set's next run makes others and fences them when their pool is back.
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine_set
    description: The sets whose members a health check watches.
  - module: machinery.compute.machine_set_info
    description: List the sets and their members.
  - module: machinery.compute.machine_info
    description: The machines' conditions the check reads.
attributes:
  check_mode:
    support: full
    description: Reports which machines would be remediated and why; records nothing and changes nothing.
  diff_mode:
    support: full
    description: Each remediated machine's phase before and after.
options:
  name:
    description: Name of the check (a DNS-1123 label), shown in messages.
    type: str
    required: true
  selector:
    description: Which machines the check covers.
    type: dict
    required: true
    suboptions:
      match_labels:
        description: Labels a covered machine has (all of them).
        type: dict
        required: true
  unhealthy_conditions:
    description: Conditions that make a machine unhealthy once they have held for their timeout.
    type: list
    elements: dict
    suboptions:
      type:
        description: The condition.
        type: str
        required: true
        choices: [Ready, VolumesReady, NetworkInterfacesReady, Failed, AddressAssigned, Booted, GuestAgentConnected,
                  BootstrapReady, NodeReady]
      status:
        description:
          - The status that is unhealthy.
          - V(Unknown) is a status only C(NodeReady) takes, when a guest agent that answered before is silent
            (readiness can no longer be observed); a pool that does not answer is O(unreachable_timeout)'s.
        type: str
        required: true
        choices: ["True", "False", "Unknown"]
      timeout:
        description: How long it must hold, as V(90s), V(5m), V(1h30m) or seconds.
        type: str
        required: true
  node_startup_timeout:
    description: A machine that has not been Ready once this long after its creation is unhealthy (as V(90s),
      V(10m) or seconds); give a boot time's margin. V(0) disables the startup check.
    type: str
    default: 10m
  boot_marker:
    description:
      - A line the guest prints on its serial console once it has booted (for example what a systemd unit or
        cloud-init's C(final_message) writes to C(/dev/ttyS0)). Needed by the condition C(Booted).
      - The check reads the last 256 KiB of the console log of each running machine until the marker has been
        seen, then relies on the machine's record; the log starts afresh when the machine starts.
    type: str
  max_unhealthy:
    description: The most unhealthy machines that are remediated, a number or a percentage of the covered ones;
      with more, none is.
    type: raw
    default: 100%
  remediation:
    description: What happens to an unhealthy machine.
    type: str
    choices: [delete, restart]
    default: delete
  shutdown_timeout:
    description: Seconds of graceful ACPI shutdown before a remediated machine is forced off.
    type: int
    default: 10
  unreachable_timeout:
    description:
      - How long a member of a covered set may sit on an unreachable pool before it is unhealthy, as V(90s),
        V(5m) or a number of seconds, whole or not (V(3.5)). Counted from the first run (of the check or of the set) that found the pool
        unreachable, as recorded in the set's record on the reachable pools.
      - The sets must have O(machinery.compute.machine_set#module:unreachable_timeout) too, for their record to
        say where their members are. Without this option the check does not look at unreachable pools.
    type: str
"""

EXAMPLES = r"""
- name: Replace web machines that stopped running for two minutes
  machinery.compute.machine_health_check:
    name: web
    pools: "{{ fleet }}"
    selector:
      match_labels: {app: web}
    unhealthy_conditions:
      - {type: Ready, status: "False", timeout: 2m}
      - {type: Failed, status: "True", timeout: 0s}
    max_unhealthy: 40%
  register: health

- name: The set brings the count back
  machinery.compute.machine_set:
    name: web
    pools: "{{ fleet }}"
    replicas: 3
    selector: {match_labels: {app: web}}
    template: "{{ web_template }}"
"""

RETURN = r"""
unhealthy:
  description: Unhealthy machines with name, pool, uri, phase and reasons.
  returned: always
  type: list
  elements: dict
  sample:
    - name: workers-483bc
      pool: hv1
      uri: qemu+ssh://root@hv1/system
      phase: Shutdown
      reasons:
      - Ready=False for 312s (timeout 300s)
covered:
  description: How many machines the check covers.
  returned: always
  type: int
  sample: 3
max_unhealthy:
  description: O(max_unhealthy) as a number of machines.
  returned: always
  type: int
  sample: 1
remediation_allowed:
  description: False when more machines are unhealthy than O(max_unhealthy) allows (then none is remediated).
  returned: always
  type: bool
  sample: true
actions:
  description: The short form of each remediation (delete or restart), in order; C(replace) or C(record) for a
    set's record that gives up members on an unreachable pool or notes when a pool was first found unreachable.
  returned: always
  type: list
  elements: str
  sample: ["delete"]
pool_reachable:
  description: The condition C(PoolReachable) of each covered machine, with name and pool; C(since) when it is
    C(False). Members on unreachable pools are listed only with O(unreachable_timeout).
  returned: always
  type: list
  elements: dict
  sample:
    - name: workers-483bc
      pool: hv1
      condition:
        type: PoolReachable
        status: "True"
    - name: workers-1f2aa
      pool: hv3
      condition:
        type: PoolReachable
        status: "False"
        since: "2026-01-01T10:00:00+00:00"
plan:
  description: Each remediation with its target machine, phase before and after, and its reasons.
  returned: always
  type: list
  elements: dict
  sample:
    - action: delete
      target: workers-483bc
      before:
        phase: Shutdown
      after:
        phase: Terminated
      steps:
      - action: delete_machine
        target: workers-483bc
        pool: hv1
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import Fleet
from ansible_collections.machinery.compute.plugins.module_utils.fleets.health_check import HealthCheckResource
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class MachineHealthCheckModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_HEALTH_CHECK)

    def run_pools(self, entries):
        fleet = Fleet(entries, coordination=self.coordination)
        try:
            resource = HealthCheckResource(fleet, self.params, self.check_mode)
            plan, _observed = converge(resource, self.check_mode)
            unrecorded = resource.record_health()  # nothing in check mode: observe left nothing to record
            facts = resource.plan_facts
            result = self.converged(plan, unhealthy=facts["unhealthy"], covered=facts["covered"],
                                    max_unhealthy=facts["max_unhealthy"],
                                    remediation_allowed=facts["remediation_allowed"],
                                    pool_reachable=facts["pool_reachable"])
            result["warnings"] = list(result.get("warnings") or []) + unrecorded
            return result
        finally:
            fleet.close()


def main():
    MachineHealthCheckModule()()


if __name__ == "__main__":
    main()
