# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes-style quantities (``512Mi``, ``16Gi``, ``1.5G``, plain bytes) as integers of bytes."""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError

BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
DECIMAL = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18}
MULTIPLIERS = dict(BINARY, **DECIMAL)

_QUANTITY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def parse_quantity(value, field="quantity", minimum=1):
    """Return ``value`` as a whole number of bytes; fractions of a byte round up.

    Booleans, negative numbers, exponents, spaces and unknown suffixes are refused with an error naming ``field``.
    """
    if isinstance(value, bool) or value is None:
        raise ValidationError("expected a quantity such as 512Mi, 16Gi or 1.5G, got %r" % (value,), field)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError("expected a finite quantity, got %r" % (value,), field)
        number = int(Decimal(repr(value)).to_integral_value(rounding=ROUND_CEILING))
    else:
        text = str(value)
        match = _QUANTITY.match(text)
        if not match:
            raise ValidationError(
                "%r is not a quantity: use a number of bytes or a number with one of the suffixes %s"
                % (text, ", ".join(list(BINARY) + list(DECIMAL))), field)
        scaled = Decimal(match.group("number")) * MULTIPLIERS.get(match.group("suffix"), 1)
        number = int(scaled.to_integral_value(rounding=ROUND_CEILING))
    if number < minimum:
        raise ValidationError("%r is below the minimum of %s" % (value, format_quantity(minimum)), field)
    return number


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
