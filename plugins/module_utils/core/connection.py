# -*- coding: utf-8 -*-
# Copyright: contributors to machinery.compute
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One libvirt connection per run, opened once, with errors that say which URI failed and why."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from urllib.parse import parse_qs, urlsplit

from ansible_collections.machinery.compute.plugins.module_utils.core.errors import (
    ConnectionFailed, LibvirtFailure, ValidationError)
from ansible_collections.machinery.compute.plugins.module_utils.coordination import writer

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


# What libvirt reports when a remote host refuses a connection, and what to check then. libvirt's own words
# name the symptom (for TLS often only "Unable to read TLS confirmation"); the hint names the cause.
_REFUSALS = (
    (re.compile(r"host key verification failed|verify the session host key|ssh host key .* not accepted|"
                r"host key .*(mismatch|changed)", re.I),
     "the host's SSH key is not trusted: add it to the known_hosts file (the known_hosts URI parameter for "
     "qemu+libssh2 and qemu+libssh, the user's ~/.ssh/known_hosts for qemu+ssh), or set no_verify=1 on a network you trust"),
    (re.compile(r"permission denied \(publickey|access denied for 'publickey'|failed to authenticate|"
                r"username/publickey combination invalid", re.I),
     "the host refused the SSH key: check the keyfile URI parameter (or the ssh agent) and the host's "
     "authorized_keys"),
    (re.compile(r"unable to read tls confirmation", re.I),
     "the host closed the TLS session: it did not accept the client certificate (clientcert.pem in pkipath "
     "must be signed by a CA the host trusts)"),
    (re.compile(r"our own certificate .* failed validation", re.I),
     "clientcert.pem in pkipath is not signed by the cacert.pem beside it"),
    (re.compile(r"failed to verify peer's certificate|does not match the hostname", re.I),
     "the host's TLS certificate is not trusted: cacert.pem in pkipath must be the CA that signed it, and the "
     "certificate must name the host of the URI (or set no_verify=1)"),
    (re.compile(r"connection refused", re.I), "nothing listens at that address and port"),
    (re.compile(r"timed out|no route to host|network is unreachable", re.I), "the host does not answer"),
)


def refusal_hint(text):
    """The likely cause of a failed connection, from libvirt's message; None when it says nothing known."""
    for pattern, hint in _REFUSALS:
        if pattern.search(text or ""):
            return hint
    return None


def describe(exc):
    """The useful part of a libvirtError: its message without libvirt's trailing noise."""
    text = exc.get_error_message() if hasattr(exc, "get_error_message") else None
    return (text or str(exc)).strip()


# A TLS client identity given as three files of any name (what AWX's credential injectors write), made the
# directory of fixed names that libvirt's pkipath= wants. The directories live in one private directory per
# controller user (machinery-pki-<uid> in the temp dir), one per identity, named after the three paths: a run reuses
# the one an earlier run made, a new one appears whole (made aside, then renamed), and nothing is removed when a run
# ends, so a killed run orphans nothing. Each run removes the identities whose files are gone (an AWX job's
# credential files are removed after the job) and what a killed run left half made.
TLS_FILES = (("MACHINERY_TLS_CACERT", "cacert.pem"), ("MACHINERY_TLS_CLIENTCERT", "clientcert.pem"),
             ("MACHINERY_TLS_CLIENTKEY", "clientkey.pem"))
_PKI_DIRS = {}
_MAKING = ".making-"


def with_tls_identity(uri, environ=None):
    """``uri`` with ``pkipath=`` added when it is a qemu+tls URI that names none and MACHINERY_TLS_CACERT,
    _CLIENTCERT and _CLIENTKEY name the files: a private directory (mode 0700) links them under libvirt's names.
    Any other URI comes back as it is."""
    environ = os.environ if environ is None else environ
    parts = urlsplit(uri or "")
    if parts.scheme != "qemu+tls" or "pkipath" in parse_qs(parts.query):
        return uri
    files = tuple(environ.get(variable) or "" for variable, _name in TLS_FILES)
    if not all(files):
        return uri
    if files not in _PKI_DIRS:
        for (variable, _name), path in zip(TLS_FILES, files):
            if not os.path.isfile(path):
                raise ValidationError("%s names %s, which is not a file" % (variable, path), "uri")
        _PKI_DIRS[files] = pki_directory(tuple(os.path.abspath(path) for path in files))
    return "%s%spkipath=%s" % (uri, "&" if parts.query else "?", _PKI_DIRS[files])


