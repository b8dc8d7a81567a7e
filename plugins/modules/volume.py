#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: volume
short_description: A standalone volume of a pool's storage, empty or a bootable copy of an image
description:
  - Makes, grows, relabels or deletes the volume O(name) of the pool's C(machinery) storage pool, apart from any
    machine. Machines use it with C(volumes) of M(machinery.compute.machine) (C(volume) set) or
    M(machinery.compute.volume_attach), and it outlives their detach and deletion.
  - With O(image), the volume is a full copy of that image (not an overlay on the pool's image cache), so a machine
    without an image of its own boots from it.
  - A larger O(size) grows the volume, through the running guest when one uses it; a smaller one is refused.
  - O(format) and O(image) are fixed when the volume is made; giving another value later is refused.
  - The labels and the image a volume was made from are kept in the pool's registry, through the libvirt
    connection alone. Volumes made otherwise (by M(machinery.compute.volume_attach), say) have no labels until
    this module gives them some.
  - Deleting a volume that a machine still uses is refused unless O(force=true).
  - The collection's own volumes (image caches, Ignition files, cloud-init seeds, console logs, upload locks) are
    refused, and so are a machine's own disks (its root disk and rebuild roots, its ephemeral volumes, its backup
    copies) whatever O(force) says, naming the machine - M(machinery.compute.machine) with O(state=absent) deletes
    them with it.
version_added: 0.4.0
author: machinery.compute contributors (@machinery)
extends_documentation_fragment:
  - machinery.compute.connection
  - machinery.compute.connection.hold
  - machinery.compute.action_group
  - machinery.compute.oci_image
seealso:
  - module: machinery.compute.volume_info
    description: List the volumes of pools.
  - module: machinery.compute.volume_attach
    description: Attach a volume to a machine, hot-plugging it.
  - module: machinery.compute.machine_image
    description: Publish the named images a volume is copied from.
  - module: machinery.compute.machine
    description: A machine that boots from a volume, or uses it as a data disk.
attributes:
  check_mode:
    support: full
    description: Validates and computes the change; writes nothing.
  diff_mode:
    support: full
    description: The volume's size, format, labels and image before and after.
options:
  name:
    description: Name of the volume in the pool's C(machinery) storage pool (letters, digits, C(.), C(_), C(-)).
    type: str
    required: true
  size:
    description:
      - Size as a quantity (V(10Gi)) or a number of bytes, at least 1Mi, rounded up to whole 512-byte sectors.
      - Required to make a volume without O(image); with O(image) it defaults to the image's size and may not be
        smaller.
      - A larger size grows an existing volume; a smaller one is refused.
    type: raw
  image:
    description:
      - The image to copy into a new volume - the name of an image published on the pool with
        M(machinery.compute.machine_image), or a path to a qcow2 or raw disk image on the controller.
      - Or an OS image in an OCI registry, V(oci://<registry>/<repository>) with a tag or a sha256 digest (see
        O(machinery.compute.machine#module:image)), pulled and cached on the pool by its digest first.
      - The copy is complete (no backing file) and bootable.
    type: str
  format:
    description:
      - Format of the volume. A new volume is V(qcow2) when this is not given; an existing one keeps its own.
    type: str
    choices: [qcow2, raw]
  labels:
    description:
      - Labels of the volume (Kubernetes rules). Not given keeps the current labels; V({}) removes them.
    type: dict
  state:
    description: Whether the volume exists.
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - Delete the volume even when machines use it - it is detached from their configuration first (a running
        guest is asked to let go of it and keeps it until it does).
      - Only for a standalone volume that machines were given; a machine's own disk is never deleted this way.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: A bootable volume copied from a published image
  machinery.compute.volume:
    uri: qemu+ssh://root@hv1/system
    name: web-boot
    image: debian-12
    size: 20Gi
    labels:
      app: web

- name: A machine that boots from it
  machinery.compute.machine:
    uri: qemu+ssh://root@hv1/system
    name: web-1
    machine_class: small
    volumes:
      - name: boot
        volume: web-boot

- name: An empty raw data volume
  machinery.compute.volume:
    uri: qemu+ssh://root@hv1/system
    name: shared-data
    size: 50Gi
    format: raw

- name: Delete it
  machinery.compute.volume:
    uri: qemu+ssh://root@hv1/system
    name: shared-data
    state: absent
"""

RETURN = r"""
volume:
  description: The volume as the run leaves it (in check mode, as the run would leave it).
  returned: always
  type: dict
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
      description: Size as a quantity; null when the volume does not exist.
      type: str
      sample: 20Gi
    format:
      description: qcow2 or raw; null when the volume does not exist.
      type: str
      sample: qcow2
    labels:
      description: Labels of the volume.
      type: dict
      sample: {"app": "web"}
    image:
      description: The image the volume was copied from (a published name or a path); null for an empty volume.
      type: str
      sample: debian-12
    attached_to:
      description: Names of the machines whose disks it is, sorted.
      type: list
      elements: str
      sample: [web-1]
    state:
      description: Available (it exists), Pending (a check-mode run would make it) or Absent.
      type: str
      sample: Available
actions:
  description: The short form of each planned action, in order, for example C(create), C(grow), C(update labels).
  returned: always
  type: list
  elements: str
  sample: ["create"]
plan:
  description:
    - The actions of the run (or, in check mode, of the run it would make), in order, each with what it changes.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: The kind of action - C(create), C(grow), C(update), C(delete) or C(forget) (labels of a volume
        that was deleted another way).
      type: str
      sample: create
    target:
      description: The volume it acts on.
      type: str
      sample: web-boot
    fields:
      description: For C(update), the fields it changes.
      type: list
      elements: str
      sample: ["labels"]
    before:
      description: The volume's fields before the action, where it changes some.
      type: dict
      sample: {}
    after:
      description: The volume's fields after the action, where it changes some.
      type: dict
      sample: {"name": "web-boot", "size": "20Gi", "format": "qcow2", "labels": {"app": "web"}, "image": "debian-12"}
    steps:
      description: The libvirt operations it takes, each with C(action) and C(target).
      type: list
      elements: dict
      sample:
        - action: cache_image
          target: debian-12
        - action: copy_volume
          target: web-boot
          image: debian-12
          format: qcow2
          size: 21474836480
        - action: write_document
          target: volume-3f1c0e1b9e0c4a7d8b2a6f5e4d3c2b1a
"""

from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.interface.module_base import MachineryModule
from ansible_collections.machinery.compute.plugins.module_utils.machines.volumes import VolumeResource


class VolumeModule(MachineryModule):
    argument_spec = options.argument_spec(options.STANDALONE_VOLUME)

    def run(self, ctx):
        plan, volume, warnings = VolumeResource(ctx, self.params, self.check_mode).ensure()
        return self.converged(plan, volume=volume, warnings=warnings)


def main():
    VolumeModule()()


if __name__ == "__main__":
    main()
