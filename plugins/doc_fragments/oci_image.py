# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The modules that take an image from an OCI registry (machine, machine_image, volume, manifest).
    DOCUMENTATION = r"""
options:
  image_ca_file:
    description:
      - The CA certificate (PEM) of a private OCI registry that an image given as V(oci://...) is pulled from
        (in a manifest, IronCore's bare references such as V(registry.example.com/os/debian:12) too); without
        it, the system's certificates.
    type: path
  image_pull_secret:
    description:
      - Credentials of that registry, sent when it asks for them (Basic, or to its token service for a Bearer
        token). Never recorded. In a manifest, a document's own (IronCore's C(spec.imagePullSecret)) wins.
    type: dict
    suboptions:
      username:
        description: User name.
        type: str
        required: true
      password:
        description: Password or token.
        type: str
        required: true
"""
