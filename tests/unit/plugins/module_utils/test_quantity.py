import pytest
from hypothesis import given, strategies as st

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import (
    format_quantity, mib_ceiling, parse_quantity)

from conftest import refused


@pytest.mark.parametrize("text,expected", [
    ("512Mi", 512 * 2 ** 20),
    ("16Gi", 16 * 2 ** 30),
    ("1.5G", 1500000000),
    ("1.5Gi", 3 * 2 ** 29),
    ("1k", 1000),
    ("2Ki", 2048),
    ("1024", 1024),
    (1024, 1024),
    ("0.5Ki", 512),
    ("1.5k", 1500),
    (2048.0, 2048),
])
def test_parse(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["16Gx", "", " 1Gi", "1Gi ", "-1", "1e9", "Gi", "1.Gi", "1,5G", "0x10", "1KI",
                                  "1 Gi", True, None, "1gi", "5Gi\n", "\n5Gi", "5Gi\t", "5Gi\r\n"])
def test_reject(text):
    refused("memory", parse_quantity, text, field="memory")


@pytest.mark.parametrize("value", ["1.0000000001Gi", "1.0001k", "0.5", 0.5, "1.1"])
def test_fractions_of_a_byte_are_refused(value):
    with pytest.raises(ValidationError, match="not a whole number of bytes") as info:
        parse_quantity(value, field="root_size")
    assert info.value.field == "root_size"


@pytest.mark.parametrize("value", [256, "256"])
def test_a_bare_number_below_the_minimum_says_it_is_bytes(value):
    with pytest.raises(ValidationError, match="below the minimum of 16Mi; a number without a unit is bytes: for "
                                              "256 MiB write 256Mi"):
        parse_quantity(value, field="memory", minimum=16 * 2 ** 20)


def test_zero_is_below_minimum():
    with pytest.raises(ValidationError, match="below the minimum"):
        parse_quantity("0", field="memory")


def test_format():
    assert format_quantity(512 * 2 ** 20) == "512Mi"
    assert format_quantity(2 ** 30) == "1Gi"
    assert format_quantity(1000) == "1000"
    assert format_quantity(0) == "0"


def test_mib_ceiling():
    assert mib_ceiling(1) == 2 ** 20
    assert mib_ceiling(2 ** 20) == 2 ** 20


@given(st.integers(min_value=1, max_value=2 ** 62))
def test_format_parse_round_trip(number):
    assert parse_quantity(format_quantity(number)) == number
