#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: manifest
short_description: Apply Kubernetes-style machine manifests (IronCore, OpenShift, KupenStack, vitistack) to pools
description:
  - Applies YAML documents as C(kubectl apply -f) would, onto libvirt pools. The dialects are IronCore
    (C(compute.ironcore.dev/v1alpha1) Machine, MachineClass, MachinePool; C(storage.ironcore.dev/v1alpha1) Volume;
    C(networking.ironcore.dev/v1alpha1) NetworkInterface; C(v1) Secret), the OpenShift Machine API
    (C(machine.openshift.io/v1beta1) Machine, MachineSet, MachineHealthCheck with a C(LibvirtMachineProviderSpec)),
    KupenStack (C(kupenstack.io/v1alpha1) VirtualMachine, Flavor, Image, KeyPair, Network, VirtualNetwork, Volume)
    and vitistack (C(vitistack.io/v1alpha1) Machine of both CRD generations, MachineClass; C(v1) ConfigMap for
    cloud-init data). docs/manifests.md has every field.
  - Every document is checked before anything is written, and every problem is reported at once, each with
    its object (C(Kind/name)) and field path, as kubectl prints them.
  - The objects a document names (a class, an image, a network, a volume) are made before it in the same run,
    wherever they are in the documents.
  - An image URL given without a checksum (vitistack's C(os.imageID) and C(os.isoUri), KupenStack's Image
    C(src)) is downloaded once into the controller's cache, its sha256 recorded there and warned about; later
    runs verify the download against it, so a file changed at that URL is refused as a checksum mismatch.
  - Every field a dialect's schema allows is applied, warned about or refused, naming its path; none is silently
    ignored (docs/manifests.md lists the verdicts). Deleting reports each dialect's own phases.
  - Each object is handed to the core its kind maps onto (M(machinery.compute.machine),
    M(machinery.compute.machine_class), M(machinery.compute.machine_set), M(machinery.compute.machine_health_check)),
    so the same rules, idempotency and check mode apply.
version_added: 0.3.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
  - machinery.compute.oci_image
seealso:
  - module: machinery.compute.manifest_info
    description: Export existing machines as documents of a dialect.
  - module: machinery.compute.machine_image
    description: Publish the named images the documents refer to.
  - module: machinery.compute.machine
    description: The core a Machine document is handed to.
  - module: machinery.compute.machine_set
    description: The core a MachineSet document is handed to.
attributes:
  check_mode:
    support: full
    description: Checks the documents and returns the actions the run would take; writes nothing.
  diff_mode:
    support: full
    description: Shows each changed object's owned fields before and after.
options:
  src:
    description:
      - A YAML file, a directory (its C(*.yml) and C(*.yaml) files, in name order) or a list of either.
      - A file of a directory that is a symlink to a file outside that directory is refused.
      - A key given twice in one mapping of a document is refused, naming the key and its path, rather than
        letting the last one win.
      - A document that is a YAML list is IronCore libvirt-provider's machine-class file (its
        C(--machine-classes-file)), each item C({name, capabilities}) (or a whole MachineClass) one of its classes,
        read as IronCore MachineClass documents.
    type: raw
  definition:
    description:
      - Documents given inline, as a mapping, a list of mappings or YAML text.
      - YAML text with a key given twice in one mapping is refused like O(src).
    type: raw
  state:
    description: V(present) applies the documents, V(absent) deletes the objects they describe.
    type: str
    choices: [present, absent]
    default: present
  prune:
    description:
      - Delete machines and machine sets on the pools that carry the C(app) label of these documents but are no
        longer among them, as C(kubectl apply --prune -l app=...) does.
    type: bool
    default: false
  wait:
    description: What a machine that is started waits for (V(running), its DHCP V(address), or V(none)).
    type: str
    choices: [none, running, address]
    default: running
  wait_timeout:
    description: Seconds each machine may take to reach O(wait).
    type: int
    default: 300
  shutdown_timeout:
    description: Seconds a deleted machine is given to power off gracefully before it is forced off.
    type: int
    default: 60
  providers:
    description:
      - The vitistack providers this run serves on these pools. A vitistack Machine whose C(spec.provider) (or
        C(spec.providerConfig.name)) is among them runs as a QEMU machine of these pools; any other provider is
        refused, naming the field and this option.
      - Left out, V(libvirt) alone. vitistack's own examples say C(kubevirt); give C([libvirt, kubevirt]) to run
        them here.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Apply a directory of IronCore manifests to two pools
  machinery.compute.manifest:
    pools:
      - qemu+ssh://root@hv1/system
      - qemu+ssh://root@hv2/system
    src: manifests/

