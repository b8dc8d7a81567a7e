# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Showing a long module run's progress while it runs (the controller side of module_utils/core/progress.py).

The action plugins of the long-running modules (machine_batch, machine_set, manifest) run the module as Ansible
always does, with ``MACHINERY_PROGRESS_FILE`` naming a file in a private directory; a thread reads that file and
shows each new message, and the last one again when the run has been quiet for a while, so no long task is silent.
Only for a task that runs on the controller (the local connection), where the module's file is this machine's;
elsewhere, and for async tasks, the task runs exactly as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time

from ansible.utils.display import Display

from ansible_collections.machinery.compute.plugins.module_utils.core.progress import ENV

display = Display()


class Watcher:
    """Reads the progress file of one run and shows what is new. A message is shown once the run has lasted
    ``first`` seconds, then each new one (at most every ``gap`` seconds), and the current one again after
    ``quiet`` seconds without a new one."""

    def __init__(self, label, path, show=None, first=4.0, gap=2.0, quiet=8.0, clock=time.monotonic):
        self.label = label
        self.path = path
        self.show = show or display.display
        self.first, self.gap, self.quiet = first, gap, quiet
        self.clock = clock
        self.started = clock()
        self.shown_at = None
        self.shown = None
        self.current = None

    def poll(self):
        """Read the file and show its message if it is time; returns what was shown, or None."""
        try:
            with open(self.path) as handle:
                self.current = json.load(handle).get("message") or self.current
        except (OSError, ValueError):
            pass  # not written yet, or written while read: the next poll reads it
        now = self.clock()
        if self.current is None or now - self.started < self.first:
            return None
        since = None if self.shown_at is None else now - self.shown_at
        if since is None or (self.current != self.shown and since >= self.gap) or since >= self.quiet:
            text = "%s: %s (%ds)" % (self.label, self.current, now - self.started)
            self.show(text)
            self.shown, self.shown_at = self.current, now
            return text
        return None


@contextlib.contextmanager
def shown_progress(action, task_vars, interval=1.0):
    """Run the body (the module) with its progress shown, when the task runs on the controller and not async."""
    task = action._task
    if getattr(action._connection, "transport", None) != "local" or task.async_val:
        yield
        return
    directory = tempfile.mkdtemp(prefix="machinery-progress-")
    path = os.path.join(directory, "progress.json")
    host = (task_vars or {}).get("inventory_hostname")
    label = "%s%s" % (task.resolved_action or task.action, " on %s" % host if host else "")
    watcher = Watcher(label, path)
    stop = threading.Event()

    def watch():
        while not stop.wait(interval):
            watcher.poll()
    thread = threading.Thread(target=watch, name="machinery-progress", daemon=True)
    environment = task.environment
    task.environment = (list(environment) if isinstance(environment, list) else [environment] if environment else []) \
        + [{ENV: path}]
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        task.environment = environment
        shutil.rmtree(directory, ignore_errors=True)
