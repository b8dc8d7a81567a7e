# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Each string is one literal: ansible-test's yamllint reads the fragments' strings from the source, not by
    # running it. hold_timeout is the same in all three (every module takes the group's common options).

    # A module that works on one pool.
    DOCUMENTATION = r"""
options:
  uri:
    description:
      - libvirt URI of the pool host, for example V(qemu:///system), V(qemu+ssh://root@h1/system),
        V(qemu+tls://h1/system) or V(qemu+unix:///system?socket=/path/to/libvirt-sock).
      - The module opens one connection per run and does everything through it, so every URI works.
      - Set it once for a play with C(module_defaults) of C(group/machinery.compute.machinery).
    type: str
    default: qemu:///system
  hold_timeout:
    description:
      - How long, in seconds, this run waits for a machine that another run holds (changes, moves, snapshots,
        backs up) before it fails with C(reason=Conflict) and C(holder) (C(controller), C(operation), C(since)).
        V(0) fails at once.
      - A machine held by a move is refused at once, whatever this says; read-only modules never wait.
      - Set it once for a play with C(module_defaults) of C(group/machinery.compute.machinery). See
        C(docs/concurrency.md).
    type: int
    default: 900
requirements:
  - libvirt-python
  - lxml
notes:
  - The module runs where the play runs it (usually the controller, O(uri) pointing at the pool host).
"""

    # A module that works on several pools at once.
    POOLS = r"""
options:
  pools:
    description:
      - The pools, as libvirt URIs or mappings with C(uri) and an optional C(name). They are read in parallel,
        one connection each.
      - When not given, the one pool at O(uri) is used; giving neither fails naming O(pools).
    type: list
    elements: raw
  uri:
    description:
      - libvirt URI of the one pool to use when O(pools) is not given, for example V(qemu+ssh://root@h1/system).
      - This is the common option of the action group, so C(module_defaults) of
        C(group/machinery.compute.machinery) sets it for this module as for the others. O(pools) wins over it.
    type: str
  hold_timeout:
    description:
      - How long, in seconds, this run waits for a machine that another run holds (changes, moves, snapshots,
        backs up) before it fails with C(reason=Conflict) and C(holder) (C(controller), C(operation), C(since)).
        V(0) fails at once.
      - A machine held by a move is refused at once, whatever this says; read-only modules never wait.
      - Set it once for a play with C(module_defaults) of C(group/machinery.compute.machinery). See
        C(docs/concurrency.md).
    type: int
    default: 900
requirements:
  - libvirt-python
  - lxml
notes:
  - The module runs where the play runs it (usually the controller, the URIs pointing at the pool hosts).
"""

    # The common option hold_timeout alone, for a module that documents uri and pools itself.
    HOLD = r"""
options:
  hold_timeout:
    description:
      - How long, in seconds, this run waits for a machine that another run holds (changes, moves, snapshots,
        backs up) before it fails with C(reason=Conflict) and C(holder) (C(controller), C(operation), C(since)).
        V(0) fails at once.
      - A machine held by a move is refused at once, whatever this says; read-only modules never wait.
      - Set it once for a play with C(module_defaults) of C(group/machinery.compute.machinery). See
        C(docs/concurrency.md).
    type: int
    default: 900
"""