- name: An inline MachineClass
  machinery.compute.manifest:
    uri: qemu+ssh://root@hv1/system
    definition:
      apiVersion: compute.ironcore.dev/v1alpha1
      kind: MachineClass
      metadata:
        name: small
      capabilities:
        cpu: 1
        memory: 512Mi

- name: Apply and remove what left the files
  machinery.compute.manifest:
    pools: [qemu+ssh://root@hv1/system]
    src: manifests/
    prune: true
"""

RETURN = r"""
objects:
  description: Every object of the documents with its C(status) in its own dialect.
  returned: always
  type: list
  elements: dict
  sample:
    - apiVersion: compute.ironcore.dev/v1alpha1
      kind: Machine
      metadata:
        name: web-1
        labels: {"app": "web"}
      status:
        machinePoolRef: {"name": "hv1"}
        state: Running
        conditions:
          - {"type": "Ready", "status": "True", "reason": "Running", "message": ""}
        volumes: [{"name": "root", "state": "Attached"}]
        networkInterfaces: [{"name": "eth0", "state": "Attached", "ips": ["192.168.122.152"]}]
tables:
  description:
    - Per kind, lines like C(kubectl get <kind> -o wide) prints.
    - A kind that documents of more than one project share in one run (IronCore's, OpenShift's and vitistack's
      C(Machine) each have their own columns) has one table per API group, named C(<Kind>.<group>), for example
      C(Machine.machine.openshift.io).
  returned: always
  type: dict
  sample:
    Machine:
      - NAME    MACHINECLASSREF   IMAGE      MACHINEPOOLREF   STATE     AGE
      - web-1   small             my-image   hv1              Running   12s
    MachineClass:
      - NAME    CPU   MEMORY
      - small   1     512Mi
problems:
  description: When the documents are invalid, every problem, each as C(<Kind>/<name>) and the field path.
  returned: failure
  type: list
  elements: str
  sample:
    - 'MachineClass/small: capabilities.cpu: must be between 1 and 256, got 0'
    - "Machine/web-1: spec.machineClassRef.name: MachineClass 'huge' is neither among the documents nor published on
      a pool"
actions:
  description: Every planned action as C(<Kind>/<name>) then the action (with C(on <pool>) where it is per pool).
  returned: always
  type: list
  elements: str
  sample: ["MachineClass/small: publish on hv1", "Machine/web-1: update labels"]
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.manifests import documents as docs
from ansible_collections.machinery.compute.plugins.module_utils.manifests import engine
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule


class ManifestModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MANIFEST)
    module_kwargs = {"required_one_of": [("src", "definition")]}

    def run_pools(self, entries):
        documents, problems = docs.load_sources(self.params.get("src"), self.params.get("definition"))
        self.module.no_log_values.update(docs.secret_strings(documents))
        try:
            result = engine.apply(entries, documents, self.params, self.check_mode, self.url_opener(), problems,
                                  self.coordination)
        except docs.ManifestError as exc:
            return {"failed": True, "msg": str(exc), "problems": exc.problems, "reason": exc.reason,
                    "changed": False}
        before, after = result.pop("before"), result.pop("after")
        result["diff"] = self.diff(before, after) if result["changed"] else None
        return result


def main():
    ManifestModule()()


if __name__ == "__main__":
    main()
