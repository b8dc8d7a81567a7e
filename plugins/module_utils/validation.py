# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input checks that name the offending field; nothing reaches libvirt before they pass."""

from __future__ import annotations

import re

from ansible_collections.machinery.compute.plugins.module_utils.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.quantity import mib_ceiling, parse_quantity

MAX_CPU = 256
MIN_MEMORY = 16 * 2 ** 20
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_SHA256 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


def dns_label(value, field="name"):
    """A DNS-1123 label: lower case letters, digits and '-', 1 to 63 characters, alphanumeric at both ends."""
    if not isinstance(value, str) or not value:
        raise ValidationError("must be a non-empty string", field)
    if len(value) > 63:
        raise ValidationError("%r is %d characters long; a DNS-1123 label has at most 63" % (value, len(value)), field)
    if not _DNS1123_LABEL.match(value):
        raise ValidationError(
            "%r is not a DNS-1123 label (lower case letters, digits and '-', starting and ending with a letter "
            "or digit)" % (value,), field)
    return value


def cpu_count(value, field="cpu"):
    if isinstance(value, bool):
        raise ValidationError("must be a whole number of CPUs, got %r" % (value,), field)
    try:
        number = int(str(value), 10)
    except ValueError:
        raise ValidationError("must be a whole number of CPUs, got %r" % (value,), field) from None
    if number < 1 or number > MAX_CPU:
        raise ValidationError("must be between 1 and %d, got %d" % (MAX_CPU, number), field)
    return number


def memory_bytes(value, field="memory"):
    """Guest memory in bytes, rounded up to whole MiB: what libvirt keeps, so a re-read compares equal."""
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ValidationError("must be positive, got %r" % (value,), field)
    if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
        raise ValidationError("must be positive, got %r" % (value,), field)
    return mib_ceiling(parse_quantity(value, field=field, minimum=MIN_MEMORY))


def disk_bytes(value, field="size"):
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ValidationError("must be positive, got %r" % (value,), field)
    return parse_quantity(value, field=field, minimum=2 ** 20)


def labels(value, field="labels"):
    """Kubernetes label rules: keys with an optional DNS prefix, values up to 63 characters."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping of label keys to values", field)
    result = {}
    for key, item in value.items():
        key = str(key)
        item = "" if item is None else str(item)
        name = key.rsplit("/", 1)[-1]
        if len(name) > 63 or not _LABEL_KEY.match(key):
            raise ValidationError("%r is not a valid label key" % (key,), "%s.%s" % (field, key))
        if len(item) > 63 or not _LABEL_VALUE.match(item):
            raise ValidationError("%r is not a valid label value" % (item,), "%s.%s" % (field, key))
        result[key] = item
    return result


def mac_address(value, field="mac"):
    text = str(value).lower()
    if not _MAC.match(text):
        raise ValidationError("%r is not a MAC address like 52:54:00:12:34:56" % (value,), field)
    if int(text[:2], 16) & 1:
        raise ValidationError("%r is a multicast address; a NIC needs a unicast one" % (value,), field)
    return text


def sha256_checksum(value, field="image_checksum"):
    text = str(value).strip().lower()
    if not _SHA256.match(text):
        raise ValidationError("must be a sha256 checksum: 64 hex digits, optionally prefixed 'sha256:'", field)
    return text.split(":", 1)[-1]


def one_of(value, choices, field):
    if value not in choices:
        raise ValidationError("must be one of %s, got %r" % (", ".join(choices), value), field)
    return value
