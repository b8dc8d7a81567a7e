#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: manifest_info
short_description: Export existing machines as manifests of a dialect
description:
  - Writes the machines of the pools (made by any means) out as Machine documents of O(dialect), so a fleet can
    move between dialects or into git.
  - Applying the export with M(machinery.compute.manifest) to the same pools changes nothing.
  - Boot configuration (Ignition, cloud-init) is never kept on the pools, only its hash, so it is not exported;
    the machines keep theirs when the export is applied.
version_added: 0.3.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
seealso:
  - module: machinery.compute.manifest
    description: Apply the exported documents, to the same pools or others.
  - module: machinery.compute.machine_info
    description: The machines' status as the collection returns it.
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Reads only; there is nothing to show before and after.
options:
  dialect:
    description: The dialect of the documents.
    type: str
    choices: [ironcore, openshift, kupenstack, vitistack]
    default: ironcore
  name:
    description: Only these machines.
    type: list
    elements: str
  labels:
    description: Only machines with all these labels.
    type: dict
"""

EXAMPLES = r"""
- name: Export every machine as IronCore Machines
  machinery.compute.manifest_info:
    pools: [qemu+ssh://root@hv1/system]
    dialect: ironcore
  register: exported

- name: Keep them in git
  ansible.builtin.copy:
    content: "{{ exported.documents | map('to_nice_yaml') | join('---\n') }}"
    dest: manifests/machines.yml
    mode: "0644"
"""

RETURN = r"""
documents:
  description: One document per machine, in name order.
  returned: always
  type: list
  elements: dict
  sample:
    - apiVersion: compute.ironcore.dev/v1alpha1
      kind: Machine
      metadata:
        name: web-1
        labels: {"app": "web"}
      spec:
        machineClassRef: {"name": "small"}
        image: my-image
        machinePoolRef: {"name": "hv1"}
        power: 'On'
        volumes:
          - name: data
            emptyDisk: {"sizeLimit": "64Gi"}
        networkInterfaces:
          - name: eth0
            ephemeral: {"networkInterfaceTemplate": {"spec": {"networkRef": {"name": "default"}}}}
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.manifests.export import export_machines
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class ManifestInfoModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MANIFEST_INFO)

    def run_pools(self, entries):
        documents, warnings = export_machines(entries, self.params["dialect"], self.params.get("name"),
                                              self.params.get("labels"))
        return {"changed": False, "documents": documents, "warnings": warnings}


def main():
    ManifestInfoModule()()


if __name__ == "__main__":
    main()
