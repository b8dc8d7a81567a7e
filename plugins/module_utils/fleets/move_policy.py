# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A live move under control (``policy`` of machine_migrate, the drain and maintenance roles): the bandwidth, the
maximum downtime, a completion timeout per GiB of the guest's memory that then aborts or switches to post-copy,
auto-converge, and a limit of moves per pool; and the watch that reports progress while libvirt migrates.

``parse`` and ``timeout_seconds`` are pure; ``Watch`` polls the source's job from a second thread of the run (the
libvirt connection is thread-safe) while the migration call blocks the first.
"""

from __future__ import annotations

import json
import os
import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import options
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.progress import ENV
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import format_quantity, parse_quantity
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

ON_TIMEOUT = ("abort", "postcopy")
MIB, GIB = 2 ** 20, 2 ** 30
POLL_SECONDS = 0.5


def parse(policy, field="policy"):
    """The policy as the move uses it: bandwidth in MiB/s (libvirt's unit), max_downtime in ms, the timeout per
    GiB in seconds, on_timeout, auto_converge, max_parallel; None for what is not set."""
    policy = dict(policy or {})
    unknown = sorted(set(policy) - {"bandwidth", "max_downtime", "completion_timeout_per_gib", "on_timeout",
                                    "auto_converge", "max_parallel"})
    if unknown:
        raise ValidationError("unknown option %s" % ", ".join(unknown), field)
    parsed = {"bandwidth": None, "max_downtime": None, "completion_timeout_per_gib": None,
              "on_timeout": policy.get("on_timeout") or options.default(options.MACHINE_MIGRATE, "policy.on_timeout"),
              "auto_converge": bool(policy.get("auto_converge")),
              "max_parallel": None}
    if policy.get("bandwidth") not in (None, ""):
        value = str(policy["bandwidth"]).strip()
        value = value[:-2] if value.endswith("/s") else value
        number = parse_quantity(value, field + ".bandwidth")
        if number < MIB:
            raise ValidationError("%s per second is below libvirt's unit of 1Mi per second"
                                  % format_quantity(number), field + ".bandwidth")
        parsed["bandwidth"] = number // MIB
    for key in ("max_downtime", "completion_timeout_per_gib", "max_parallel"):
        value = policy.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValidationError("must be a whole number of at least 1", "%s.%s" % (field, key))
        parsed[key] = value
    if parsed["on_timeout"] not in ON_TIMEOUT:
        raise ValidationError("must be one of %s" % ", ".join(ON_TIMEOUT), field + ".on_timeout")
    return parsed


def timeout_seconds(policy, memory_bytes):
    """How long the move may take before on_timeout: completion_timeout_per_gib for each GiB of memory (a part of a
    GiB counts as its part, KubeVirt's way); None without a timeout."""
    per_gib = (policy or {}).get("completion_timeout_per_gib")
    if not per_gib:
        return None
    return max(1.0, per_gib * memory_bytes / float(GIB))


def flags(policy):
    """The migration flags the policy adds."""
    added = 0
    if (policy or {}).get("auto_converge"):
        added |= lv.libvirt.VIR_MIGRATE_AUTO_CONVERGE
    if (policy or {}).get("on_timeout") == "postcopy" and (policy or {}).get("completion_timeout_per_gib"):
        added |= lv.libvirt.VIR_MIGRATE_POSTCOPY
    return added


def params(policy):
    """The migration parameters the policy adds."""
    return {lv.libvirt.VIR_MIGRATE_PARAM_BANDWIDTH: policy["bandwidth"]} if (policy or {}).get("bandwidth") else {}


def progress_of(stats):
    """What a job's statistics say of a move's progress: data remaining, the dirty rate, the iteration."""
    shown = {}
    for key, name in (("data_remaining", "data_remaining"), ("memory_remaining", "memory_remaining"),
                      ("memory_dirty_rate", "dirty_rate"), ("memory_iteration", "iteration"),
                      ("memory_bps", "memory_bps"), ("auto_converge_throttle", "throttle")):
        if key in stats:
            shown[name] = int(stats[key])
    return shown


def message(machine, elapsed, timeout, shown):
    text = "moving %s: %ds" % (machine, elapsed)
    if timeout:
        text += " of %ds" % timeout
    if "data_remaining" in shown:
        text += ", %s left" % format_quantity(shown["data_remaining"])
    if "dirty_rate" in shown:
        # libvirt gives the dirty rate in pages per second
        text += ", %d pages/s dirtied" % shown["dirty_rate"]
    return text


class Watch:
    """Polls the source domain's job while the migration runs: writes progress (MACHINERY_PROGRESS_FILE), keeps
    the last statistics, and when the timeout is up aborts the job or starts post-copy, once."""

    def __init__(self, dom, machine, policy, memory_bytes, clock=time.monotonic):
        self.dom = dom
        self.machine = machine
        self.policy = policy or {}
        self.timeout = timeout_seconds(self.policy, memory_bytes)
        self.clock = clock
        self.started = clock()
        self.last = {}
        self.samples = 0
        self.timed_out = None  # "abort" or "postcopy" once the timeout was acted on
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join(5)

    def _run(self):
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.tick()
            except lv.libvirt.libvirtError:
                continue  # the job ended (or the domain left) between two polls

    def tick(self):
        stats = self.dom.jobStats(0)
        if stats.get("type", 0) == lv.libvirt.VIR_DOMAIN_JOB_NONE:
            return
        self.samples += 1
        self.last = progress_of(stats)
        elapsed = self.clock() - self.started
        _write_progress(message(self.machine, elapsed, self.timeout, self.last), self.last)
        if self.timeout and elapsed > self.timeout and self.timed_out is None:
            if self.policy.get("on_timeout") == "postcopy":
                self.timed_out = "postcopy"
                writer.write(self.dom, "migrateStartPostCopy", 0)
            else:
                self.timed_out = "abort"
                writer.write(self.dom, "abortJob")


def _write_progress(text, shown):
    path = os.environ.get(ENV)
    if not path:
        return
    partial = path + ".part"
    try:
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            handle.write(json.dumps(dict(shown, message=text)))
        os.replace(partial, path)
    except OSError:
        pass
