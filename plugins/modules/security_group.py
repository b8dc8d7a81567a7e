#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: security_group
short_description: A security group (allow rules for network interfaces) on a pool, as a libvirt nwfilter
description:
  - A security group is a named list of allow rules. NICs of machines on the same pool use it through the
    O(machinery.compute.machine#module:network_interfaces[].security_groups) option of M(machinery.compute.machine).
  - It is stored as the libvirt nwfilter C(machinery-sg-<name>) on the pool, every rule marked as the collection's;
    an nwfilter of that name without the marker is never changed or deleted.
  - Semantics, as cloud security groups have them. Once a NIC has a group, inbound traffic that none of the NIC's
    groups allows is dropped (DHCP replies pass). A group without egress rules allows all egress; a group with
    egress rules allows only those; the groups of a NIC add up. Rules are stateful, the replies of an allowed
    connection pass both ways.
  - Changing the rules takes effect at once on running machines (libvirt re-applies the filter).
  - Deleting a group that NICs use fails unless O(force=true), which takes it off those NICs first (they keep
    their other groups, and the default deny).
  - Rules are IPv4; IPv6 traffic to a NIC with groups is dropped, IPv6 egress follows the egress rule above.
version_added: 0.2.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.machine
    description: Put groups on a machine's NICs with its C(network_interfaces[].security_groups) option.
  - module: machinery.compute.nic_attach
    description: Attach a NIC, with its security groups, to an existing machine.
  - module: machinery.compute.machine_info
    description: See the machines and NICs a group guards.
attributes:
  check_mode:
    support: full
    description: Computes the same change and writes nothing.
  diff_mode:
    support: full
    description: Shows the rules before and after.
options:
  name:
    description: Name of the group, a DNS-1123 label.
    type: str
    required: true
  rules:
    description:
      - The allow rules. Their order does not matter; duplicates count once.
      - Omitted or V([]) with O(state=present) makes a group that allows no inbound traffic and all egress.
    type: list
    elements: dict
    suboptions:
      direction:
        description: V(ingress) (traffic to the machine) or V(egress) (traffic from it).
        type: str
        choices: [ingress, egress]
        default: ingress
      protocol:
        description: The IP protocol; V(all) is any of them.
        type: str
        choices: [tcp, udp, icmp, all]
        default: tcp
      port:
        description:
          - Destination port (the machine's for ingress, the peer's for egress), 1 to 65535; or the first port
            of a range ending at O(rules[].port_end). Only with V(tcp) and V(udp); omitted means every port.
        type: int
      port_end:
        description: Last port of the range that starts at O(rules[].port) (inclusive).
        type: int
      remote_cidr:
        description: The peer's IPv4 network in CIDR notation (V(10.0.0.0/8), V(192.168.1.5/32)).
        type: str
        default: 0.0.0.0/0
  state:
    description: Whether the group exists on the pool.
    type: str
    choices: [present, absent]
    default: present
  force:
    description: With O(state=absent), take the group off the NICs that use it and delete it.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Web servers take HTTP and HTTPS from anywhere, SSH from the admin network
  machinery.compute.security_group:
    uri: qemu+ssh://root@hv1/system
    name: web
    rules:
      - {protocol: tcp, port: 80}
      - {protocol: tcp, port: 443}
      - {protocol: tcp, port: 22, remote_cidr: 10.20.0.0/16}
      - {protocol: icmp}

- name: A NIC guarded by it
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    machine_class: small
    image: /var/lib/images/debian-12.qcow2
    network_interfaces:
      - {name: eth0, network: default, security_groups: [web]}

- name: Egress limited to DNS and a port range
  machinery.compute.security_group:
    uri: qemu+ssh://root@hv1/system
    name: locked-down
    rules:
      - {direction: egress, protocol: udp, port: 53}
      - {direction: egress, protocol: tcp, port: 8000, port_end: 8099, remote_cidr: 10.0.0.0/8}

- name: Delete the group
  machinery.compute.security_group:
    uri: qemu+ssh://root@hv1/system
    name: web
    state: absent
"""

RETURN = r"""
security_group:
  description: The group after the run (in check mode, as the run would leave it); null when absent.
  returned: always
  type: dict
  contains:
    name:
      description: The group's name.
      type: str
      sample: web
    filter:
      description: The libvirt nwfilter that holds it.
      type: str
      sample: machinery-sg-web
    rules:
      description: The rules, normalized (every key present, in a canonical order).
      type: list
      elements: dict
      sample:
        - {"direction": "ingress", "protocol": "tcp", "port": 80, "port_end": null, "remote_cidr": "0.0.0.0/0"}
        - {"direction": "ingress", "protocol": "tcp", "port": 8000, "port_end": 8080, "remote_cidr": "10.0.0.0/8"}
    network_interfaces:
      description: The NICs it guards, as C(machine/nic).
      type: list
      elements: str
      sample: ["web-1/eth0", "web-2/eth0"]
  sample:
    name: web
    filter: machinery-sg-web
    rules: [{direction: ingress, protocol: tcp, port: 80, port_end: null, remote_cidr: 0.0.0.0/0}]
    network_interfaces: [web-1/eth0]
actions:
  description: The short form of each planned action, in order (C(create), C(update rules), C(delete)).
  returned: always
  type: list
  elements: str
  sample: ["update rules"]
plan:
  description:
    - The actions of the run (or, in check mode, of the run it would make), in order, each with what it changes.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action.
      type: str
      sample: update
    target:
      description: The group.
      type: str
      sample: web
    fields:
      description: For C(update), the fields it changes.
      type: list
      elements: str
      sample: ["rules"]
    before:
      description: The group before the action.
      type: dict
      sample:
        rules:
          - {"direction": "ingress", "protocol": "tcp", "port": 80, "port_end": null, "remote_cidr": "0.0.0.0/0"}
    after:
      description: The group after the action.
      type: dict
      sample:
        rules:
          - {"direction": "ingress", "protocol": "tcp", "port": 80, "port_end": null, "remote_cidr": "0.0.0.0/0"}
          - {"direction": "ingress", "protocol": "tcp", "port": 443, "port_end": null, "remote_cidr": "0.0.0.0/0"}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample: [{"action": "define_nwfilter", "target": "machinery-sg-web"}]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import converge
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.pools.security_groups import SecurityGroupResource


class SecurityGroupModule(MachineryModule):
    argument_spec = options.argument_spec(options.SECURITY_GROUP)

    def run(self, ctx):
        plan, _observed = converge(SecurityGroupResource(ctx, self.params), self.check_mode)
        return self.converged(plan, security_group=plan.facts.get("group"))


def main():
    SecurityGroupModule()()


if __name__ == "__main__":
    main()
