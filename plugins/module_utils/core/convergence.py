# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way every resource converges: observe -> plan -> apply -> observe again and verify.

A resource kind is a ``Resource``; it supplies:
- ``describe()``: what it is, for messages ("machine class small");
- ``observe()``: read libvirt once and return an observation (plain values and handles, nothing written);
- ``plan(observation)``: the desired spec against the observation, a ``Plan`` of ``Action`` s. It writes
  nothing and calls nothing that writes; the planning functions of each kind are pure and unit-tested alone;
- ``APPLY``: the table {action kind: method(resource, action, observation)} that carries out each kind of action
  through libvirt; ``apply`` dispatches through it, and a kind it does not name is a bug (``UnknownAction``);
- ``holds(plan, observation)``: the holds on the machines the plan changes (coordination/holds.py), or none for a
  kind that changes no machine. Every kind must say (it is abstract): ``converge`` is the one place that takes
  them, so no operation on a machine can forget to.

``converge`` runs them: in check mode it stops after planning, so ``changed``, ``diff`` and the returned actions
of a check-mode run are exactly those of the real run, and a plan with no action takes no hold (a converged
machine costs no registry write). Otherwise it takes the plan's holds, observes and plans again under them
(another run may have changed the machine before the hold was taken), and applies. After applying, it observes again and plans again: an
action left over means the apply did not do what the plan said, which is a bug, reported as such.
"""

from __future__ import annotations

import abc
import os
import signal

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConflictError, MachineryError, NotFoundError)


class ConvergenceError(MachineryError):
    """The resource still differs from its spec after the plan was applied (a bug in the collection)."""

    reason = "NotConverged"


# For race tests only: a run whose environment names a resource here (its ``describe()``, "machine set web")
# stops itself (SIGSTOP) once it holds what that resource's plan needs, before it observes again and applies.
# The test that started it learns it stopped from waitpid (WUNTRACED), starts a rival run while the holds are
# certainly taken, and lets it go on (SIGCONT): an overlap made, never hoped for. Unset, nothing stops.
STOP_HOLDING_ENV = "MACHINERY_STOP_HOLDING"
# Likewise for a move frozen at a known point: a move whose environment names one of its step kinds here
# ("copy_volume", "define", "delete_volume", "undefine", ...: fleets/move_plan.move_steps) stops itself before
# the first step of that kind, holding the machine on both pools, and checks its holds once let go.
STOP_BEFORE_STEP_ENV = "MACHINERY_STOP_BEFORE_STEP"


class UnknownAction(MachineryError):
    """A plan holds an action (or step) its resource has no method for (a bug in the collection)."""

    reason = "UnknownAction"


def dispatch(table, kind, owner):
    """The entry of ``table`` ({kind: function}) for ``kind``; a kind it lacks is a bug, reported as such."""
    try:
        return table[kind]
    except KeyError:
        raise UnknownAction("%s has no way to apply %r (it knows %s): this is a bug in machinery.compute, please "
                            "report it" % (owner, kind, ", ".join(sorted(table)) or "none")) from None


class Action:
    """One step of a plan: what is done (``kind``) to which object (``target``), the owned fields before and
    after, the libvirt operations it takes (``steps``), and whatever the apply needs (``data``)."""

    def __init__(self, kind, target, before=None, after=None, steps=(), fields=(), handler=None, **data):
        self.kind = kind
        # the entry of its resource's APPLY table: the kind, unless one public kind is carried out two ways
        self.handler = handler or kind
        self.target = target
        self.before = before or {}
        self.after = after or {}
        self.steps = list(steps)
        self.fields = list(fields)
        self.data = data

    @property
    def summary(self):
        """The short form returned in ``actions``: ``create``, ``start``, ``update cpu, memory``."""
        return "%s %s" % (self.kind, ", ".join(self.fields)) if self.fields else self.kind

    def as_dict(self):
        shown = {"action": self.kind, "target": self.target}
        if self.fields:
            shown["fields"] = list(self.fields)
        if self.before or self.after:
            shown.update(before=self.before, after=self.after)
        if self.steps:
            shown["steps"] = [dict(step) for step in self.steps]
        return shown

    def __repr__(self):
        return "Action(%s %s)" % (self.summary, self.target)


def step(operation, target, **detail):
    """One libvirt operation an action takes, as shown in the returned plan."""
    return dict({"action": operation, "target": target}, **detail)


class Plan:
    """An ordered list of actions, plus the warnings planning found (options that were not applied, ...)."""

    def __init__(self, actions=(), warnings=(), **facts):
        self.actions = list(actions)
        self.warnings = list(warnings)
        self.facts = facts  # what the plan predicts beyond actions, e.g. restart_required

    @property
    def changed(self):
        return bool(self.actions)

    def kinds(self):
        return [action.kind for action in self.actions]

    def find(self, kind):
        return next((action for action in self.actions if action.kind == kind), None)

    def summaries(self):
        return [action.summary for action in self.actions]

    def as_list(self):
        return [action.as_dict() for action in self.actions]

    def diff(self):
        """(before, after) of the owned fields over the whole plan: the first action's view of a field before,
        the last one's after."""
        before, after = {}, {}
        for action in self.actions:
            for key, value in action.before.items():
                before.setdefault(key, value)
            after.update(action.after)
        return before, after

    def __repr__(self):
        return "Plan(%s)" % ", ".join(self.summaries())


