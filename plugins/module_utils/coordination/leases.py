# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Leases: how a lock on a machine outlives a long operation and no dead holder (docs/concurrency.md, "Leases").

A holder renews its lease every third of it by growing its own generation of the lock by a block (``Renewer``).
A waiter never compares its clock with a host's file time: it notes when it last saw the lock change (its newest
generation, that generation's size, its markers) on its own monotonic clock (``Watch``), and takes the lease as
expired after a whole lease without a change.
"""

from __future__ import annotations

import threading
import time

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core.errors import MachineryError

LEASE_SECONDS = 90
LEASE_ENV = "MACHINERY_LEASE_SECONDS"  # shortens the lease, for tests
RENEWALS_PER_LEASE = 3
RENEWAL_BYTES = 512


def lease_seconds(text):
    """The lease LEASE_ENV asks for (a positive number of seconds), else LEASE_SECONDS."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return LEASE_SECONDS
    return value if value > 0 else LEASE_SECONDS


class Renewer:
    """The thread that renews a holder's lease while it works: ``renew()`` (locks.VolumeLock.renew, which grows
    the holder's own generation of the lock) every third of the lease. A renewal that fails is tried again at
    the next, until ``renew`` finds the hold lost; the holder's check (``VolumeLock.still_held``) says so too.

    It counts the lease on the monotonic clock and waits in short sleeps, not in a timed wait on an event: a timed
    wait ends at a deadline the kernel reads on its own clock, which a process whose clock is shifted (libfaketime,
    a controller in the tests five minutes off) never reaches, and its holds went unrenewed."""

    STEP = 0.1  # seconds between two looks at the time; stop() returns at once, the thread ends within one

    def __init__(self, renew, lease, name):
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(renew, lease), daemon=True, name=name)
        self._thread.start()

    def _renew(self, renew, lease):
        interval = lease / RENEWALS_PER_LEASE
        due = time.monotonic() + interval
        while not self._stop.is_set():
            time.sleep(min(self.STEP, interval))
            if self._stop.is_set() or time.monotonic() < due:
                continue
            due = time.monotonic() + interval
            try:
                if renew():
                    self.renewals += 1
            except (MachineryError, lv.libvirt.libvirtError):
                pass  # a renewal that failed is tried again at the next; the holder's check tells it where it is

    def stop(self):
        """Stop renewing, without waiting for the thread: a renewal under way may still end after this returns,
        and changes nothing once the lock is let go (VolumeLock.renew of a released lock does nothing; a resize
        of a generation already deleted fails)."""
        self._stop.set()


class Watch:
    """A waiter's view of one lease: when, on this process's monotonic clock (``clock``), the lock last looked
    different."""

    def __init__(self, lease, clock=time.monotonic):
        self.lease = lease
        self.clock = clock
        self._seen = None
        self._seen_at = None

    def note(self, state, markers):
        seen = (state, tuple(markers))
        if seen != self._seen:
            self._seen, self._seen_at = seen, self.clock()

    def unchanged_for(self):
        """Seconds since this waiter first saw the lock as it is now (0 before it looked)."""
        return 0.0 if self._seen_at is None else self.clock() - self._seen_at

    def expired(self):
        """Whether the holder has not renewed for a whole lease, as this waiter has watched it."""
        return self._seen_at is not None and self.clock() - self._seen_at > self.lease
