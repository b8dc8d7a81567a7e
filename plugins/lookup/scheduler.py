# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: scheduler
short_description: Place machines on the pools with room for them
version_added: 0.1.0
author: machinery.compute contributors (@machinery)
description:
  - Reads every pool's registration, published classes and machines in parallel (one libvirt connection per
    pool) and places each machine spec on one pool.
  - 'Filters, in order: the pool is reachable and Ready; every C(NoSchedule)/C(NoExecute) taint is tolerated
    (key, operator C(Equal)/C(Exists), value, effect); C(machine_pool_selector) matches the pool labels exactly;
    the class is published on the pool; the class fits in the free cpu, memory and storage after overcommit and
    reservations; the hard rule of the C(server_group) of the machine (V(affinity), V(anti-affinity)) holds.'
  - 'Storage: a machine needs its root disk (the larger of C(root_size) and the virtual size of a local image file)
    plus its new volumes (their C(size), or the size of a local image they copy). The size of an image given by
    URL or by a published name is only known on the pool, and is checked when the machine is created.'
  - C(spread) picks the pool with the most normalized free capacity (cpu, memory, storage) left after placement,
    C(binpack) the least. A C(soft-affinity) or C(soft-anti-affinity) server group ranks the pools first (most or
    fewest members). Ties are broken by a stable hash of machine and pool names.
  - A machine that already exists on a pool is placed there. A batch is placed one by one against an in-memory
    ledger, so one call never double-books a pool, and a server group counts the machines placed before.
  - 'A machine that fits nowhere fails the lookup with the reasons per filter, for example
    C(0/3 pools available for web-9: 1 taint not tolerated, 2 insufficient memory), followed by the cause of
    each pool that could not be used (C(pools[2] (hv3) is unreachable: ...)). An unreachable pool is also a
    warning when every machine found a place elsewhere.'
  - Use it with C(query) (or C(lookup(..., wantlist=true))) to always get a list.
requirements:
  - libvirt-python
  - lxml
options:
  _terms:
    description:
      - Machine specs, each a mapping with C(name), C(machine_class) (or C(cpu) and C(memory)) and optionally
        C(machine_pool_selector) (labels), C(tolerations) (list of key/operator/value/effect), C(machine_pool)
        (a pool name to pin to), C(server_group) (C(name), C(policy)), and C(root_size) and C(volumes) (their
        sizes count against the pools' storage).
      - A spec may also carry the other options of M(machinery.compute.machine) (the scheduler does not read them), so
        one list serves this lookup and M(machinery.compute.machine_batch); any other key (a misspelt C(tolerance),
        say) is refused, naming it.
      - Lists of specs are flattened.
    type: list
    elements: raw
    required: true
  pools:
    description: The pools, as libvirt URIs or mappings with C(uri) and an optional C(name).
    type: list
    elements: raw
    required: true
  strategy:
    description: How to choose among the pools that fit.
    type: str
    choices: [spread, binpack]
    default: spread
  strict:
    description:
      - Fail when a machine fits nowhere. With V(false) such a machine is returned with C(pool) and C(uri) null
        and the explanation in C(reason).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Place three machines on the fleet
  ansible.builtin.set_fact:
    placements: >-
      {{ query('machinery.compute.scheduler', machines, pools=fleet, strategy='spread') }}
  vars:
    fleet:
      - qemu+ssh://root@hv1/system
      - {name: hv2, uri: qemu+ssh://root@hv2/system}
    machines:
      - {name: web-1, machine_class: small}
      - {name: db-1, machine_class: large, machine_pool_selector: {disk: ssd}}
      - {name: gpu-1, machine_class: small, tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]}
"""

RETURN = r"""
_list:
  description: One placement per machine, in the order given.
  type: list
  elements: dict
  contains:
    name:
      description: Machine name.
      type: str
    pool:
      description: Pool name, or null when the machine fits nowhere and O(strict=false).
      type: str
    uri:
      description: The pool's libvirt URI.
      type: str
    reason:
      description: Why this pool, or why none.
      type: str
"""

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.lookup import LookupBase
from ansible.utils.unsafe_proxy import wrap_var

from ansible_collections.machinery.compute.plugins.module_utils.fleets import fleet
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError, ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.frozen import thaw
from ansible_collections.machinery.compute.plugins.module_utils.machines import machine_spec
from ansible_collections.machinery.compute.plugins.module_utils.pools.scheduler import (
    SPEC_KEYS, Unschedulable, schedule, unknown_keys)

# the keys of a machine of machine_batch: the scheduler's own and the machine module's options
KEYS = SPEC_KEYS + tuple(name for name in options.argument_spec(options.MACHINE + options.SCHEDULING,
                                                                without=("unique_across",)) if name not in SPEC_KEYS)


def flatten(terms):
    specs = []
    for term in terms:
        if isinstance(term, list):
            specs.extend(flatten(term))
        else:
            specs.append(term)
    return specs


def validated(terms):
    """The machine specs of the terms, each through machine_spec.params; errors name the term."""
    specs = []
    for index, term in enumerate(terms):
        if not isinstance(term, dict):
            raise ValidationError("a machine spec must be a mapping with at least name and machine_class",
                                  "terms[%d]" % index)
        unknown_keys(term, KEYS, "terms[%d]" % index, "a machine spec takes")
        specs.append(machine_spec.params(term, "terms[%d]" % index, scheduling=True))
    return specs


def pool_problems(snapshots):
    """Each pool the scheduler had to leave out, with its position in ``pools`` and the cause."""
    return ["pools[%d] (%s) is %s: %s" % (index, snapshot["name"],
                                          "unreachable" if snapshot["state"] == "Offline" else "not ready",
                                          snapshot.get("problem") or "no cause given")
            for index, snapshot in enumerate(snapshots) if snapshot["state"] != "Ready"]


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        problems = []
        try:
            entries = fleet.pool_entries(self.get_option("pools"))
            snapshots = fleet.read_snapshots(entries)
            problems = pool_problems(snapshots)
            for problem in problems:
                self._display.warning("machinery.compute.scheduler: %s" % problem)
            specs = validated(flatten(terms))
            placements = schedule(specs, snapshots, self.get_option("strategy"), self.get_option("strict"),
                                  image_sizes=machine_spec.local_image_sizes(specs))
        except MachineryError as exc:
            # a machine placed nowhere is often placed nowhere because pools were out: say why they were
            message = "; ".join([to_native(exc)] + (problems if isinstance(exc, Unschedulable) else []))
            raise AnsibleLookupError("machinery.compute.scheduler: %s" % message) from None
        # pool names come from the hosts' registries: never let them be templated; what Ansible gets is plain
        return [wrap_var(thaw(placement)) for placement in placements]
