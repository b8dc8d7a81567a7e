# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input checks that name the offending field; nothing reaches libvirt before they pass."""

from __future__ import annotations

import decimal
import ipaddress
import math
import re
import struct

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import ValidationError
from ansible_collections.machinery.compute.plugins.module_utils.core.quantity import mib_ceiling, parse_quantity

MAX_CPU = 256
MIN_MEMORY = 16 * 2 ** 20
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_SHA256 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")
_DEVICE = re.compile(r"^(vd|sd)[a-z]{1,2}$")
DEVICE_PREFIX = {"virtio": "vd", "scsi": "sd", "sata": "sd"}
# A Linux interface name (IFNAMSIZ - 1 bytes, no '/', ':' or white space), as a host bridge is named.
_INTERFACE = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.]{0,14}$")


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


def class_name(value, field="machine_class"):
    """A machine class name: a Kubernetes object name, a DNS-1123 subdomain (lower case letters, digits, '-'
    and '.', at most 253 characters, each dot-separated part starting and ending with a letter or digit), so a
    cloud instance type such as ``t3.medium`` is a class name as it is written."""
    if not isinstance(value, str) or not value:
        raise ValidationError("must be a non-empty string", field)
    if len(value) > 253:
        raise ValidationError("%r is %d characters long; a DNS-1123 subdomain has at most 253" % (value, len(value)),
                              field)
    if not all(_DNS1123_LABEL.match(part) for part in value.split(".")):
        raise ValidationError(
            "%r is not a DNS-1123 subdomain (lower case letters, digits, '-' and '.', each part starting and "
            "ending with a letter or digit)" % (value,), field)
    return value


def hostname(value, field="hostname"):
    """An RFC 1123 host name: DNS-1123 labels joined by dots, at most 253 characters (a guest's hostname)."""
    if not isinstance(value, str) or not value:
        raise ValidationError("must be a non-empty string", field)
    if len(value) > 253:
        raise ValidationError("%r is %d characters long; a host name has at most 253" % (value, len(value)), field)
    for label in value.split("."):
        if len(label) > 63 or not _DNS1123_LABEL.match(label):
            raise ValidationError("%r is not a host name (DNS-1123 labels joined by dots)" % (value,), field)
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


MIN_CPU_MILLIS = 10  # 10m: libvirt's smallest CFS quota, 1000 µs, of the 100000 µs period a fraction gets


