# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one exception family of the core: modules turn it into fail_json, plugins into AnsibleError."""

from __future__ import annotations


class MachineryError(Exception):
    """A failure with a one-line cause; ``field`` names the offending option when there is one."""

    reason = "Error"

    def __init__(self, message, field=None):
        super().__init__(message)
        self.message = message
        self.field = field
        # what the failed run had done before it failed (short forms of its actions, each with its target), so
        # the module can say it and report changed: converge fills it in
        self.done = []

    def __str__(self):
        if self.field:
            return "%s: %s" % (self.field, self.message)
        return self.message


class ValidationError(MachineryError):
    reason = "Invalid"


class NotFoundError(MachineryError):
    reason = "NotFound"


class ConflictError(MachineryError):
    reason = "Conflict"


class HoldLost(ConflictError):
    """This run's hold was taken over by another run (it was paused past its lease): it stops before its next
    step that changes anything, and leaves what it did to the run that holds the object now."""


class NameTaken(ConflictError):
    """Another pool already has a machine of this name (a concurrent run created it there first)."""


class ConnectionFailed(MachineryError):
    reason = "Unreachable"


class PoolFull(MachineryError):
    """Admission refused: the pool has no room left (another run may have taken it)."""

    reason = "PoolFull"


class LibvirtFailure(MachineryError):
    reason = "LibvirtError"
