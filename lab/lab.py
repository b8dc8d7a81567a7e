"""Local libvirt lab: N isolated libvirtd "hosts" on one machine.

Every pool host (pool1, pool2, ...) is a monolithic ``libvirtd`` running in
its own mount and network namespace.  Inside the mount namespace the usual
libvirt directories are bind mounts of directories below ``<dir>/<pool>/``::

    /run/libvirt        <- <dir>/<pool>/run
    /var/lib/libvirt    <- <dir>/<pool>/lib
    /etc/libvirt        <- <dir>/<pool>/etc
    /var/log/libvirt    <- <dir>/<pool>/log
    /var/cache/libvirt  <- <dir>/<pool>/cache

and, when the machine has swtpm-tools, what swtpm keeps outside libvirt's own
directories (the emulated TPMs' local CA and swtpm's logs)::

    /var/lib/swtpm-localca  <- <dir>/<pool>/swtpm-localca
    /var/log/swtpm          <- <dir>/<pool>/log/swtpm

so the daemon socket /run/libvirt/libvirt-sock is reachable from outside as
``<dir>/<pool>/run/libvirt-sock``.  The network namespace has only a
loopback interface; the NAT network ``machinery`` (bridge mcbr0) and its
dnsmasq and iptables rules live entirely inside it.

Every pool is also reachable the two ways a remote host is:

* qemu+ssh: one sshd of the lab's own on 127.0.0.1:<port> (key authentication
  with a lab key, its own host key and known_hosts) runs ``nc -U`` against the
  pool's socket, whose path is visible from the machine's mount namespace;
* qemu+tls: libvirtd listens for TLS (lab CA, server and client certificates)
  on the pool end of a veth pair; the other end is in this tool's network
  namespace, a /30 out of 10.254.0.0/16.

Usage::

    python3 lab/lab.py up --pools 3 --dir .lab [--image PATH]
    python3 lab/lab.py status --dir .lab [--json]
    python3 lab/lab.py down --dir .lab [--purge]
    python3 lab/lab.py push-image --dir .lab --file DISK.qcow2 --ref REPOSITORY:TAG [--kernel K --initramfs I]
    python3 lab/lab.py push-image --file DISK.raw --ref REPOSITORY:TAG --layout DIR

The lab also runs an OCI registry on loopback (Debian's docker-registry, HTTPS with a certificate of the lab
CA, basic authentication with the lab's credentials); lab.json names it (``registry``, ``registry_ca``,
``registry_credentials``) and ``push-image`` pushes a disk image to it in IronCore's OS image format, as
ironcore-image's ``build`` writes it (an index with the image's platform; lab/oci_push.py), or with ``--layout``
writes that image as an OCI layout directory for another client (skopeo) to copy.

Must run as root.  Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NETWORK_NAME = "machinery"
BRIDGE_NAME = "mcbr0"
STORAGE_POOL_NAME = "machinery"
STORAGE_POOL_TARGET = "/var/lib/libvirt/machinery"  # as seen inside the pool
MARKER = ".machinery-lab"
STATE_FILE = "daemon.json"
PID_FILE = "libvirtd.pid"
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the NUL
MAX_POOLS = 155  # subnets 192.168.101.0/24 .. 192.168.255.0/24
LINK_FILE = "link.json"  # the pool's TLS link: interface names and addresses (kept across restarts)
POOL_IF = "lab0"  # the pool's end of its veth pair, inside the pool's network namespace
LINK_PREFIX = (10, 254)  # the links are /30 subnets of 10.254.0.0/16
TLS_PORT = 16514
PKI_DIR = "pki"  # lab CA and client certificate (pki/client is the clients' pkipath)
REGISTRY_DIR = "registry"  # the lab's OCI registry: config, certificate, htpasswd, credentials, blobs
REGISTRY_BIN = "/usr/bin/docker-registry"  # Debian's docker-registry package (distribution 2.x)
REGISTRY_USER = "lab"
SSH_DIR = "ssh"  # the lab's sshd: keys, config, known_hosts, log
SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it wants an absolute path

# (sub directory of the pool dir, mount point inside the pool's namespace)
BIND_MOUNTS = [
    ("run", "/run/libvirt"),
    ("lib", "/var/lib/libvirt"),
    ("etc", "/etc/libvirt"),
    ("log", "/var/log/libvirt"),
    ("cache", "/var/cache/libvirt"),
]

# swtpm_setup, which libvirt runs as its swtpm_user (Debian: tss) when a machine with an emulated TPM first
# starts, has swtpm_localca sign the TPM's certificates with a local CA it keeps in /var/lib/swtpm-localca (from
# /etc/swtpm-localca.conf), and swtpm logs to /var/log/swtpm. Both are the machine's own: shared by every pool of
# every lab (and the machine's own libvirtd), they let whatever used them before decide whether a TPM starts:
# a CA written there by a swtpm_localca run as root cannot be used by tss, and swtpm_setup then fails ("Need
# read/write rights on /var/lib/swtpm-localca/.lock.swtpm-localca for user tss"). Each pool host gets its own,
# as a real host has, made as swtpm-tools' postinst makes the machine's (owner tss, group root, mode 0750).
SWTPM_LOCALCA = "/var/lib/swtpm-localca"
SWTPM_LOCALCA_DIR = "swtpm-localca"
SWTPM_USER = "tss"
# Where libvirt puts the guests of a pool brought up with --cpu-cgroup when no systemd manages cgroups: its
# "machine" partition in the CPU controllers' hierarchies (cgroup v1), or in the unified one (v2).
CGROUP_PARTITIONS = ("/sys/fs/cgroup/cpu/machine", "/sys/fs/cgroup/cpuacct/machine", "/sys/fs/cgroup/machine")

LIBVIRTD_CONF = """\
# Written by lab/lab.py for one lab pool host.  Paths are as seen inside the
# pool's mount namespace.  libvirtd runs with --listen: TLS only, on the
# pool's end of its veth pair; any client certificate of the lab CA is let in.
listen_tls = 1
listen_tcp = 0
listen_addr = "{address}"
tls_port = "{port}"
key_file = "/etc/libvirt/pki/serverkey.pem"
cert_file = "/etc/libvirt/pki/servercert.pem"
ca_file = "/etc/libvirt/pki/cacert.pem"
auth_tls = "none"
tls_no_verify_certificate = 0
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
min_workers = 2
max_workers = 8
# Keepalive off: the daemon never closes a client that stops answering, so a run a test freezes (SIGSTOP) keeps
# its connection however long, and a pause test proves the store's fence, not libvirtd's keepalive, stopping it
# (the one-writer issue). A client's own keepalive (core/connection.py) still gives up on a daemon that stops.
keepalive_interval = -1
"""

QEMU_CONF = """\
# Written by lab/lab.py for one lab pool host.
# QEMU runs as root: it must be able to open /dev/kvm, or libvirtd considers
# its cached QEMU capabilities invalid and re-probes QEMU on every call.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
# No private /dev namespace for QEMU in this container, and no cgroups unless the pool was brought up with
# --cpu-cgroup (then the CPU controller only: a CFS quota, cputune, can be enforced and measured).
cgroup_controllers = [ {controllers} ]
namespaces = [ ]
# QEMU stdout/stderr go straight to /var/log/libvirt/qemu/<dom>.log, so no
# virtlogd is needed.  No lock manager is configured (no virtlockd).
stdio_handler = "file"
"""

# Runs inside the new namespaces (as PID == the one unshare got) and turns
# into libvirtd.  $1 = pool dir (absolute), $2 = libvirtd binary, $3 = the
# pool's end of the veth pair, which lab.py moves in and gives its address,
# $4 = a root of another Debian release whose programs the pool host runs
# (--newer), or empty.
NAMESPACE_SCRIPT = r"""
set -e
D="$1"
LIBVIRTD="$2"
IFACE="$3"
ROOT="$4"
CPU_CGROUP="$5"
mount --make-rprivate /
if [ -n "$ROOT" ]; then
    # A host of that release: every program started from here on (libvirtd,
    # QEMU, dnsmasq, iptables) and its libraries come from the root's /usr;
    # /etc stays the machine's but for the loader's cache of that /usr.
    mount --bind "$ROOT/usr" /usr
    mount --bind "$ROOT/etc/ld.so.cache" /etc/ld.so.cache