def pki_root(temp=None):
    """The controller user's private directory of TLS identities; refused when someone else could write it."""
    root = os.path.join(temp or tempfile.gettempdir(), "machinery-pki-%d" % os.getuid())
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    status = os.lstat(root)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise ValidationError("%s must be a directory of this user that no one else can read or write (mode 0700); "
                              "remove it and run again" % root, "uri")
    return root


def pki_directory(paths, temp=None):
    """The directory linking ``paths`` (absolute: CA, client certificate, client key) under libvirt's names."""
    root = pki_root(temp)
    prune_pki(root)
    name = hashlib.sha256("\0".join(paths).encode()).hexdigest()[:20]
    directory = os.path.join(root, name)
    if os.path.isdir(directory):
        return directory
    making = tempfile.mkdtemp(prefix="%s%d-" % (_MAKING, os.getpid()), dir=root)
    for (_variable, link), path in zip(TLS_FILES, paths):
        os.symlink(path, os.path.join(making, link))
    try:
        os.rename(making, directory)
    except OSError:  # a concurrent run made the same one first: it links the same files
        shutil.rmtree(making, True)
    return directory


def prune_pki(root):
    """Remove the identities whose files are gone and what runs that died left half made."""
    for entry in os.listdir(root):
        path = os.path.join(root, entry)
        if entry.startswith(_MAKING):
            owner = entry[len(_MAKING):].split("-", 1)[0]
            if owner.isdigit() and not _alive(int(owner)):
                shutil.rmtree(path, True)
        elif os.path.isdir(path) and not all(os.path.exists(os.path.join(path, link)) for _v, link in TLS_FILES):
            shutil.rmtree(path, True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# A host that accepts the connection and never answers (a daemon stopped with SIGSTOP, a listener that hangs)
# would hold a run forever: the handshake gets OPEN_TIMEOUT seconds, and an open connection is closed by libvirt's
# keepalive when the host has not answered KEEPALIVE_INTERVAL * (KEEPALIVE_COUNT + 1) seconds, failing the call
# that waits on it. MACHINERY_CONNECT_TIMEOUT overrides the first (seconds).
OPEN_TIMEOUT = 30.0
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
_EVENTS = {"loop": None}
_EVENTS_LOCK = threading.Lock()


def open_timeout(environ=None):
    environ = os.environ if environ is None else environ
    try:
        value = float(environ.get("MACHINERY_CONNECT_TIMEOUT") or OPEN_TIMEOUT)
    except ValueError:
        raise ValidationError("MACHINERY_CONNECT_TIMEOUT must be a number of seconds, got %r"
                              % environ.get("MACHINERY_CONNECT_TIMEOUT"), "uri") from None
    return value if value > 0 else OPEN_TIMEOUT


def event_loop():
    """libvirt's default event loop, run by one daemon thread of this process: keepalive needs it."""
    with _EVENTS_LOCK:
        if _EVENTS["loop"] is None:
            libvirt.virEventRegisterDefaultImpl()

            def run():
                while True:
                    libvirt.virEventRunDefaultImpl()
            _EVENTS["loop"] = threading.Thread(target=run, name="libvirt-events", daemon=True)
            _EVENTS["loop"].start()
    return _EVENTS["loop"]


# qemu+ssh is the one transport that runs a program: libvirt starts the ssh client as a child of this process, and
# an open given up leaves it waiting for the host's greeting for good (one per run, its parent gone). The children
# of that open are found by their command line (the URI's host, port and socket), ended when it is given up, and
# waited for: SIGTERM, then SIGKILL after CHILD_EXIT_SECONDS.
CHILD_EXIT_SECONDS = 2.0


def _children():
    """{pid: argv} of this process's child processes, read from /proc ({} where there is no /proc)."""
    me, found = os.getpid(), {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                status = handle.read()
            if int(status[status.rindex(")") + 2:].split()[1]) != me:
                continue
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                found[int(entry)] = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return found


def spawns_client(uri):
    return urlsplit(uri or "").scheme == "qemu+ssh"


def ssh_children(uri, children):
    """The pids of ``children`` ({pid: argv}) that are libvirt's ssh client for ``uri``: the program the URI
    names (``command=``, else ssh), its host, its port (``-p``) and the socket the remote side connects to."""
    parts = urlsplit(uri)
    query = parse_qs(parts.query)
    program = os.path.basename((query.get("command") or ["ssh"])[0])
    socket_path = (query.get("socket") or [None])[0]
    found = []
    for pid, argv in children.items():
        if not argv or os.path.basename(argv[0]) != program or parts.hostname not in argv:
            continue
        if parts.port is not None and ["-p", str(parts.port)] not in [argv[i:i + 2] for i in range(len(argv) - 1)]:
            continue
        if socket_path and not any(socket_path in arg for arg in argv):
            continue
        found.append(pid)
    return sorted(found)


def _gone(pid):
    """Whether ``pid`` has exited (a zombie waiting for libvirt to reap it counts)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            status = handle.read()
    except OSError:
        return True
    return status[status.rindex(")") + 2:].split()[0] in ("Z", "X")


def end_children(pids, grace=CHILD_EXIT_SECONDS):
    """SIGTERM to ``pids``, SIGKILL to those still running after ``grace`` seconds; returns once they are gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass  # ended already
        deadline = time.monotonic() + grace
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling /proc: the signal is delivered asynchronously
        pids = [pid for pid in pids if not _gone(pid)]
        if not pids:
            return


def _open_bounded(uri, timeout):
    """libvirt.open in a thread of its own, given up after ``timeout`` seconds (the thread is left to the host:
    libvirt offers no way to abort a handshake, but the ssh client a qemu+ssh open started is ended, and the
    thread then fails). Returns the connection, or raises its libvirtError or TimeoutError."""
    outcome = {}
    before = _children() if spawns_client(uri) else {}

    def attempt():
        try:
            outcome["conn"] = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            outcome["error"] = exc
    worker = threading.Thread(target=attempt, name="libvirt-open", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        if spawns_client(uri):
            started = {pid: argv for pid, argv in _children().items() if pid not in before}
            end_children(ssh_children(uri, started))
        raise TimeoutError()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("conn")


# Where libvirt looks for a TLS client's files when the URI names no pkipath and the client runs as root.
DEFAULT_TLS_FILES = {"cacert.pem": "/etc/pki/CA/cacert.pem", "clientcert.pem": "/etc/pki/libvirt/clientcert.pem",
                     "clientkey.pem": "/etc/pki/libvirt/private/clientkey.pem"}


def missing_tls_files(uri):
    """The files of a qemu+tls client identity that are not there, as paths; [] for any other URI.

    libvirt connects without a client certificate when the certificate or its key is missing, and the host
    then refuses the session, which reads like a certificate of the wrong CA; naming the missing file says
    what is really wrong."""
    parts = urlsplit(uri or "")
    if parts.scheme != "qemu+tls":
        return []
    directory = (parse_qs(parts.query).get("pkipath") or [None])[0]
    if directory:
        paths = [os.path.join(directory, name) for name in DEFAULT_TLS_FILES]
    elif os.geteuid() == 0:
        paths = list(DEFAULT_TLS_FILES.values())
    else:
        return []  # a user's own ~/.pki/libvirt falls back to the system's files: too many places to guess
    return [path for path in paths if not os.path.isfile(path)]


# A pool that could not be opened is not opened again by the same run: a host that never answers costs the whole
# handshake bound each time, and a run checking a name on every pool for each machine it creates (a set's creates)
# paid it once per machine. A module's process is one run, so the module base turns this on; plugins do not,
# as their process (ansible-playbook) may outlive the pool's outage and read the pools again.
_FAILED_OPENS = {}  # uri -> the cause of its failed open, without the field
_FAILED_LOCK = threading.Lock()
_REMEMBER = {"failed_opens": False}


def remember_failed_opens(enabled=True):
    """Whether an open that failed is failed again at once, for the rest of the process, instead of retried."""
    _REMEMBER["failed_opens"] = enabled
    if not enabled:
        with _FAILED_LOCK:
            _FAILED_OPENS.clear()


def open_connection(uri, field="uri", name=None):
    """Open ``uri`` read-write; an unreachable or wrong URI becomes ConnectionFailed naming the pool (``name``,
    when the caller knows it, and the URI), libvirt's cause and, for the usual refusals, what to check. A host
    that does not answer fails the open after open_timeout() seconds, and a connection whose host stops
    answering later is closed by keepalive. With remember_failed_opens, a URI that failed once fails again at
    once with the same cause."""
    validate_uri(uri, field)
    require_libvirt()
    if _REMEMBER["failed_opens"]:
        with _FAILED_LOCK:
            cause = _FAILED_OPENS.get(uri)
        if cause is not None:
            raise ConnectionFailed("%s (so found earlier in this run: not tried again)" % cause, field)
    try:
        return _open(uri, field, name)
    except ConnectionFailed as exc:
        if _REMEMBER["failed_opens"]:
            with _FAILED_LOCK:
                _FAILED_OPENS.setdefault(uri, exc.message)
        raise


def _open(uri, field, name):
    event_loop()
    where = "pool %s (%s)" % (name, uri) if name and name != uri else uri
    timeout = open_timeout()
    target = with_tls_identity(uri)
    try:
        conn = _open_bounded(target, timeout)
    except TimeoutError:
        raise ConnectionFailed("cannot connect to %s: the host did not answer within %gs (a daemon that is stopped "
                               "or hangs)" % (where, timeout), field) from None
    except libvirt.libvirtError as exc:
        cause = " ".join(describe(exc).split())  # one line: ssh's stderr can span several
        missing = missing_tls_files(target)
        if missing:
            hint = ("%s %s missing, so libvirt offered no client certificate; a pkipath directory holds "
                    "cacert.pem, clientcert.pem and clientkey.pem"
                    % (" and ".join(missing), "is" if len(missing) == 1 else "are"))
        else:
            hint = refusal_hint(cause)
        raise ConnectionFailed("cannot connect to %s: %s%s" % (where, cause, "; " + hint if hint else ""),
                               field) from None
    if conn is None:
        raise ConnectionFailed("cannot connect to %s" % where, field)
    try:
        conn.setKeepAlive(KEEPALIVE_INTERVAL, KEEPALIVE_COUNT)
    except libvirt.libvirtError:
        pass  # a driver without keepalive (the test driver, a local session): nothing to stop answering
    return conn


class Connection:
    """A context manager around one libvirt connection; the same object is shared by every step of a run."""

    def __init__(self, uri, field="uri", name=None):
        self.uri = uri
        self.field = field
        self.name = name
        self.conn = None

    def __enter__(self):
        self.conn = open_connection(self.uri, self.field, self.name)
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
            writer.write(obj, "undefine")
        except libvirt.libvirtError:
            pass
        raise


def undefine_domain(dom, name):
    """Undefine a domain with its managed save image, NVRAM and snapshot and checkpoint metadata; one already gone
    (another run undefined it meanwhile) is no failure."""
    flags = (libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA |
             libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
    try:
        writer.write(dom, "undefineFlags", flags)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise LibvirtFailure("cannot undefine %s: %s" % (name, describe(exc))) from None


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
