# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Every module of the collection is a member: it takes the group's common options (machinery.compute.connection).
    DOCUMENTATION = r"""
options: {}
attributes:
  action_group:
    description: Use C(group/machinery.compute.machinery) in module_defaults to set defaults for this module.
    support: full
    membership:
      - machinery.compute.machinery
"""