fi
# A sysfs mounted from inside the new network namespace shows that
# namespace's interfaces (mcbr0, vnetN) instead of the machine's. It hides the
# machine's cgroup mounts under /sys/fs/cgroup: a pool brought up with
# --cpu-cgroup gets them back (held aside while the new sysfs is mounted), so
# libvirt can put its QEMU under the CPU controller.
if [ -n "$CPU_CGROUP" ]; then
    mkdir -p "$D/cgroup"
    mount --rbind /sys/fs/cgroup "$D/cgroup"
fi
mount -t sysfs lab-sysfs /sys
if [ -n "$CPU_CGROUP" ]; then
    mount --move "$D/cgroup" /sys/fs/cgroup
fi
mount --bind "$D/run" /run/libvirt
mount --bind "$D/lib" /var/lib/libvirt
mount --bind "$D/etc" /etc/libvirt
mount --bind "$D/log" /var/log/libvirt
mount --bind "$D/cache" /var/cache/libvirt
# the pool's own swtpm local CA and logs (SWTPM_LOCALCA in lab.py), where the machine has swtpm-tools: a mount
# point is never made where the package did not make it
if [ -d /var/lib/swtpm-localca ] && [ -d "$D/swtpm-localca" ]; then
    mount --bind "$D/swtpm-localca" /var/lib/swtpm-localca
fi
if [ -d /var/lib/swtpm-localca ]; then
    mkdir -p /var/log/swtpm
    mount --bind "$D/log/swtpm" /var/log/swtpm
fi
ip link set lo up
# Guests must not use the TLS link: nothing but the link itself and loopback
# may send to the link addresses (libvirt leaves the raw table alone).
iptables -w -t raw -A PREROUTING -i lo -j ACCEPT
iptables -w -t raw -A PREROUTING -i "$IFACE" -j ACCEPT
iptables -w -t raw -A PREROUTING -d 10.254.0.0/16 -j DROP
# libvirtd binds the TLS listener to the link address: wait for lab.py.
i=0
until ip -o -4 addr show dev "$IFACE" 2>/dev/null | grep -q inet; do
    i=$((i + 1))
    if [ "$i" -gt 400 ]; then echo "no address on $IFACE after 20s" >&2; exit 1; fi
    sleep 0.05
