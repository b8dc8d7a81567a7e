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
  os:
    description:
      - What the image is; kept with the name and returned.
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
    pools:
      description: Names of the pools it is published on after the run.
      type: list
      elements: str
      sample: ["hv1", "hv2"]
actions:
  description: Short form of each planned action (cache, publish, withdraw), over every pool in order.
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
from ansible_collections.machinery.compute.plugins.module_utils.machines import named_images
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.convergence import Plan, converge
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext


class MachineImageModule(MachineryModule):
    multi_pool = True
    argument_spec = options.argument_spec(options.MACHINE_IMAGE)
    module_kwargs = {"mutually_exclusive": [("url", "path")]}

    def run_pools(self, entries):
        params = named_images.validated(self.params)
        whole = Plan()
        shown, pools = None, []
        for entry in entries:
            with lv.Connection(entry["uri"]) as conn:
                ctx = PoolContext(conn, entry["uri"])
                ctx.url_opener = self.url_opener()
                ctx.require_registration()
                plan, observed = converge(named_images.ImageResource(ctx, params), self.check_mode)
                pool = ctx.name or entry["uri"]
                for action in plan.actions:
                    action.target = "%s/%s" % (pool, action.target)
                whole.actions.extend(plan.actions)
                current = observed[0]
                if self.check_mode and params["state"] == "present":
                    current = dict(current or {}, **plan.facts["published"])
                if params["state"] == "present":
                    pools.append(pool)
                    shown = named_images.shown(current)
        image = dict(shown or {"name": params["name"]}, pools=pools)
        return self.converged(whole, image=image)


def main():
    MachineImageModule()()


if __name__ == "__main__":
    main()
