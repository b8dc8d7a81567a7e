# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes-style quantities (``512Mi``, ``16Gi``, ``1.5G``, plain bytes) as integers of bytes."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
DECIMAL = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}
MULTIPLIERS = dict(BINARY, **DECIMAL)

_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")


def parse_quantity(value, field="quantity", minimum=1):
    """Return ``value`` as a whole number of bytes.

    Booleans, negative numbers, exponents, whitespace anywhere (a trailing newline from a YAML block scalar
    included), unknown suffixes and fractions of a byte (``1.0000000001Gi``) are refused with an error naming
    ``field``.
    """
    if isinstance(value, bool) or value is None:
        raise ValidationError("expected a quantity such as 512Mi, 16Gi or 1.5G, got %r" % (value,), field)
    if isinstance(value, int):
        exact = Decimal(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError("expected a finite quantity, got %r" % (value,), field)
        exact = Decimal(repr(value))
    else:
        text = str(value)
        # fullmatch: ``$`` would let a trailing newline through while a trailing space is refused
        match = _QUANTITY.fullmatch(text)
        if not match:
            raise ValidationError(
                "%r is not a quantity: use a number of bytes or a number with one of the suffixes %s, with no "
                "spaces or line breaks around it" % (text, ", ".join(list(BINARY) + list(DECIMAL))), field)
        exact = Decimal(match.group("number")) * MULTIPLIERS.get(match.group("suffix"), 1)
    if exact != exact.to_integral_value():
        raise ValidationError("%r is not a whole number of bytes (%s); give a whole number of bytes or of a "
                              "larger unit" % (value, exact.normalize()), field)
    number = int(exact)
    if number < minimum:
        hint = ""
        if _bare_number(value) and number and number * BINARY["Mi"] >= minimum:
            hint = "; a number without a unit is bytes: for %d MiB write %dMi" % (number, number)
        raise ValidationError("%r is below the minimum of %s%s" % (value, format_quantity(minimum), hint), field)
    return number


def _bare_number(value):
    return isinstance(value, (int, float)) or (isinstance(value, str) and value.isdigit())


def format_quantity(number):
    """The shortest exact binary form of a byte count: 536870912 -> '512Mi', 1000 -> '1000'."""
    number = int(number)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = BINARY[suffix]
        if number and number % unit == 0:
            return "%d%s" % (number // unit, suffix)
    return str(number)


def mib_ceiling(number):
    """Round a byte count up to whole MiB (what libvirt keeps for a QEMU guest's memory)."""
    unit = BINARY["Mi"]
    return -(-int(number) // unit) * unit