done
exec "$LIBVIRTD" --listen --pid-file "$D/libvirtd.pid" --config /etc/libvirt/libvirtd.conf
"""

CHILD_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "HOME": "/root",
}


class LabError(Exception):
    pass


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# processes and namespaces


def proc_starttime(pid: int) -> int | None:
    """Start time of a process (clock ticks since boot); None if gone/zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses; fields follow the last ')'
    fields = data[data.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def ns_id(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def all_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def pids_in_namespaces(netns: str, mntns: str) -> list[int]:
    """Live processes whose network AND mount namespace are the given ones."""
    own = (ns_id("self", "net"), ns_id("self", "mnt"))
    if not netns or not mntns or netns in own or mntns in own:
        # Never match the namespaces this tool itself runs in.
        return []
    found = []
    for pid in all_pids():
        if ns_id(pid, "net") == netns and ns_id(pid, "mnt") == mntns:
            if proc_starttime(pid) is not None:
                found.append(pid)
    return found


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until processes are gone; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if proc_starttime(p) is not None]
    return [p for p in alive if proc_starttime(p) is not None]


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run(cmd: list[str], timeout: float = 60, env: dict | None = None) -> str:
    """Run a helper command; its failure is a LabError with its stderr."""
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=env or CHILD_ENV,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
    except FileNotFoundError as exc:
        raise LabError(f"{cmd[0]} not found") from exc
    if res.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` in the parent tree (children first found, then theirs)."""
    parents: dict[int, list[int]] = {}
    for child in all_pids():
        try:
            data = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        ppid = int(data[data.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_tree(pid: int, what: str, timeout: float = 5) -> None:
    """SIGTERM a process and everything it started, then SIGKILL what is left."""
    family = [pid, *descendants(pid)]
    signal_pids(family, signal.SIGTERM)
    alive = wait_gone(family, timeout)
    if alive:
        log(f"{what}: {alive} ignored SIGTERM, sending SIGKILL")
        signal_pids(alive, signal.SIGKILL)
        alive = wait_gone(alive, 5)
    if alive:
        raise LabError(f"{what}: processes {alive} survive SIGKILL")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------
# TLS: the lab CA, the client certificate, a server certificate per pool

CA_EXT = """\
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""

LEAF_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = {purpose}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def make_ca(directory: Path, name: str) -> None:
    """A self-signed CA: ``directory``/cacert.pem and cakey.pem."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "cakey.pem", directory / "cacert.pem"
    run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)])
    key.chmod(0o600)
    (directory / "ca.ext").write_text(CA_EXT)
    run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/O=machinery lab/CN={name}",
         "-out", str(directory / "ca.csr")])
    run(["openssl", "x509", "-req", "-in", str(directory / "ca.csr"), "-signkey", str(key), "-days", "3650",
         "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-extfile", str(directory / "ca.ext"),
         "-out", str(cert)])
    (directory / "ca.csr").unlink()


def make_leaf(ca_dir: Path, directory: Path, kind: str, common_name: str, alt_names: list[str]) -> None:
    """``directory``/<kind>cert.pem and <kind>key.pem (kind: server or client) signed by the CA in
    ``ca_dir``, and a copy of the CA's certificate as cacert.pem: the file names libvirt looks for."""
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / f"{kind}key.pem", directory / f"{kind}cert.pem"
    ext = LEAF_EXT.format(purpose="serverAuth" if kind == "server" else "clientAuth")
    if alt_names:
        ext += "subjectAltName = " + ", ".join(alt_names) + "\n"
    (directory / f"{kind}.ext").write_text(ext)
    run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)])
    key.chmod(0o600)
    run(["openssl", "req", "-new", "-key", str(key), "-subj", f"/O=machinery lab/CN={common_name}",
         "-out", str(directory / f"{kind}.csr")])
    run(["openssl", "x509", "-req", "-in", str(directory / f"{kind}.csr"), "-CA", str(ca_dir / "cacert.pem"),
         "-CAkey", str(ca_dir / "cakey.pem"), "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
         "-days", "825", "-extfile", str(directory / f"{kind}.ext"), "-out", str(cert)])
    (directory / f"{kind}.csr").unlink()
    shutil.copyfile(ca_dir / "cacert.pem", directory / "cacert.pem")


def signed_by(ca_dir: Path, cert: Path) -> bool:
    if not cert.exists() or not (ca_dir / "cacert.pem").exists():
        return False
    res = subprocess.run(["openssl", "verify", "-CAfile", str(ca_dir / "cacert.pem"), str(cert)],
                         capture_output=True, stdin=subprocess.DEVNULL, check=False, env=CHILD_ENV)
    return res.returncode == 0


class LabPKI:
    """<dir>/pki/ca: the lab CA; <dir>/pki/client: the clients' pkipath (cacert, clientcert, clientkey)."""

    def __init__(self, lab_dir: Path):
        self.dir = lab_dir / PKI_DIR
        self.ca = self.dir / "ca"
        self.client = self.dir / "client"

    def ensure(self) -> None:
        if not (self.ca / "cacert.pem").exists() or not (self.ca / "cakey.pem").exists():
            make_ca(self.ca, "machinery lab CA")
        if not signed_by(self.ca, self.client / "clientcert.pem") or not (self.client / "clientkey.pem").exists():
            make_leaf(self.ca, self.client, "client", "machinery lab client", [])


# --------------------------------------------------------------------------
# SSH: one sshd of the lab's own on loopback

SSHD_CONFIG = """\
# Written by lab/lab.py: the lab's sshd. Only the lab key gets in, as root,
# and only to run commands (libvirt runs nc -U <pool socket> through it).
ListenAddress 127.0.0.1:{port}
HostKey {dir}/host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers root
UsePAM no
StrictModes no
PermitTTY no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitUserEnvironment no
PrintMotd no
MaxStartups 100:30:200
MaxSessions 100
LogLevel VERBOSE
"""


class LabDaemon:
    """A daemon of the lab's own (its sshd, its registry): its state file records its pid and start time, so a
    pid that was reused by another process since is never taken for it."""

    state_file: Path

    def read_state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def recorded_pid(self) -> int | None:
        """The recorded pid while that process still runs (the same start time), else None."""
        st = self.read_state()
        pid = st.get("pid")
        if not isinstance(pid, int) or proc_starttime(pid) != st.get("starttime"):
            return None
        return pid


class LabSSHD(LabDaemon):
    """The lab's sshd and its files in <dir>/ssh: host key, the lab's client key (id_ed25519),
    authorized_keys, known_hosts (the host key at [127.0.0.1]:<port>), sshd_config, sshd.json, sshd.log."""

    def __init__(self, lab_dir: Path):
        self.dir = lab_dir / SSH_DIR
        self.config = self.dir / "sshd_config"
        self.state_file = self.dir / "sshd.json"
        self.log_file = self.dir / "sshd.log"
        self.host_key = self.dir / "host_ed25519_key"
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.authorized_keys = self.dir / "authorized_keys"
        self.client_bin = self.dir / "bin"

    def pid(self) -> int | None:
        """The pid of the lab's running sshd, or None."""
        pid = self.recorded_pid()
        if pid is None:
            return None
        # The listener rewrites its command line ("sshd: /usr/sbin/sshd -D -f <config> ... [listener] ...").
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            return None
        if exe != SSHD or f" -f {self.config} " not in " ".join(proc_cmdline(pid)) + " ":
            return None
        return pid

    def port(self) -> int | None:
        return self.read_state().get("port") if self.pid() is not None else None

    def prepare_keys(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for key, comment in ((self.host_key, "machinery-lab-host"), (self.key, "machinery-lab")):
            if not key.exists() or not key.with_suffix(".pub").exists():
                for old in (key, key.with_suffix(".pub")):
                    if old.exists():
                        old.unlink()
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
        public = self.key.with_suffix(".pub").read_text().strip()
        self.authorized_keys.write_text(f'restrict,from="127.0.0.1" {public}\n')
        # libvirt's qemu+ssh transport runs the OpenSSH client, which takes its known_hosts from the user's
        # ~/.ssh, never from the URI. This wrapper, first in PATH, makes it check the lab's known_hosts.
        self.client_bin.mkdir(exist_ok=True)
        wrapper = self.client_bin / "ssh"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# Written by lab/lab.py: the OpenSSH client checking the lab's known_hosts (put this dir first in PATH).\n"
            f'exec /usr/bin/ssh -o UserKnownHostsFile="{self.known_hosts}" -o GlobalKnownHostsFile=/dev/null '
            '-o StrictHostKeyChecking=yes -o BatchMode=yes "$@"\n'
        )
        wrapper.chmod(0o755)

    def ensure(self, timeout: float = 20) -> int:
        """Start the sshd unless it runs; returns its port."""
        if self.pid() is not None:
            return self.read_state()["port"]
        self.prepare_keys()
        old = self.read_state().get("port")
        port = old if isinstance(old, int) and port_free(old) else free_port()
        self.config.write_text(SSHD_CONFIG.format(port=port, dir=self.dir))
        host_public = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {host_public[0]} {host_public[1]}\n")
        # The privilege separation directory the Debian sshd is built with.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen(
                [SSHD, "-D", "-f", str(self.config), "-E", str(self.log_file)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=CHILD_ENV,
                cwd="/",
            )
        self.state_file.write_text(
            json.dumps({"pid": proc.pid, "starttime": proc_starttime(proc.pid), "port": port}, indent=2) + "\n"
        )
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise LabError(f"sshd exited with status {proc.returncode}; see {self.log_file}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    if sock.recv(64).startswith(b"SSH-2.0-"):
                        return port
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(f"sshd did not answer on 127.0.0.1:{port} within {timeout:.0f}s; see {self.log_file}")
            time.sleep(0.1)

    def stop(self) -> bool:
        """Stop the sshd and its sessions (by pid); True when one was running."""
        pid = self.pid()
        if pid is None:
            return False
        stop_tree(pid, "sshd")
        self.state_file.write_text(json.dumps({"port": self.read_state().get("port")}) + "\n")
        return True


# --------------------------------------------------------------------------
# the lab's OCI registry: Debian's docker-registry on loopback, HTTPS with a certificate of the lab CA, basic
# authentication (htpasswd, bcrypt) with the lab's credentials

REGISTRY_CONFIG = """\
# Written by lab/lab.py: the lab's OCI registry.
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {dir}/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  tls:
    certificate: {dir}/servercert.pem
    key: {dir}/serverkey.pem
auth:
  htpasswd:
    realm: machinery-lab
    path: {dir}/htpasswd
"""


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash, what the registry's htpasswd reads: Python's crypt module (up to 3.12; libxcrypt does
    bcrypt), else Apache's htpasswd."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt
        except ImportError:
            crypt = None
    if crypt is not None and crypt.METHOD_BLOWFISH in crypt.methods:
        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    if shutil.which("htpasswd"):
        return run(["htpasswd", "-nbB", "x", password]).strip().split(":", 1)[1]
    raise LabError("no bcrypt here for the registry's password (Python's crypt module or apache2-utils' htpasswd)")


class LabRegistry(LabDaemon):
    """The lab's registry and its files in <dir>/registry: config.yml, servercert.pem / serverkey.pem (for
    127.0.0.1, signed by the lab CA), htpasswd and credentials.json (user lab, a random password), registry.json
    (pid, start time, port), registry.log, data/ (the blobs)."""

    def __init__(self, lab_dir: Path):
        self.dir = lab_dir / REGISTRY_DIR
        self.config = self.dir / "config.yml"
        self.state_file = self.dir / "registry.json"
        self.log_file = self.dir / "registry.log"
        self.credentials_file = self.dir / "credentials.json"

    def pid(self) -> int | None:
        pid = self.recorded_pid()
        if pid is None:
            return None
        cmdline = proc_cmdline(pid)
        if not cmdline or cmdline[0] != REGISTRY_BIN or str(self.config) not in cmdline:
            return None
        return pid

    def address(self) -> str | None:
        return "127.0.0.1:%d" % self.read_state()["port"] if self.pid() is not None else None

    def credentials(self) -> dict:
        try:
            return json.loads(self.credentials_file.read_text())
        except (OSError, ValueError):
            return {}

    def prepare(self, pki: "LabPKI") -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(exist_ok=True)
        if not signed_by(pki.ca, self.dir / "servercert.pem") or not (self.dir / "serverkey.pem").exists():
            make_leaf(pki.ca, self.dir, "server", "127.0.0.1", ["IP:127.0.0.1", "DNS:localhost"])
        if not self.credentials():
            self.credentials_file.write_text(json.dumps({"username": REGISTRY_USER,
                                                         "password": os.urandom(12).hex()}) + "\n")
            self.credentials_file.chmod(0o600)
        creds = self.credentials()
        self.dir.joinpath("htpasswd").write_text("%s:%s\n" % (creds["username"], bcrypt_hash(creds["password"])))

    def ensure(self, pki: "LabPKI", timeout: float = 20) -> str | None:
        """Start the registry unless it runs; its host:port, or None when Debian's docker-registry is missing."""
        if self.pid() is not None:
            return self.address()
        if not os.path.exists(REGISTRY_BIN):
            log(f"registry: {REGISTRY_BIN} is missing (apt-get install docker-registry); no registry")
            return None
        self.prepare(pki)
        old = self.read_state().get("port")
        port = old if isinstance(old, int) and port_free(old) else free_port()
        self.config.write_text(REGISTRY_CONFIG.format(port=port, dir=self.dir))
        with open(self.log_file, "ab") as out:
            proc = subprocess.Popen([REGISTRY_BIN, "serve", str(self.config)], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    env=CHILD_ENV, cwd="/")
        self.state_file.write_text(
            json.dumps({"pid": proc.pid, "starttime": proc_starttime(proc.pid), "port": port}, indent=2) + "\n")
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise LabError(f"docker-registry exited with status {proc.returncode}; see {self.log_file}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    return f"127.0.0.1:{port}"
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(f"the registry did not answer on 127.0.0.1:{port} within {timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        stop_tree(pid, "registry")
        self.state_file.write_text(json.dumps({"port": self.read_state().get("port")}) + "\n")
        return True


# --------------------------------------------------------------------------
# the TLS link of a pool: a veth pair, one end in the pool's namespace


def link_networks_in_use() -> list[ipaddress.IPv4Network]:
    """IPv4 networks of the addresses in this tool's network namespace."""
    data = json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]")
    nets = []
    for link in data:
        for info in link.get("addr_info", []):
            nets.append((link.get("ifname"), ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network))
    return nets


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, stdin=subprocess.DEVNULL,
                          check=False, env=CHILD_ENV).returncode == 0


# --------------------------------------------------------------------------
# virsh


def virsh(uri: str, *args: str, timeout: float = 30, check: bool = True) -> str:
    cmd = ["virsh", "-q", "-c", uri, *args]
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout:.0f}s: {' '.join(cmd)}") from exc
    if check and res.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout if res.returncode == 0 else ""


def virsh_ok(uri: str, *args: str, timeout: float = 10) -> bool:
    try:
        res = subprocess.run(
            ["virsh", "-q", "-c", uri, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return res.returncode == 0


# --------------------------------------------------------------------------
# one pool host


class Pool:
    def __init__(self, lab_dir: Path, index: int):
        self.index = index
        self.name = f"pool{index}"
        self.dir = lab_dir / self.name
        self.socket = self.dir / "run" / "libvirt-sock"
        self.uri = f"qemu+unix:///system?socket={self.socket}"
        self.state_file = self.dir / STATE_FILE
        self.pid_file = self.dir / PID_FILE
        self.daemon_log = self.dir / "log" / "libvirtd.log"
        self.stdout_log = self.dir / "log" / "libvirtd.stdout.log"
        self.link_file = self.dir / LINK_FILE
        # the root of another Debian release this pool host runs its daemon from (--newer), when it does
        self.root_file = self.dir / "root"
        self.pki = self.dir / "etc" / "pki"  # /etc/libvirt/pki inside the pool
        # The machine's end of the TLS link: a name unique to this pool directory (15 bytes at most).
        self.host_if = "mlab" + hashlib.sha1(os.fsencode(str(self.dir))).hexdigest()[:8]

    # -- state ------------------------------------------------------------

    def root(self) -> str | None:
        try:
            return self.root_file.read_text().strip() or None
        except OSError:
            return None

    def versions(self) -> dict:
        """What the running daemon reports: libvirt's and QEMU's versions."""
        out = virsh(self.uri, "version", "--daemon", timeout=30, check=False)
        found = {}
        for key, pattern in (("libvirt_version", r"Running against daemon: (\S+)"),
                             ("qemu_version", r"Running hypervisor: QEMU (\S+)")):
            match = re.search(pattern, out)
            found[key] = match.group(1) if match else None
        return found

    def read_state(self) -> dict | None:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def daemon_pid(self) -> int | None:
        """PID of this pool's running libvirtd, or None."""
        st = self.read_state()
        if not st:
            return None
        pid = st.get("pid")
        if not isinstance(pid, int) or proc_starttime(pid) != st.get("starttime"):
            return None
        cmd = proc_cmdline(pid)
        if not cmd or os.path.basename(cmd[0]) != "libvirtd":
            return None
        if ns_id(pid, "net") != st.get("netns") or ns_id(pid, "mnt") != st.get("mntns"):
            return None
        return pid

    def leftovers(self) -> list[int]:
        """Processes still living in this pool's (recorded) namespaces."""
        st = self.read_state()
        if not st:
            return []
        return pids_in_namespaces(st.get("netns", ""), st.get("mntns", ""))

    def state(self) -> str:
        if self.daemon_pid() is not None:
            return "running"
        if (
            self.leftovers()
            or self.state_file.exists()
            or self.pid_file.exists()
            or self.socket.exists()
        ):
            return "stale"
        return "stopped"

    # -- preparation ------------------------------------------------------

    def check_socket_path(self) -> None:
        bad = set(str(self.socket)) & set(" \t\n?&#%;'\"")
        if bad:
            raise LabError(
                f"lab dir {self.dir.parent} contains characters that do not fit "
                f"in a libvirt URI ({''.join(sorted(bad))!r}); use another --dir"
            )
        n = len(os.fsencode(str(self.socket)))
        if n > SUN_PATH_MAX:
            raise LabError(
                f"socket path {self.socket} is {n} bytes; UNIX socket paths may be at most "
                f"{SUN_PATH_MAX} bytes. Use a shorter --dir."
            )

    # -- the TLS link ---------------------------------------------------------

    def link(self) -> dict | None:
        """The pool's link: {host_if, host_address, address} (address: the pool's end, where TLS listens)."""
        try:
            data = json.loads(self.link_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("address") else None

    def allocate_link(self) -> dict:
        """Keep the recorded /30 when nothing else on the machine uses it, else take the first free one
        from a start that depends on the pool directory (so that labs side by side rarely meet)."""
        used = [net for ifname, net in link_networks_in_use() if ifname != self.host_if]
        current = self.link()
        if current:
            net = ipaddress.IPv4Network(f"{current['host_address']}/30", strict=False)
            if not any(net.overlaps(other) for other in used):
                return current
        count = 1 << 14  # /30 subnets in a /16
        start = int(hashlib.sha1(os.fsencode(str(self.dir))).hexdigest(), 16) % count
        base = (LINK_PREFIX[0] << 24) | (LINK_PREFIX[1] << 16)
        for step in range(count):
            net = ipaddress.IPv4Network((base + ((start + step) % count) * 4, 30))
            if not any(net.overlaps(other) for other in used):
                hosts = list(net.hosts())
                data = {"host_if": self.host_if, "host_address": str(hosts[0]), "address": str(hosts[1])}
                self.link_file.write_text(json.dumps(data, indent=2) + "\n")
                return data
        raise LabError(f"{self.name}: no free /30 left in {LINK_PREFIX[0]}.{LINK_PREFIX[1]}.0.0/16")

    def attach_link(self, pid: int) -> None:
        """Create the veth pair: the machine's end here, POOL_IF in the namespace of ``pid``."""
        link = self.link()
        if link is None:
            raise LabError(f"{self.name}: no link allocated")
        self.remove_link()
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", POOL_IF, "netns", str(pid)])
        run(["ip", "addr", "add", f"{link['host_address']}/30", "dev", self.host_if])
        run(["ip", "link", "set", self.host_if, "up"])
        inside = ["nsenter", "--target", str(pid), "--net", "ip"]
        run([*inside, "addr", "add", f"{link['address']}/30", "dev", POOL_IF])
        run([*inside, "link", "set", POOL_IF, "up"])

    def link_up(self, pid: int) -> bool:
        link = self.link()
        if link is None or not link_exists(self.host_if):
            return False
        res = subprocess.run(["nsenter", "--target", str(pid), "--net", "ip", "-o", "-4", "addr", "show", "dev",
                              POOL_IF], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
                             env=CHILD_ENV)
        return f" {link['address']}/30 " in res.stdout

    def remove_link(self) -> None:
        if link_exists(self.host_if):
            run(["ip", "link", "del", self.host_if])

    def listens_tls(self) -> bool:
        """Whether the running daemon was started with its TLS listener (older labs' were not)."""
        pid = self.daemon_pid()
        return pid is not None and "--listen" in proc_cmdline(pid)

    def ensure_server_cert(self, ca_dir: Path, address: str) -> None:
        marker = self.pki / "address"
        current = marker.read_text().strip() if marker.exists() else None
        if current == address and signed_by(ca_dir, self.pki / "servercert.pem"):
            return
        make_leaf(ca_dir, self.pki, "server", self.name, [f"IP:{address}", f"DNS:{self.name}"])
        marker.write_text(address + "\n")

    # -- preparation ------------------------------------------------------

    def remove_cgroup_partitions(self) -> None:
        """The cgroup partitions this pool's libvirtd made (prepare), removed when empty."""
        noted = self.dir / "cgroup-made"
        if not noted.exists():
            return
        left = []
        for path in dict.fromkeys(noted.read_text().split()):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(path)  # still holds another lab's guests: kept, and tried again at the next down
        if left:
            noted.write_text("".join(path + "\n" for path in left))
        else:
            noted.unlink()

    @property
    def cgroup_file(self) -> Path:
        """Present when the pool's QEMU runs under the CPU cgroup controller (up --cpu-cgroup)."""
        return self.dir / "cpu-cgroup"

    def prepare(self, ca_dir: Path, root: str | None, cpu_cgroup: bool | None = None) -> None:
        for sub, _mountpoint in BIND_MOUNTS:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        if root != self.root():
            # QEMU's capabilities cached by the other release's daemon describe other binaries
            shutil.rmtree(self.dir / "cache" / "qemu" / "capabilities", ignore_errors=True)
        if root:
            self.root_file.write_text(root + "\n")
        elif self.root_file.exists():
            self.root_file.unlink()
        etc = self.dir / "etc"
        link = self.allocate_link()
        self.ensure_server_cert(ca_dir, link["address"])
        (etc / "libvirtd.conf").write_text(LIBVIRTD_CONF.format(address=link["address"], port=TLS_PORT))
        if cpu_cgroup is not None:  # None: as the pool ran before (a reboot keeps it)
            if cpu_cgroup:
                self.cgroup_file.write_text("cpu cpuacct\n")
            elif self.cgroup_file.exists():
                self.cgroup_file.unlink()
        controllers = '"cpu", "cpuacct"' if self.cgroup_file.exists() else ""
        if controllers:
            # libvirt makes its "machine" partition in the machine's hierarchies if it is not there: what this
            # pool made is noted, and `down` removes it again when no guest of another lab is in it
            made = [path for path in CGROUP_PARTITIONS if os.path.isdir(os.path.dirname(path))
                    and not os.path.exists(path)]
            if made:
                with open(self.dir / "cgroup-made", "a") as handle:
                    handle.write("".join(path + "\n" for path in made))
        (etc / "qemu.conf").write_text(QEMU_CONF.format(controllers=controllers))
        # nwfilter definitions from the system (so <filterref> works); no
        # networks, domains or storage pools from the system configuration.
        sys_nwfilter = Path("/etc/libvirt/nwfilter")
        if sys_nwfilter.is_dir() and not (etc / "nwfilter").exists():
            shutil.copytree(sys_nwfilter, etc / "nwfilter")
        for sub in ("qemu/networks/autostart", "storage/autostart"):
            (etc / sub).mkdir(parents=True, exist_ok=True)
        # The system's "default" network must never show up (or autostart).
        for stale in (
            etc / "qemu/networks/autostart/default.xml",
            etc / "qemu/networks/default.xml",
        ):
            if stale.exists() or stale.is_symlink():
                stale.unlink()
        (self.dir / "lib" / "machinery").mkdir(parents=True, exist_ok=True)
        self.prepare_swtpm()

    def prepare_swtpm(self) -> None:
        """The pool's own swtpm local CA directory, owned as swtpm-tools makes the machine's (SWTPM_LOCALCA),
        and its swtpm log directory."""
        (self.dir / "log" / "swtpm").mkdir(parents=True, exist_ok=True)
        if not os.path.isdir(SWTPM_LOCALCA):
            return
        localca = self.dir / SWTPM_LOCALCA_DIR
        localca.mkdir(exist_ok=True)
        try:
            uid = pwd.getpwnam(SWTPM_USER).pw_uid
        except KeyError:  # libvirt runs swtpm as root then
            uid = 0
        os.chown(localca, uid, 0)
        os.chmod(localca, 0o750)

    def seed_capabilities(self, donors: list["Pool"]) -> None:
        """Copy QEMU capability cache from another pool (same binaries) to
        skip the expensive first probe."""
        dst = self.dir / "cache" / "qemu" / "capabilities"
        if dst.is_dir() and any(dst.glob("*.xml")):
            return
        for donor in donors:
            if donor.root() != self.root():
                continue
            src = donor.dir / "cache" / "qemu" / "capabilities"
            files = sorted(src.glob("*.xml")) if src.is_dir() else []
            if files:
                dst.mkdir(parents=True, exist_ok=True)
                for f in files:
                    shutil.copy2(f, dst / f.name)
                return

    # -- cleanup of a stale (crashed) pool ---------------------------------

    def kill_everything(self, term_timeout: float = 10) -> None:
        """Stop the daemon and every process in the pool's namespaces."""
        pid = self.daemon_pid()
        if pid is not None:
            signal_pids([pid], signal.SIGTERM)
            if wait_gone([pid], term_timeout):
                log(f"{self.name}: libvirtd {pid} ignored SIGTERM, sending SIGKILL")
                signal_pids([pid], signal.SIGKILL)
                wait_gone([pid], 5)
        rest = self.leftovers()
        if rest:
            signal_pids(rest, signal.SIGTERM)
            rest = wait_gone(rest, 5)
            if rest:
                signal_pids(rest, signal.SIGKILL)
                rest = wait_gone(rest, 5)
        rest = self.leftovers()
        if rest:
            raise LabError(f"{self.name}: processes {rest} in the pool namespace survive SIGKILL")

    def clear_runtime(self) -> None:
        """Remove what a dead daemon left: state, pid file, the whole run
        dir (it is /run/libvirt inside, i.e. tmpfs-like state: sockets, domain
        status XML with old QEMU pids, dnsmasq pid files)."""
        for f in (self.state_file, self.pid_file):
            if f.exists() or f.is_symlink():
                f.unlink()
        run = self.dir / "run"
        if run.is_dir():
            for child in run.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()

    # -- start / wait -------------------------------------------------------

    def start(self, libvirtd: str) -> None:
        self.stdout_log.parent.mkdir(parents=True, exist_ok=True)
        for _sub, mountpoint in BIND_MOUNTS:
            # Mount points must exist on the machine (empty dirs).
            os.makedirs(mountpoint, exist_ok=True)
        with open(self.stdout_log, "ab") as out:
            proc = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--net",
                    "--propagation",
                    "private",
                    "--",
                    "/bin/sh",
                    "-c",
                    NAMESPACE_SCRIPT,
                    f"lab-{self.name}",
                    str(self.dir),
                    libvirtd,
                    POOL_IF,
                    self.root() or "",
                    "1" if self.cgroup_file.exists() else "",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=CHILD_ENV,
                cwd="/",
            )
        self._proc = proc
        pid = proc.pid
        # unshare(1) without --fork unshares and execs in the same process,
        # so the namespaces are in place once /proc shows a different netns.
        own_net, own_mnt = ns_id("self", "net"), ns_id("self", "mnt")
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise LabError(
                    f"{self.name}: namespace setup failed (exit {proc.returncode}); "
                    f"see {self.stdout_log}"
                )
            net, mnt = ns_id(pid, "net"), ns_id(pid, "mnt")
            if net and mnt and net != own_net and mnt != own_mnt:
                break
            if time.monotonic() > deadline:
                raise LabError(f"{self.name}: namespaces of pid {pid} never appeared")
            time.sleep(0.02)
        try:
            self.attach_link(pid)
        except LabError:
            proc.kill()
            proc.wait()
            raise
        self.state_file.write_text(
            json.dumps(
                {
                    "pid": pid,
                    "starttime": proc_starttime(pid),
                    "netns": net,
                    "mntns": mnt,
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                },
                indent=2,
            )
            + "\n"
        )

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = getattr(self, "_proc", None)
            if proc is not None and proc.poll() is not None:
                raise LabError(
                    f"{self.name}: libvirtd exited with status {proc.returncode} during startup; "
                    f"see {self.daemon_log} and {self.stdout_log}"
                )
            if self.socket.exists() and virsh_ok(self.uri, "version", timeout=10):
                return
            if time.monotonic() > deadline:
                raise LabError(
                    f"{self.name}: libvirtd did not answer on {self.socket} within "
                    f"{timeout:.0f}s; see {self.daemon_log} and {self.stdout_log}"
                )
            time.sleep(0.2)

    # -- resources inside the pool ------------------------------------------

    def network_xml(self) -> str:
        net = f"192.168.{100 + self.index}"
        return (
            f"<network>\n"
            f"  <name>{NETWORK_NAME}</name>\n"
            f"  <forward mode='nat'/>\n"
            f"  <bridge name='{BRIDGE_NAME}' stp='off' delay='0'/>\n"
            f"  <ip address='{net}.1' netmask='255.255.255.0'>\n"
            f"    <dhcp>\n"
            f"      <range start='{net}.10' end='{net}.250'/>\n"
            f"    </dhcp>\n"
            f"  </ip>\n"
            f"</network>\n"
        )

    def ensure_resources(self) -> None:
        uri = self.uri
        if not virsh_ok(uri, "net-info", NETWORK_NAME):
            xml = self.dir / "network-machinery.xml"
            xml.write_text(self.network_xml())
            virsh(uri, "net-define", str(xml))
        info = virsh(uri, "net-info", NETWORK_NAME)
        if not re.search(r"^Autostart:\s+yes", info, re.M):
            virsh(uri, "net-autostart", NETWORK_NAME)
        if not re.search(r"^Active:\s+yes", info, re.M):
            virsh(uri, "net-start", NETWORK_NAME)

        (self.dir / "lib" / "machinery").mkdir(parents=True, exist_ok=True)
        if not virsh_ok(uri, "pool-info", STORAGE_POOL_NAME):
            virsh(uri, "pool-define-as", STORAGE_POOL_NAME, "dir", "--target", STORAGE_POOL_TARGET)
        info = virsh(uri, "pool-info", STORAGE_POOL_NAME)
        if not re.search(r"^Autostart:\s+yes", info, re.M):
            virsh(uri, "pool-autostart", STORAGE_POOL_NAME)
        if not re.search(r"^State:\s+running", info, re.M):
            virsh(uri, "pool-start", STORAGE_POOL_NAME)

    def domains(self) -> tuple[int, int] | None:
        try:
            every = virsh(self.uri, "list", "--all", "--name", timeout=10).split()
            running = virsh(self.uri, "list", "--state-running", "--name", timeout=10).split()
        except LabError:
            return None
        return len(every), len(running)

    def destroy_domains(self) -> None:
        try:
            active = virsh(self.uri, "list", "--name", timeout=15).split()
        except LabError as exc:
            log(f"{self.name}: cannot list domains ({exc}); killing processes instead")
            return
        for dom in active:
            if not virsh_ok(self.uri, "destroy", dom, timeout=30):
                log(f"{self.name}: virsh destroy {dom} failed; its QEMU will be killed")


# --------------------------------------------------------------------------
# lab directory


def lab_dir_arg(value: str) -> Path:
    return Path(os.path.abspath(value))


def existing_pools(lab_dir: Path) -> list[Pool]:
    pools = []
    if lab_dir.is_dir():
        for child in lab_dir.iterdir():
            m = re.fullmatch(r"pool([1-9][0-9]*)", child.name)
            if m and child.is_dir():
                pools.append(Pool(lab_dir, int(m.group(1))))
    return sorted(pools, key=lambda p: p.index)


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, mounts, libvirtd as root)")


def find_libvirtd() -> str:
    path = shutil.which("libvirtd", path=CHILD_ENV["PATH"])
    if not path:
        raise LabError("libvirtd not found (install libvirt-daemon-system)")
    for tool, package in (("virsh", "libvirt-clients"), ("unshare", "util-linux"), ("openssl", "openssl"),
                          ("ssh-keygen", "openssh-client"), ("nc", "netcat-openbsd"), ("nsenter", "util-linux")):
        if not shutil.which(tool, path=CHILD_ENV["PATH"]):
            raise LabError(f"{tool} not found (install {package})")
    if not os.access(SSHD, os.X_OK):
        raise LabError(f"{SSHD} not found (install openssh-server)")
    return path


def transport_uris(pool: Pool, sshd: LabSSHD, pki: LabPKI) -> dict:
    """How to reach a running pool: its unix socket, through the lab's sshd, over TLS on its link.
    A transport that is not up (no sshd, a daemon from before TLS) is left out."""
    uris = {"unix": pool.uri}
    port = sshd.port()
    if port is not None:
        # libvirt's built-in SSH client (libssh2): the key and the known_hosts file come from the URI. (Its
        # libssh client, qemu+libssh, hangs on replies of a few KiB in a program without an event loop.)
        uris["ssh"] = (
            f"qemu+libssh2://root@127.0.0.1:{port}/system?socket={pool.socket}"
            f"&keyfile={sshd.key}&known_hosts={sshd.known_hosts}&sshauth=privkey"
        )
        # The OpenSSH client: checks the host key against the user's known_hosts, or the lab's when
        # <dir>/ssh/bin (lab.json ssh.client_path) is first in PATH.
        uris["openssh"] = f"qemu+ssh://root@127.0.0.1:{port}/system?socket={pool.socket}&keyfile={sshd.key}"
    link = pool.link()
    if link and pool.listens_tls():
        uris["tls"] = f"qemu+tls://{link['address']}/system?pkipath={pki.client}"
    return uris


def write_lab_json(lab_dir: Path, image: str | None) -> None:
    running = [p for p in existing_pools(lab_dir) if p.daemon_pid() is not None]
    sshd, pki = LabSSHD(lab_dir), LabPKI(lab_dir)
    data = {
        "pools": [
            {
                "name": p.name,
                "uri": p.uri,
                "uris": transport_uris(p, sshd, pki),
                "tls_address": (p.link() or {}).get("address"),
                "network": NETWORK_NAME,
                "storage_pool": STORAGE_POOL_NAME,
                **p.versions(),
                "debian_root": p.root(),
            }
            for p in running
        ],
        "image": image,
        "ssh": {
            "port": sshd.port(),
            "keyfile": str(sshd.key),
            "known_hosts": str(sshd.known_hosts),
            "client_path": str(sshd.client_bin),
            "log": str(sshd.log_file),
        }
        if sshd.pid() is not None
        else None,
        "tls": {"pkipath": str(pki.client), "ca": str(pki.ca / "cacert.pem")} if running else None,
    }
    registry = LabRegistry(lab_dir)
    data["registry"] = registry.address()
    data["registry_ca"] = str(pki.ca / "cacert.pem") if data["registry"] else None
    data["registry_credentials"] = registry.credentials() if data["registry"] else None
    tmp = lab_dir / "lab.json.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(lab_dir / "lab.json")


def lock_lab(lab_dir: Path):
    """Serialise up/down on one lab dir (lock released when the process exits)."""
    fh = open(lab_dir / ".lock", "w")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log(f"waiting for another lab.py working on {lab_dir} ...")
        fcntl.flock(fh, fcntl.LOCK_EX)
    return fh


def read_lab_json(lab_dir: Path) -> dict:
    try:
        return json.loads((lab_dir / "lab.json").read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------
# commands


def newer_root(args: argparse.Namespace, pool: Pool, count: int) -> str | None:
    """The root a pool about to start runs its daemon from: with --newer N, the last N pools run the
    --newer-root's programs and the others the machine's; without it, each pool keeps what it ran before
    (a pool restarted by ``up`` stays the host it was)."""
    if args.newer is None:
        return pool.root()
    return args.newer_root if pool.index > count - args.newer else None


def cmd_up(args: argparse.Namespace) -> int:
    require_root()
    lab_dir: Path = args.dir
    if not 1 <= args.pools <= MAX_POOLS:
        raise LabError(f"--pools must be between 1 and {MAX_POOLS}")
    libvirtd = find_libvirtd()
    if args.newer is not None:
        if not 0 <= args.newer <= args.pools:
            raise LabError(f"--newer must be between 0 and --pools ({args.pools})")
        if args.newer and not args.newer_root:
            raise LabError("--newer needs --newer-root, a root with the newer release's libvirt and QEMU "
                           "(lab/debian13/root.sh lab DIR makes one)")
        if args.newer:
            args.newer_root = os.path.abspath(args.newer_root)
            if not os.access(os.path.join(args.newer_root, "usr/sbin/libvirtd"), os.X_OK):
                raise LabError(f"--newer-root {args.newer_root} has no usr/sbin/libvirtd")
    wanted = [Pool(lab_dir, i) for i in range(1, args.pools + 1)]
    for pool in wanted:
        pool.check_socket_path()

    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / MARKER).write_text("directory managed by lab/lab.py; `down --purge` deletes it\n")
    _lock = lock_lab(lab_dir)  # noqa: F841 (held until exit)

    image = read_lab_json(lab_dir).get("image")
    if args.image is not None:
        image = os.path.abspath(args.image) if args.image else None
        if image and not os.path.exists(image):
            log(f"warning: image {image} does not exist (yet)")

    t0 = time.monotonic()
    pki = LabPKI(lab_dir)
    pki.ensure()
    to_start = []
    for pool in wanted:
        pid = pool.daemon_pid()
        if pid is not None:
            log(f"{pool.name}: already running (pid {pid})")
            if not pool.listens_tls():
                log(f"{pool.name}: started by an older lab.py without TLS; `down` and `up` to get it")
            elif not pool.link_up(pid):
                log(f"{pool.name}: its TLS link was gone; made again")
                pool.attach_link(pid)
            continue
        if pool.state() == "stale":
            log(f"{pool.name}: cleaning up after a dead daemon")
            pool.kill_everything()
        pool.clear_runtime()
        pool.prepare(pki.ca, newer_root(args, pool, len(wanted)), args.cpu_cgroup)
        to_start.append(pool)

    # The first QEMU capability probe costs seconds of CPU; do it once per
    # release of the pools' programs and let the others start from a copy.
    donors = [
        p for p in existing_pools(lab_dir) if any((p.dir / "cache/qemu/capabilities").glob("*.xml"))
    ]
    first_batch, second_batch = [], []
    for pool in to_start:
        seeded = any(d.root() == pool.root() for d in donors + first_batch)
        (second_batch if seeded else first_batch).append(pool)
    for batch in (first_batch, second_batch):
        for pool in batch:
            pool.seed_capabilities(donors)
            pool.start(libvirtd)
        for pool in batch:
            pool.wait_ready(args.timeout)
            log(
                f"{pool.name}: libvirtd up (pid {pool.daemon_pid()}) after "
                f"{time.monotonic() - t0:.1f}s"
            )
        donors = donors + batch

    for pool in wanted:
        pool.wait_ready(args.timeout)
        pool.ensure_resources()

    port = LabSSHD(lab_dir).ensure()
    log(f"sshd on 127.0.0.1:{port}")
    address = LabRegistry(lab_dir).ensure(pki)
    if address:
        log(f"registry on https://{address}")
    write_lab_json(lab_dir, image)
    log(
        f"lab up: {len(wanted)} pool(s) in {time.monotonic() - t0:.1f}s; " f"{lab_dir / 'lab.json'}"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    require_root()
    lab_dir: Path = args.dir
    t0 = time.monotonic()
    failed = False
    _lock = lock_lab(lab_dir) if (lab_dir / MARKER).exists() else None  # noqa: F841
    for pool in existing_pools(lab_dir):
        try:
            if pool.daemon_pid() is not None:
                pool.destroy_domains()
            if pool.state() != "stopped":
                pool.kill_everything()
                log(f"{pool.name}: stopped")
            pool.clear_runtime()
            pool.remove_link()
            pool.remove_cgroup_partitions()
        except LabError as exc:
            log(f"error: {exc}")
            failed = True
    try:
        if LabSSHD(lab_dir).stop():
            log("sshd: stopped")
    except LabError as exc:
        log(f"error: {exc}")
        failed = True
    try:
        if LabRegistry(lab_dir).stop():
            log("registry: stopped")
    except LabError as exc:
        log(f"error: {exc}")
        failed = True
    if lab_dir.is_dir() and (lab_dir / "lab.json").exists() and not failed:
        write_lab_json(lab_dir, read_lab_json(lab_dir).get("image"))
    if args.purge and lab_dir.exists() and not failed:
        if not (lab_dir / MARKER).exists():
            raise LabError(f"refusing to delete {lab_dir}: no {MARKER} marker, not a lab dir")
        shutil.rmtree(lab_dir)
        log(f"deleted {lab_dir}")
    log(f"lab down in {time.monotonic() - t0:.1f}s")
    return 1 if failed else 0


def cmd_reboot(args: argparse.Namespace) -> int:
    """What a host reboot does to one pool: the daemon is stopped, the guests die as in a power loss (no
    shutdown reaches them), the runtime state goes (/run is a tmpfs on a real host: this also makes libvirt
    autostart again, as it does once per boot), and the daemon starts with its autostart networks, storage and
    domains. Whatever goes wrong on the way down, the daemon is started again; when it does not answer, the
    command fails saying the pool is left without it."""
    require_root()
    lab_dir: Path = args.dir
    pool = next((p for p in existing_pools(lab_dir) if p.name == args.pool), None)
    if pool is None:
        raise LabError(f"no pool {args.pool} in {lab_dir}")
    _lock = lock_lab(lab_dir)  # noqa: F841 (held until exit)
    t0 = time.monotonic()
    try:
        power_loss(pool)
    finally:
        # also after a failure above: a reboot that leaves a shared lab's pool without its daemon breaks every
        # later user of that pool
        boot(lab_dir, pool, args.timeout)
    log(f"{pool.name}: up again (pid {pool.daemon_pid()}) after {time.monotonic() - t0:.1f}s")
    return 0


def power_loss(pool: Pool) -> None:
    """The pool's daemon stopped and its guests killed (SIGKILL), then its runtime state cleared."""
    pid = pool.daemon_pid()
    if pid is not None:
        signal_pids([pid], signal.SIGTERM)
        if wait_gone([pid], 10):
            signal_pids([pid], signal.SIGKILL)
            wait_gone([pid], 5)
    guests = [p for p in pool.leftovers() if os.path.basename((proc_cmdline(p) or [""])[0]).startswith("qemu")]
    signal_pids(guests, signal.SIGKILL)
    wait_gone(guests, 10)
    log(f"{pool.name}: daemon stopped, {len(guests)} guest(s) killed")
    pool.kill_everything()
    pool.clear_runtime()


def boot(lab_dir: Path, pool: Pool, timeout: float) -> None:
    """Start the pool's daemon as the host's boot does (it keeps the release it ran), and check it answers."""
    try:
        if pool.daemon_pid() is None:
            pool.prepare(LabPKI(lab_dir).ca, pool.root())
            pool.start(find_libvirtd())
        pool.wait_ready(timeout)
        pool.ensure_resources()
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        raise LabError(f"{pool.name}: its daemon did not come back after the reboot ({exc}); the pool is left "
                       f"without it: `lab.py up --dir {lab_dir} --pools N` starts it") from exc
    if pool.daemon_pid() is None:
        raise LabError(f"{pool.name}: no daemon runs after the reboot; the pool is left without it: "
                       f"`lab.py up --dir {lab_dir} --pools N` starts it")


def cmd_status(args: argparse.Namespace) -> int:
    lab_dir: Path = args.dir
    sshd, pki = LabSSHD(lab_dir), LabPKI(lab_dir)
    rows = []
    for pool in existing_pools(lab_dir):
        state = pool.state()
        pid = pool.daemon_pid()
        doms = pool.domains() if state == "running" else None
        rows.append(
            {
                "name": pool.name,
                "state": state,
                "pid": pid,
                "uri": pool.uri,
                "uris": transport_uris(pool, sshd, pki) if pid is not None else {},
                "tls_address": (pool.link() or {}).get("address") if pid is not None else None,
                "domains": doms[0] if doms else None,
                "running_domains": doms[1] if doms else None,
            }
        )
    ssh = {"pid": sshd.pid(), "port": sshd.port()}
    registry = LabRegistry(lab_dir)
    oci = {"pid": registry.pid(), "address": registry.address()}
    if args.json:
        print(
            json.dumps(
                {"dir": str(lab_dir), "pools": rows, "sshd": ssh, "registry": oci,
                 "image": read_lab_json(lab_dir).get("image")},
                indent=2,
            )
        )
        return 0
    if not rows:
        print(f"no lab pools in {lab_dir}")
        return 0
    print(f"sshd     {'running' if ssh['pid'] else 'stopped':<8} pid={ssh['pid'] or '-':<8} "
          f"{'127.0.0.1:%d' % ssh['port'] if ssh['port'] else '-'}")
    print(f"registry {'running' if oci['pid'] else 'stopped':<8} pid={oci['pid'] or '-':<8} "
          f"{'https://' + oci['address'] if oci['address'] else '-'}")
    for r in rows:
        doms = (
            "-"
            if r["domains"] is None
            else f"{r['domains']} domains, {r['running_domains']} running"
        )
        print(f"{r['name']:<8} {r['state']:<8} pid={r['pid'] or '-':<8} {r['uri']}  {doms}  "
              f"tls={r['tls_address'] or '-'}")
    return 0


def cmd_push_image(args: argparse.Namespace) -> int:
    """Push a disk image to the lab's registry in IronCore's OS image format (lab/oci_push.py)."""
    from oci_push import push_disk_image, write_layout  # lab/, beside this file

    layers = {"kernel": args.kernel, "initramfs": args.initramfs, "cmdline": args.cmdline or ""}
    if args.layout:
        print(write_layout(args.layout, args.ref.rpartition(":")[2] or args.ref, args.file, **layers))
        return 0
    data = read_lab_json(args.dir)
    if not data.get("registry"):
        raise LabError(f"the lab in {args.dir} runs no registry (`up` starts it when docker-registry is installed)")
    digest = push_disk_image(data["registry"], args.ref, args.file, data["registry_ca"],
                             data.get("registry_credentials") or {}, **layers)
    print(f"oci://{data['registry']}/{args.ref.rpartition(':')[0]}@{digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lab.py", description="Run N isolated libvirtd pool hosts on this machine."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dir",
            type=lab_dir_arg,
            default=lab_dir_arg(".lab"),
            help="lab state directory (default: ./.lab)",
        )

    p_up = sub.add_parser("up", help="start missing pool hosts (idempotent)")
    add_dir(p_up)
    p_up.add_argument("--pools", type=int, default=3, help="number of pool hosts (default 3)")
    p_up.add_argument(
        "--image",
        default=None,
        help="test image path recorded in lab.json (default: keep previous)",
    )
    p_up.add_argument(
        "--newer",
        type=int,
        default=None,
        help="the last N pools run their daemons from --newer-root (default: as each ran before; 0 for none)",
    )
    p_up.add_argument(
        "--newer-root",
        default=None,
        help="a root of a newer Debian release with libvirt and QEMU installed (lab/debian13/root.sh lab DIR)",
    )
    p_up.add_argument(
        "--timeout",
        type=float,
        default=120,
        help="seconds to wait for each daemon to answer (default 120)",
    )
    p_up.add_argument(
        "--cpu-cgroup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="QEMU of the pools started now runs under the CPU cgroup controller, so a CPU quota (cputune) is "
        "enforced (default: as each ran before; off at first)",
    )
    p_up.set_defaults(func=cmd_up)

    p_down = sub.add_parser("down", help="stop everything the lab started (idempotent)")
    add_dir(p_down)
    p_down.add_argument("--purge", action="store_true", help="also delete the lab directory")
    p_down.set_defaults(func=cmd_down)

    p_reboot = sub.add_parser("reboot", help="do to one pool what a host reboot does (guests die as in a power loss)")
    add_dir(p_reboot)
    p_reboot.add_argument("--pool", required=True, help="the pool's name (pool1, pool2, ...)")
    p_reboot.add_argument("--timeout", type=float, default=120, help="seconds to wait for the daemon (default 120)")
    p_reboot.set_defaults(func=cmd_reboot)

    p_status = sub.add_parser("status", help="show the pool hosts")
    add_dir(p_status)
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_status.set_defaults(func=cmd_status)

    p_push = sub.add_parser("push-image", help="push a disk image to the lab's registry (IronCore's OS image format)")
    add_dir(p_push)
    p_push.add_argument("--file", required=True, help="the disk image (qcow2 or raw)")
    p_push.add_argument("--ref", required=True, help="REPOSITORY:TAG in the lab's registry")
    p_push.add_argument("--kernel", help="a kernel layer beside the disk (ironcore-image's kernel)")
    p_push.add_argument("--initramfs", help="an initramfs layer beside the disk")
    p_push.add_argument("--cmdline", help="the kernel command line, in the image's config")
    p_push.add_argument("--layout", help="write an OCI image layout to this directory instead of pushing")
    p_push.set_defaults(func=cmd_push_image)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LabError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