class Resource(abc.ABC):
    """What ``converge`` needs of a resource kind. A subclass writes ``describe``, ``observe`` and ``plan``, and
    declares ``APPLY``, {action kind: function(self, action, observation)}, after the methods it names:

        class ClassResource(Resource):
            def _publish(self, action, observed): ...
            def _withdraw(self, action, observed): ...
            APPLY = {"publish": _publish, "withdraw": _withdraw}
    """

    APPLY = {}

    @abc.abstractmethod
    def describe(self):
        """What the resource is, for messages: "machine class small"."""

    @abc.abstractmethod
    def observe(self):
        """Read libvirt (and the registry) once; write nothing. Returns the observation ``plan`` takes."""

    @abc.abstractmethod
    def plan(self, observed):
        """The ``Plan`` from the desired spec and ``observed``; pure."""

    def admit(self, plan, observed):
        """Refuse ``plan`` before any step when the pool cannot take it (no room): after each plan ``converge``
        applies, in check mode too. Reads, writes nothing in libvirt; nothing by default."""

    @abc.abstractmethod
    def holds(self, plan, observed):
        """The holds (coordination/holds.py ``MachineHold``, not taken yet) on every machine ``plan`` changes;
        empty for a kind that changes no machine. ``converge`` takes them before applying, in order of their
        ``key``, and gives them back when it is done."""

    def missing(self, exc):
        """What the run answers when observing or planning found something it names missing (``exc``, a
        NotFoundError): ``exc``, unless the kind knows better (a machine a move is taking off the pool)."""
        return exc

    def applier(self, kind):
        """The function of ``APPLY`` for an action ``kind``; UnknownAction when there is none."""
        return dispatch(self.APPLY, kind, self.describe())

    def apply(self, action, observed):
        """Carry out one action of the plan."""
        self.applier(action.handler)(self, action, observed)

    def interference(self, plan, leftover):
        """Why the object differs after ``plan`` was applied when another run changed it meanwhile, or None when
        nothing shows another run (then the difference left is a bug). See ``interference``."""
        return interference(plan, leftover)

    def apply_plan(self, plan, observed):
        """Carry out the plan's actions in order (a resource over many objects applies in waves of its own),
        noting each one done in ``self.done`` (which ``converge`` sets), checking before each one that this
        run still holds what it holds (``fence``)."""
        for action in plan.actions:
            self.fence(action.summary)
            self.apply(action, observed)
            self.note_done(action)

    def fence(self, before):
        """Stop (HoldLost) before ``before`` when a hold this run took was taken over; ``converge`` sets it."""

    def note_done(self, action):
        """Note ``action`` as carried out, for the report of a run that fails later."""
        done = getattr(self, "done", None)
        if done is not None:
            done.append(action)


