# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""machine_batch as any module, with its progress shown while it runs (plugin_utils/progress.py)."""

from __future__ import annotations

from ansible.plugins.action.normal import ActionModule as NormalAction

from ansible_collections.machinery.compute.plugins.plugin_utils.progress import shown_progress


class ActionModule(NormalAction):
    def run(self, tmp=None, task_vars=None):
        with shown_progress(self, task_vars):
            return super().run(tmp, task_vars)
