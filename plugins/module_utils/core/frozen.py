# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Values that cannot change once built: a machine's validated parameters and its normalized spec.

``FrozenDict`` and ``FrozenList`` are a dict and a list that refuse every change. They stay a dict and a list
for everything that reads them (equality with plain values, JSON, Ansible's return), so a spec read from a
record compares equal to one built here; what must differ is made as a new value (``dict(spec, key=...)``).
"""

from __future__ import annotations


def _refuse(self, *_args, **_kwargs):
    raise TypeError("a %s cannot change: build a new value instead" % type(self).__name__)


class FrozenDict(dict):
    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self):
        return self

    def __deepcopy__(self, _memo):
        return self

    def __reduce__(self):
        return FrozenDict, (dict(self),)

    def __hash__(self):
        return hash(tuple(sorted((key, _hashable(value)) for key, value in self.items())))


class FrozenList(list):
    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __copy__(self):
        return self

    def __deepcopy__(self, _memo):
        return self

    def __reduce__(self):
        return FrozenList, (list(self),)

    def __hash__(self):
        return hash(tuple(_hashable(value) for value in self))


def _hashable(value):
    return hash(value) if isinstance(value, (FrozenDict, FrozenList)) else value


def freeze(value):
    """A deep copy of ``value`` (dicts, lists, tuples, scalars) that refuses every change."""
    if isinstance(value, (FrozenDict, FrozenList)):
        return value
    if isinstance(value, dict):
        return FrozenDict((key, freeze(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(item) for item in value)
    return value


def thaw(value):
    """A plain, changeable deep copy of a frozen value."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value