def converge(resource, check_mode=False):
    """Observe, plan, and unless in check mode apply and verify. Returns (plan, final observation)."""
    try:
        observed = resource.observe()
        plan = resource.plan(observed)
        resource.admit(plan, observed)
    except NotFoundError as exc:
        answer = resource.missing(exc)
        if answer is exc:
            raise
        raise answer from exc
    if check_mode or not plan.actions:
        if not check_mode:
            _clear_dead_holds(resource)
        return plan, observed
    taken = []
    try:
        for hold in ordered(resource.holds(plan, observed)):
            taken.append(hold.acquire())
        if taken:
            resource.fence = lambda before: [hold.check(before) for hold in taken]
            stop_if_asked(resource)
        if taken:  # what was observed before the holds may have changed before they were taken
            observed = resource.observe()
            plan = resource.plan(observed)
            resource.admit(plan, observed)
            if not plan.actions:
                _clear_dead_holds(resource)
                return plan, observed
        done = _apply_and_verify(resource, plan, observed)
        # a run whose actions took no admission lock (an attach of a volume a killed run made) still clears what
        # killed runs of this controller left there
        _clear_dead_holds(resource)
        return done
    finally:
        for hold in reversed(taken):
            hold.release()


def stop_if_asked(resource):
    """Stop this process where STOP_HOLDING_ENV asks: after the holds on ``resource`` were taken."""
    if os.environ.get(STOP_HOLDING_ENV) == resource.describe():
        stop_here()


def step_to_stop_before():
    """The kind of step STOP_BEFORE_STEP_ENV asks a move to stop before, or None."""
    return os.environ.get(STOP_BEFORE_STEP_ENV) or None


def stop_here():
    os.kill(os.getpid(), signal.SIGSTOP)


def _clear_dead_holds(resource):
    """Every run that was not in check mode breaks the holds and the admission lock that killed runs of this
    controller left on its pool (PoolContext.clear_abandoned_lock, once per pool and run): a re-run that finds a
    killed run's work done, or finishes it without taking the lock, would otherwise leave them for the next one."""
    clear = getattr(getattr(resource, "ctx", None), "clear_abandoned_lock", None)
    if clear is not None:
        clear()


def ordered(holds):
    """``holds`` without repeats, in order of their keys (runs holding several machines take them alike)."""
    unique = {}
    for hold in holds:
        unique.setdefault(hold.key, hold)
    return [unique[key] for key in sorted(unique)]


def _apply_and_verify(resource, plan, observed):
    resource.done = []
    try:
        resource.apply_plan(plan, observed)
    except Exception as exc:  # a libvirtError too: the module reports it with what was done before it
        exc.done = [done_summary(action) for action in resource.done] + list(getattr(exc, "done", None) or [])
        raise
    observed = resource.observe()
    leftover = resource.plan(observed)
    if leftover.actions:
        other = resource.interference(plan, leftover)
        if other is not None:
            exc = ConflictError("%s was changed by another run while this run converged it: %s; this run's changes "
                                "were made, the other run's are in force now (%s left to do): run again once the "
                                "other run is done" % (resource.describe(), other, ", ".join(leftover.summaries())))
            exc.done = [done_summary(action) for action in plan.actions]
            raise exc
        exc = ConvergenceError("%s still differs after it was converged (%s): this is a bug in machinery.compute, "
                               "please report it" % (resource.describe(), ", ".join(leftover.summaries())))
        exc.done = [done_summary(action) for action in plan.actions]
        raise exc
    return plan, observed


def interference(plan, leftover):
    """How another run changed the object between this run's apply and its re-read, or None: a field the re-read
    shows with a value that is neither what this run found nor what it set (this run's write landed, then
    another one's). A field back at the value this run found cannot be told from this run's write not landing:
    that stays a bug."""
    found, written = plan.diff()
    changed = []
    for action in leftover.actions:
        for key, value in sorted(action.before.items()):
            if key in written and value != written[key] and value != found.get(key, written[key]):
                changed.append("%s is %s, this run set %s" % (key, _shown(value), _shown(written[key])))
    return "; ".join(changed) if changed else None


def _shown(value):
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def done_summary(action):
    """An action carried out, as a failure reports it: ``delete web-1 on pool2``."""
    pool = action.data.get("pool")
    return "%s %s%s" % (action.summary, action.target, " on %s" % pool if pool else "")


def with_done(message, done):
    """``message`` followed by what was done before the failure, if anything was."""
    if not done:
        return message
    return "%s (done before the failure, the rest is left to a re-run: %s)" % (message, "; ".join(done))
