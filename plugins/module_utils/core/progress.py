# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How far a long run has got, for whoever waits on it.

A module cannot print while it runs: Ansible shows its result when it ends. When the environment names a file in
``MACHINERY_PROGRESS_FILE`` (the collection's action plugins do, for a task that runs on the controller), a run
writes one line of JSON there as it gets further, ``{"message": ...}``, replacing the whole file at once; the
action plugin shows each new message as the task runs. Without that variable nothing is written.

The file is written at most every ``EVERY`` seconds: the watcher reads it once a second, and a write per machine
begun and ended (2,000 renames for 1,000 machines, each under the lock every worker thread takes) cost a batch of
1,000 no-op machines 0.3-0.5 s. A change that comes sooner is written when the interval is up, so the file never
stays behind the run for longer than that.
"""

from __future__ import annotations

import json
import os
import threading
import time

ENV = "MACHINERY_PROGRESS_FILE"
EVERY = 0.5  # seconds between two writes at most


class Progress:
    """The items of one run (``noun`` is their plural: "machines") by name as they begin and end; safe from any
    thread. An item is done once, however many pools it was worked on; one to try again is undone."""

    def __init__(self, noun, total=0, verb="done", path=None, every=EVERY, clock=time.monotonic, later=None):
        """``later(seconds, function)`` runs ``function`` once after ``seconds`` (a daemon timer by default)."""
        self.path = path if path is not None else os.environ.get(ENV)
        self.noun = noun
        self.verb = verb
        self.total = total
        self.done = set()
        self.working = []
        self.every = every
        self.clock = clock
        self.later = later or _daemon_timer
        self.started = clock()
        self._written = None  # when the file was last written
        self._deferred = False  # a write is due when the interval is up
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
        """Under the lock: write now, or once the interval since the last write is up."""
        if not self.path or self._deferred:
            return
        now = self.clock()
        if self._written is not None and now - self._written < self.every:
            self._deferred = True
            self.later(self._written + self.every - now, self._deferred_write)
            return
        self._written = now
        body = json.dumps({"message": self.message(), "done": len(self.done), "total": self.total,
                           "seconds": round(now - self.started, 1)})
        partial = self.path + ".part"
        try:
            with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
                handle.write(body)
            os.replace(partial, self.path)
        except OSError:
            self.path = None  # the watcher went away: the run itself goes on, silently as before

    def _deferred_write(self):
        with self._lock:
            self._deferred = False
            self._written = None
            self._write()


def _daemon_timer(seconds, function):
    timer = threading.Timer(seconds, function)
    timer.daemon = True  # a write still due when the module exits is not waited for
    timer.start()