def cpu_amount(value, field="cpu"):
    """CPUs as machine_class, machine and IronCore classes take them: a whole number of vCPUs (``2``, ``"2"``,
    ``2000m``: an int, as ever), or a fraction given as millicores or a decimal (``500m``, ``0.5``, ``1.5``: a
    float of at most three decimals), which is a CFS quota on the vCPUs it rounds up to (domain.write_cpu)."""
    if isinstance(value, bool) or value is None:
        raise ValidationError("must be a number of CPUs (2, 500m, 0.5), got %r" % (value,), field)
    if isinstance(value, int):
        return cpu_count(value, field)
    text = str(value).strip()
    try:
        millis = decimal.Decimal(text[:-1]) if text.endswith("m") else decimal.Decimal(text) * 1000
    except decimal.InvalidOperation:
        raise ValidationError("must be a number of CPUs: whole (2), millicores (500m) or a decimal (0.5), got %r"
                              % (value,), field) from None
    if not millis.is_finite() or millis != millis.to_integral_value():
        raise ValidationError("%r is finer than a millicore (1m, 0.001): the smallest step of a CPU here" % (value,),
                              field)
    if abs(millis) > 10 ** 9:  # no machine of that many CPUs (and no remainder worth computing)
        raise ValidationError("must be between 1 and %d, got %r" % (MAX_CPU, value), field)
    millis = int(millis)
    if millis % 1000 == 0:
        return cpu_count(millis // 1000, field)
    if millis < MIN_CPU_MILLIS or millis > MAX_CPU * 1000:
        raise ValidationError("must be between %dm and %d, got %r" % (MIN_CPU_MILLIS, MAX_CPU, value), field)
    return millis / 1000.0


def vcpus(cpu):
    """The vCPUs of a machine of ``cpu`` CPUs: a fraction rounds up (500m: one vCPU, 1500m: two)."""
    return None if cpu is None else int(math.ceil(cpu))


def cpu_text(cpu):
    """``cpu`` as written back: a whole number as it is, a fraction in millicores (``500m``)."""
    if isinstance(cpu, float) and cpu != int(cpu):
        return "%dm" % int(round(cpu * 1000))
    return str(int(cpu)) if isinstance(cpu, float) else str(cpu)


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


def label_key(key, field):
    """A Kubernetes label key: an optional DNS prefix and '/', then a name of up to 63 characters."""
    if not isinstance(key, str):
        raise ValidationError("keys must be strings, got %r (%s)" % (key, type(key).__name__), field)
    prefix, _slash, name = key.rpartition("/")
    if len(name) > 63 or len(prefix) > 253 or not _LABEL_KEY.match(key):
        raise ValidationError("%r is not a valid key (letters, digits, '-', '_' and '.', up to 63 characters, "
                              "alphanumeric at both ends, optionally after a DNS prefix and '/')" % (key,), field)
    return key


def label_value(value, field):
    """A Kubernetes label value: a string of up to 63 characters (empty allowed; null means empty).

    Anything but a string is refused rather than stringified: YAML reads ``true`` as a boolean and ``1.10`` as
    the number 1.1, so the stored value would not be what the user wrote."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError("values must be strings, got %r (%s); quote it" % (value, type(value).__name__),
                              field)
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValidationError("%r is not a valid value (letters, digits, '-', '_' and '.', up to 63 characters, "
                              "alphanumeric at both ends)" % (value,), field)
    return value


def labels(value, field="labels"):
    """Kubernetes label rules for a mapping of labels (or a selector of them); errors name the key."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError("must be a mapping of label keys to values", field)
    result = {}
    for key, item in value.items():
        where = "%s.%s" % (field, key)
        result[label_key(key, where)] = label_value(item, where)
    return result


def whole_number(value, field, minimum=None, maximum=None):
    """An integer within [minimum, maximum] (either bound optional); a boolean is no number."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise ValidationError("must be a whole number, got %r" % (value,), field) from None
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        if maximum is None:
            raise ValidationError("must be at least %d, got %d" % (minimum, value), field)
        raise ValidationError("must be between %d and %d, got %d" % (minimum, maximum, value), field)
    return value


def timeout_seconds(value, field, allow_zero=False):
    """Seconds to wait: positive (0 only where it means 'do not wait'); never a silent default."""
    return whole_number(value, field, minimum=0 if allow_zero else 1)


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


def device_name(value, bus, field="device"):
    """A disk target such as vdb (virtio) or sdb (scsi, sata): the prefix must be the bus's."""
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise ValidationError("%r is not a device name such as vdb or sdb" % (value,), field)
    if not value.startswith(DEVICE_PREFIX[bus]):
        raise ValidationError("%s does not fit bus %s, whose devices are named %s*"
                              % (value, bus, DEVICE_PREFIX[bus]), field)
    return value


# --- OS images ---------------------------------------------------------------------------------------------------

QCOW2_MAGIC = b"QFI\xfb"
SECTOR = 512
# What makes a raw file a plausible disk: a boot sector (an MBR, or the protective MBR before a GPT), a GPT
# header, or a file system written straight onto the device. (offset, magic, what)
RAW_SIGNATURES = (
    (510, b"\x55\xaa", "an MBR boot signature"),
    (512, b"EFI PART", "a GPT header"),
    (1080, b"\x53\xef", "an ext2/3/4 superblock"),
    (0, b"XFSB", "an XFS superblock"),
    (0, b"hsqs", "a squashfs superblock"),
    (0x8001, b"CD001", "an ISO 9660 volume descriptor"),
    (0x10040, b"_BHRfS_M", "a btrfs superblock"),
)
# Image formats libvirt could be told to use but this collection does not: refused by name.
OTHER_FORMATS = (
    (0, b"KDMV", "VMDK"),
    (0, b"vhdxfile", "VHDX"),
    (0, b"conectix", "VHD"),
    (0, b"QED\x00", "QED"),
    (64, b"\x7f\x10\xda\xbe", "VDI"),
)
IMAGE_HEADER_BYTES = max(offset + len(magic) for offset, magic, _what in RAW_SIGNATURES + OTHER_FORMATS)


def _at(header, offset, magic):
    return header[offset:offset + len(magic)] == magic


def _qcow2_header(header, field):
    """The checks qemu makes when it opens a qcow2 image, plus the two this collection cannot serve: a backing
    file (its path would not exist on the pool) and encryption (it has no key to give)."""
    if len(header) < 72:
        raise ValidationError("has a qcow2 signature but no complete qcow2 header (a cut-off download?)", field)
    version, backing_offset = struct.unpack(">IQ", header[4:16])
    cluster_bits, virtual_size, crypt_method = struct.unpack(">IQI", header[20:36])
    if version not in (2, 3):
        raise ValidationError("is a qcow2 image of version %d; qemu reads versions 2 and 3" % version, field)
    if not 9 <= cluster_bits <= 21 or virtual_size == 0:
        raise ValidationError("has a qcow2 signature but a corrupt header (cluster bits %d, size %d)"
                              % (cluster_bits, virtual_size), field)
    if backing_offset:
        raise ValidationError("is a qcow2 overlay with a backing file; give a standalone image "
                              "(qemu-img convert -O qcow2 overlay.qcow2 standalone.qcow2)", field)
    if crypt_method:
        raise ValidationError("is an encrypted qcow2 image; give an unencrypted one", field)
    return "qcow2"


def disk_image(header, size, field="image"):
    """'qcow2' or 'raw' for an OS image whose first IMAGE_HEADER_BYTES are ``header`` and whose file is
    ``size`` bytes long; anything else is refused.

    A qcow2 image is recognized by its signature and a sane header. Raw has no signature, so a raw image must
    look like a disk: a whole number of 512-byte sectors that starts with a partition table (an MBR boot
    signature, which a GPT disk also carries in its protective MBR, or a GPT header) or with a file system (ext,
    XFS, btrfs, squashfs, ISO 9660). Random data passes both tests about once in 30,000 tries, a text file,
    archive or kernel never does: such a file would boot nothing and only be found out when the machine hangs.
    """
    if _at(header, 0, QCOW2_MAGIC):
        return _qcow2_header(header, field)
    for offset, magic, what in OTHER_FORMATS:
        if _at(header, offset, magic):
            raise ValidationError("is a %s image; convert it to qcow2 (qemu-img convert -O qcow2)" % what, field)
    if size == 0 or size % SECTOR:
        raise ValidationError("is neither a qcow2 image nor a raw disk: a raw disk is a whole number of %d-byte "
                              "sectors, this file has %d bytes" % (SECTOR, size), field)
    if any(_at(header, offset, magic) for offset, magic, _what in RAW_SIGNATURES):
        return "raw"
    raise ValidationError("is neither a qcow2 image nor a raw disk: it has no partition table (MBR or GPT) and "
                          "no file system at its start", field)


# --- networks ---------------------------------------------------------------------------------------------------

# Ranges no guest network may overlap: the host's own loopback, link-local (cloud metadata, APIPA), multicast,
# "this network" and the reserved class E.
RESERVED_RANGES = tuple((ipaddress.IPv4Network(cidr), what) for cidr, what in (
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link-local"), ("224.0.0.0/4", "multicast"),
    ("0.0.0.0/8", "'this network'"), ("240.0.0.0/4", "reserved")))


def network_cidr(value, field="cidr"):
    """An IPv4 subnet a pool network can use: written exactly (no host bits), at least a /28 (a gateway and
    some DHCP addresses), and outside the ranges no guest network may take."""
    if not isinstance(value, str):
        raise ValidationError("must be an IPv4 subnet such as 192.168.100.0/24, got %r" % (value,), field)
    if ":" in value:
        raise ValidationError("%s is an IPv6 subnet; pool networks are IPv4 (such as 192.168.100.0/24)" % value,
                              field)
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as exc:
        raise ValidationError("%s (an IPv4 subnet such as 192.168.100.0/24)" % exc, field) from None
    if net.num_addresses < 16:
        raise ValidationError("%s is too small: a network needs at least a /28" % net, field)
    for reserved, what in RESERVED_RANGES:
        if net.overlaps(reserved):
            raise ValidationError("%s overlaps the %s range %s, which no guest network may use"
                                  % (net, what, reserved), field)
    return net


def interface_name(value, field):
    """A host interface name such as br0: what Linux accepts as a network device name."""
    if not isinstance(value, str) or not _INTERFACE.match(value) or value in (".", ".."):
        raise ValidationError("%r is not a host interface name (up to 15 letters, digits, '-', '_' or '.')"
                              % (value,), field)
    return value
