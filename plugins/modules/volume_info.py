#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: volume_info
short_description: List the volumes of pools' storage with their size, labels and the machines using them
description:
  - Read-only listing of the volumes of the C(machinery) storage pool of each pool, in the shape of
    M(machinery.compute.volume)'s C(volume) - standalone volumes, machines' disks and volumes made by
    M(machinery.compute.volume_attach) alike.
  - The collection's own volumes (image caches, Ignition files, cloud-init seeds, console logs, upload locks) are
    left out.
  - The pools are read in parallel, one libvirt connection each. A pool that cannot be reached contributes
    nothing and gives a warning, not a failure; a host that is not registered as a pool contributes nothing.
    Nothing to list gives an empty list.
version_added: 0.4.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.volume
    description: Make, grow, relabel or delete a volume.
  - module: machinery.compute.volume_attach
    description: Attach a volume to a machine.
  - module: machinery.compute.machine_pool_info
    description: The pools, with their storage.
attributes:
  check_mode:
    support: full
    description: The module never changes anything.
  diff_mode:
    support: none
    description: Nothing to show.
options:
  name:
    description: Only volumes with these names.
    type: list
    elements: str
  labels:
    description: Only volumes that carry all of these labels with these values.
    type: dict
"""

EXAMPLES = r"""
- name: The volumes of two pools labelled app=web
  machinery.compute.volume_info:
    pools:
      - qemu+ssh://root@hv1/system
      - qemu+ssh://root@hv2/system
    labels:
      app: web
  register: web

- name: Volumes no machine uses
  ansible.builtin.debug:
    msg: "{{ web.volumes | rejectattr('attached_to') | map(attribute='name') }}"
"""

RETURN = r"""
volumes:
  description: The volumes, by pool in the order given, then by name.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Name of the volume.
      type: str
      sample: web-boot
    pool:
      description: Name of the pool whose storage holds it.
      type: str
      sample: hv1
    size:
      description: Size as a quantity.
      type: str
      sample: 20Gi
    format:
      description: qcow2 or raw.
      type: str
      sample: qcow2
    labels:
      description: Labels of the volume (given by M(machinery.compute.volume)).
      type: dict
      sample: {"app": "web"}
    image:
      description: The image the volume was copied from; null for an empty volume or one made another way.
      type: str
      sample: debian-12
    attached_to:
      description: Names of the machines whose disks it is, sorted.
      type: list
      elements: str
      sample: [web-1]
    state:
      description: Available.
      type: str
      sample: Available
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core import validation as check
from ansible_collections.machinery.compute.plugins.module_utils.fleets.fleet import read_each
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.machines.volumes import list_volumes, selected


class VolumeInfoModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.VOLUME_INFO)

    def run_pools(self, entries):
        names = self.params["name"]
        wanted = check.labels(self.params["labels"], "labels")
        warnings = []

        def read(ctx, _entry):
            return list_volumes(ctx) if ctx.registration else []

        def offline(entry, cause):
            warnings.append("pool %s is offline: %s" % (entry.get("name") or entry["uri"], cause))
            return []
        volumes = [volume for listed in read_each(entries, read, offline) for volume in listed
                   if selected(volume, names, wanted)]
        return {"changed": False, "volumes": volumes, "warnings": warnings}


def main():
    VolumeInfoModule()()


if __name__ == "__main__":
    main()
