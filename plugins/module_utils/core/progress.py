# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How far a long run has got, for whoever waits on it.

A module cannot print while it runs: Ansible shows its result when it ends. When the environment names a file in
``MACHINERY_PROGRESS_FILE`` (the collection's action plugins do, for a task that runs on the controller), a run
writes one line of JSON there each time it gets further, ``{"message": ...}``, replacing the whole file at once;
the action plugin shows each new message as the task runs. Without that variable nothing is written.
"""

from __future__ import annotations

import json
import os
import threading
import time

ENV = "MACHINERY_PROGRESS_FILE"


class Progress:
    """The items of one run (``noun`` is their plural: "machines") by name as they begin and end; safe from any
    thread. An item is done once, however many pools it was worked on; one to try again is undone."""

    def __init__(self, noun, total=0, verb="done", path=None):
        self.path = path if path is not None else os.environ.get(ENV)
        self.noun = noun
        self.verb = verb
        self.total = total
        self.done = set()
        self.working = []
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def begin(self, name):
        with self._lock:
            self.working.append(name)
            self._write()

    def end(self, name):
        with self._lock:
            if name in self.working:
                self.working.remove(name)
            self.done.add(name)
            self._write()

    def undo(self, name):
        """``name`` goes back to be done again (a machine crowded off its pool, placed anew)."""
        with self._lock:
            self.done.discard(name)
            self._write()

    def message(self):
        """'3 of 8 machines done; working on web-4, web-5 (and 2 more)'."""
        text = "%d of %d %s %s" % (len(self.done), self.total, self.noun, self.verb)
        if self.working:
            shown = self.working[:3]
            more = len(self.working) - len(shown)
            text += "; working on %s%s" % (", ".join(shown), " (and %d more)" % more if more else "")
        return text

    def _write(self):
        if not self.path:
            return
        body = json.dumps({"message": self.message(), "done": len(self.done), "total": self.total,
                           "seconds": round(time.monotonic() - self.started, 1)})
        partial = self.path + ".part"
        try:
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
                handle.write(body)
            os.replace(partial, self.path)
        except OSError:
            self.path = None  # the watcher went away: the run itself goes on, silently as before
