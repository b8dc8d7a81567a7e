# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  uri:
    description:
      - libvirt URI of the pool host, for example V(qemu:///system), V(qemu+ssh://root@h1/system),
        V(qemu+tls://h1/system) or V(qemu+unix:///system?socket=/path/to/libvirt-sock).
      - The module opens one connection per run and does everything through it, so every URI works.
    type: str
    default: qemu:///system
requirements:
  - libvirt-python
  - lxml
notes:
  - The module runs where the play runs it (usually the controller, O(uri) pointing at the pool host).
"""
