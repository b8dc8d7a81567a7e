# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One libvirt connection per run, opened once, with errors that say which URI failed and why."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ansible_collections.machinery.compute.plugins.module_utils.errors import (
    ConnectionFailed, LibvirtFailure, ValidationError)

try:
    import libvirt
    HAS_LIBVIRT = True
    LIBVIRT_IMPORT_ERROR = None
except ImportError as exc:  # reported by the callers with a pointer to libvirt-python
    libvirt = None
    HAS_LIBVIRT = False
    LIBVIRT_IMPORT_ERROR = exc

_URI = re.compile(r"^[a-z][a-z0-9+]*://[^\s]*$")
# The transports libvirt offers for its QEMU driver, and its test driver (a fake host kept in memory).
SCHEMES = ("qemu", "qemu+ssh", "qemu+tls", "qemu+unix", "qemu+tcp", "qemu+libssh", "qemu+libssh2", "test")
QEMU_PATHS = ("/system", "/session")


def _quiet(_context, _error):
    """libvirt prints every error to stderr by default; ours are raised as exceptions instead."""


def require_libvirt():
    if not HAS_LIBVIRT:
        raise LibvirtFailure("the libvirt Python binding is missing (pip install libvirt-python): %s"
                             % LIBVIRT_IMPORT_ERROR)
    libvirt.registerErrorHandler(_quiet, None)


def validate_uri(uri, field="uri"):
    """A libvirt URI of a QEMU host (or libvirt's test driver), refused up front when libvirt could only fail
    to connect to it: an unknown scheme would otherwise be reported as a failed connection to the local socket."""
    if not isinstance(uri, str) or not _URI.match(uri):
        raise ValidationError("%r is not a libvirt URI such as qemu:///system or qemu+ssh://root@host/system"
                              % (uri,), field)
    scheme = uri.split("://", 1)[0]
    if scheme not in SCHEMES:
        raise ValidationError("%r: scheme %s is not supported; use one of %s"
                              % (uri, scheme, ", ".join(item + "://" for item in SCHEMES)), field)
    path = urlsplit(uri).path
    if scheme != "test" and path not in QEMU_PATHS:
        raise ValidationError("%r: a QEMU URI names the daemon as %s, not %r (for example qemu+ssh://root@host/system)"
                              % (uri, " or ".join(QEMU_PATHS), path), field)
    return uri


def describe(exc):
    """The useful part of a libvirtError: its message without libvirt's trailing noise."""
    text = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    return (text or str(exc)).strip()


def open_connection(uri, field="uri"):
    """Open ``uri`` read-write; an unreachable or wrong URI becomes ConnectionFailed naming the URI."""
    validate_uri(uri, field)
    require_libvirt()
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise ConnectionFailed("cannot connect to %s: %s" % (uri, describe(exc)), field) from None
    if conn is None:
        raise ConnectionFailed("cannot connect to %s" % uri, field)
    return conn


class Connection:
    """A context manager around one libvirt connection; the same object is shared by every step of a run."""

    def __init__(self, uri, field="uri"):
        self.uri = uri
        self.field = field
        self.conn = None

    def __enter__(self):
        self.conn = open_connection(self.uri, self.field)
        return self.conn

    def __exit__(self, *exc_info):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # closing a broken connection must not hide the real error
                pass
            self.conn = None
        return False


def start_or_undefine(obj, *starts):
    """Call each of ``starts`` on a just-defined libvirt object (network, storage pool); when one fails, the
    definition is removed again, so a refused object is not left behind half made. Raises the libvirtError."""
    try:
        for start in starts:
            start()
    except libvirt.libvirtError:
        try:
            obj.undefine()
        except libvirt.libvirtError:
            pass
        raise


def _lookup(find, name, missing_code, what):
    """``find(name)``, or None when libvirt says there is no such object; other errors are raised."""
    try:
        return find(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == missing_code:
            return None
        raise LibvirtFailure("cannot look up %s %s: %s" % (what, name, describe(exc))) from None


def lookup_domain(conn, name):
    return _lookup(conn.lookupByName, name, libvirt.VIR_ERR_NO_DOMAIN, "domain")


def lookup_network(conn, name):
    return _lookup(conn.networkLookupByName, name, libvirt.VIR_ERR_NO_NETWORK, "network")


def lookup_storage_pool(conn, name):
    return _lookup(conn.storagePoolLookupByName, name, libvirt.VIR_ERR_NO_STORAGE_POOL, "storage pool")


def lookup_volume(pool, name):
    return _lookup(pool.storageVolLookupByName, name, libvirt.VIR_ERR_NO_STORAGE_VOL, "volume")
