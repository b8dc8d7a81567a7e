#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: machine_image
short_description: Publish a named OS image on pools
description:
  - Caches an OS image (a local file or an http(s) URL, verified by sha256) in the storage of each pool, once per
    checksum, and records it under a name in the pool's registry with what it is (os family, distribution,
    version, architecture).
  - M(machinery.compute.machine) then takes O(name) as its C(image), and manifests refer to it by name
    (IronCore C(image), vitistack C(os)).
  - Withdrawing a name leaves the cached bits (machines use them as backing files); the C(prune_images) option of M(machinery.compute.machine_pool)
    removes unused ones.
version_added: 0.3.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection.pools
  - machinery.compute.connection.hold
  - machinery.compute.action_group
  - machinery.compute.oci_image
seealso:
  - module: machinery.compute.machine
    description: Build machines on a published image by giving its name as O(machinery.compute.machine#module:image).
  - module: machinery.compute.manifest
    description: Manifests that name the image (IronCore C(image), vitistack C(os)).
  - module: machinery.compute.machine_pool
    description: Register the pools, and prune cached images no machine uses.
attributes:
  check_mode:
    support: full
    description: Computes the same change and writes nothing.
  diff_mode:
    support: full
    description: Shows the published record before and after.
options:
  name:
    description: Name of the image, a DNS-1123 label.
    type: str
    required: true
  url:
    description:
      - http(s) URL of the image (qcow2 or raw). Needs O(checksum). Exclusive with O(path).
      - Or an OS image in an OCI registry in IronCore's format, V(oci://<registry>/<repository>) with a tag or
        a sha256 digest (see O(machinery.compute.machine#module:image)); its disk layer is pulled, verified by
        its digest (the published image's checksum) and cached.
      - It is downloaded only when the pool has no cached image of O(checksum); when it has one the URL is not
        contacted, so a URL that refuses connections or answers 404 is accepted.
    type: str
  path:
    description: Path of the image on the controller (qcow2 or raw). Exclusive with O(url).
    type: str
  checksum:
    description: sha256 of the image (V(sha256:<hex>) or the bare hex). Required with an http(s) O(url).
    type: str
  from_machine:
    description:
      - Capture the image from a machine instead of a file or URL. Exclusive with O(url) and O(path).
      - The machine's root disk (or the disk of one of its snapshots) is copied whole and flat (no backing file)
        on the machine's pool, through libvirt, and its sha256 read back; the copy is published on that pool and,
        by checksum, on the other pools of O(pools).
      - The machine must be stopped, unless O(generalize) seals and stops it. A machine whose root disk is
        encrypted is refused, naming the reason.
      - A name already captured from the same machine (and snapshot) is left alone, so a re-run changes nothing;
        withdraw it (O(state=absent)) to capture again.
    type: dict
    suboptions:
      uri:
        description: libvirt URI of the machine's pool; defaults to O(uri), else the first of O(pools).
        type: str
      machine:
        description: Name of the machine.
        type: str
        required: true
      snapshot:
        description:
          - A snapshot of the machine (M(machinery.compute.machine_snapshot)) to capture instead of its present
            disk. The machine must be stopped; it is reverted to the snapshot for the copy and back afterwards.
        type: str
  generalize:
    description:
      - With O(from_machine), clear the guest's identity before the capture so that machines made from the image
        get their own (cloud-init's instance data, C(/etc/machine-id) emptied, the SSH host keys and the DHCP
        clients' saved leases removed).
      - It is done inside the running guest through its guest agent, then the machine is shut down (ACPI, then
        forced after 300 seconds) and captured. The machine stays stopped and sealed; started again, it takes a new
        identity as machines made from the image do. A stopped machine, one whose agent does not answer, or a
        snapshot is refused.
      - New SSH host keys are made at the next first boot by cloud-init.
    type: bool
    default: false
  os:
    description:
      - What the image is; kept with the name and returned.
      - A captured image takes the description of the image its machine was built on when this is left out.
      - Left out, a published image keeps its description; given, it replaces the description as a whole.
    type: dict
    suboptions:
      family:
        description: OS family.
        type: str
        choices: [linux, windows]
      distribution:
        description: Distribution, such as V(debian) or V(ubuntu).
        type: str
      version:
        description: Version of the distribution.
        type: str
      architecture:
        description: CPU architecture.
        type: str
        choices: [amd64, arm64, x86_64]
  state:
    description: Whether the name is published on the pools.
    type: str
    choices: [present, absent]
    default: present
  force:
    description: Withdraw the name even when machines were built on it (they keep their disks).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Publish Debian 12 on every pool
  machinery.compute.machine_image:
    pools: "{{ groups['hypervisors'] | map('extract', hostvars, 'libvirt_uri') }}"
    name: debian-12
    url: https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2
    checksum: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    os:
      family: linux
      distribution: debian
      version: "12"
      architecture: amd64

- name: Capture a prepared machine, sealed, and publish it on every pool
  machinery.compute.machine_image:
    pools: "{{ groups['hypervisors'] | map('extract', hostvars, 'libvirt_uri') }}"
    name: web-golden
    from_machine:
      uri: qemu+ssh://root@hv1/system
      machine: web-template
    generalize: true

- name: A machine built on it
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    machine_class: small
    image: debian-12
"""

RETURN = r"""
image:
  description: The image as published (as it would be in check mode), with the pools that have it.
  returned: always
  type: dict
  contains:
    name:
      description: Name of the image.
      type: str
      sample: my-image
    source:
      description: Where the bits came from (the URL or path given).
      type: str
      sample: https://images.example.com/debian-12.qcow2
    checksum:
      description: sha256 of the image.
      type: str
      sample: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    os:
      description: The os description given.
      type: dict
      sample: {"family": "linux", "distribution": "debian", "version": "12", "architecture": "amd64"}
    generalized:
      description: Whether a captured image was generalized (false for an image from a file or URL).
      type: bool
      returned: with O(from_machine)
      sample: true
    pools:
      description: Names of the pools it is published on after the run.
      type: list
      elements: str
      sample: ["hv1", "hv2"]
actions:
  description:
    - Short form of each planned action (cache, publish, withdraw; generalize, capture, copy for a captured image),
      over every pool in order.
  returned: always
  type: list
  elements: str
  sample: ["cache", "publish", "cache", "publish"]
plan:
  description: Each action with its target (C(<pool>/<image>)), the record before and after, and libvirt steps.
  returned: always
  type: list
  elements: dict
  sample:
    - action: cache
      target: hv1/my-image
      steps:
        - {"action": "cache_image", "target": "https://images.example.com/debian-12.qcow2"}
    - action: publish
      target: hv1/my-image
      before: {}
      after:
        name: my-image
        source: https://images.example.com/debian-12.qcow2
        checksum: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        os: {"family": "linux", "distribution": "debian", "version": "12", "architecture": "amd64"}
      steps:
        - {"action": "write_document", "target": "image-my-image"}
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.machines import capture
from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Plan, converge
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext


class MachineImageModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_IMAGE)
    module_kwargs = {"mutually_exclusive": [("url", "path", "from_machine")]}

    def pool_entries(self):
        """With from_machine and no pools, the machine's own pool."""
        if self.params.get("from_machine") and self.params["pools"] is None and not self.params.get("uri"):
            return [{"name": None, "uri": self.params["from_machine"].get("uri")}]
        return super().pool_entries()

    def run_pools(self, entries):
        params = named_images.validated(self.params)
        if params.get("from_machine") is not None and params["state"] == "present":
            return self.capture(params, entries)
        whole = Plan()
        shown, pools = None, []
        for entry in entries:
            with lv.Connection(entry["uri"]) as conn:
                ctx = PoolContext(conn, entry["uri"], self.coordination)
                ctx.url_opener = self.url_opener()
                ctx.require_registration()
                plan, observed = converge(named_images.ImageResource(ctx, params), self.check_mode)
                pool = ctx.name or entry["uri"]
                self.gather(whole, plan, pool)
                current = observed[0]
                if self.check_mode and params["state"] == "present":
                    current = dict(current or {}, **plan.facts["published"])
                if params["state"] == "present":
                    pools.append(pool)
                    shown = named_images.shown(current)
        image = dict(shown or {"name": params["name"]}, pools=pools)
        return self.converged(whole, image=image)

    @staticmethod
    def gather(whole, plan, pool):
        for action in plan.actions:
            action.target = "%s/%s" % (pool, action.target)
        whole.actions.extend(plan.actions)

    def capture(self, params, entries):
        """Capture on the machine's pool, then publish on the other pools by checksum."""
        params["from_machine"] = capture.from_machine(params["from_machine"], entries[0]["uri"])
        origin_uri = params["from_machine"]["uri"]
        whole = Plan()
        pools = []
        with lv.Connection(origin_uri) as origin_conn:
            origin = PoolContext(origin_conn, origin_uri, self.coordination)
            origin.require_registration()
            plan, seen = converge(capture.CaptureResource(origin, params), self.check_mode)
            self.gather(whole, plan, origin.name or origin_uri)
            pools.append(origin.name or origin_uri)
            record = origin.registry.get(named_images.image_key(params["name"])) if not self.check_mode \
                else (seen["record"] if not plan.actions or plan.kinds() == ["publish"] else None)
            shown = named_images.shown(record if record is not None else plan.facts["published"])
            for entry in entries:
                if entry["uri"] == origin_uri:
                    continue
                with lv.Connection(entry["uri"]) as conn:
                    ctx = PoolContext(conn, entry["uri"], self.coordination)
                    ctx.require_registration()
                    replica, _seen = converge(capture.ReplicaResource(ctx, params, origin, record), self.check_mode)
                    self.gather(whole, replica, ctx.name or entry["uri"])
                    pools.append(ctx.name or entry["uri"])
        shown["generalized"] = bool((record or plan.facts["published"]).get("generalized"))
        return self.converged(whole, image=dict(shown, pools=pools))


def main():
    MachineImageModule()()


if __name__ == "__main__":
    main()
