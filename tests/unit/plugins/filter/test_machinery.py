# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's filters as Jinja calls them: a quantity is any number of bytes from 0 up (an empty pool's free
memory, a reservation of nothing), and what is no quantity fails with the filter's name and the cause."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.machinery.compute.plugins.filter.machinery import FilterModule

FILTERS = FilterModule().filters()


@pytest.mark.parametrize("value, expected", [
    ("0", 0), (0, 0), ("0Mi", 0), ("1", 1), ("512Mi", 512 * 2 ** 20), ("1.5G", 1500000000), (2048, 2048),
])
def test_quantity(value, expected):
    assert FILTERS["quantity"](value) == expected


@pytest.mark.parametrize("value, cause", [
    ("-1", "is not a quantity"), (-1, "below the minimum of 0"), ("12Q", "is not a quantity"),
    ("", "is not a quantity"),
    (True, "expected a quantity"), (None, "expected a quantity"), ("0.5", "not a whole number of bytes"),
])
def test_quantity_refused(value, cause):
    with pytest.raises(AnsibleFilterError, match="^quantity: value: ") as raised:
        FILTERS["quantity"](value)
    assert cause in str(raised.value)


@pytest.mark.parametrize("value, expected", [(0, "0"), ("0", "0"), (536870912, "512Mi"), (1000, "1000")])
def test_to_quantity(value, expected):
    assert FILTERS["to_quantity"](value) == expected


def test_quantity_round_trip_of_zero():
    assert FILTERS["to_quantity"](FILTERS["quantity"]("0")) == "0"
