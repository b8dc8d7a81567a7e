"""Local libvirt lab: N isolated libvirtd "hosts" on one machine.

Every pool host (pool1, pool2, ...) is a monolithic ``libvirtd`` running in
its own mount and network namespace.  Inside the mount namespace the usual
libvirt directories are bind mounts of directories below ``<dir>/<pool>/``::

    /run/libvirt        <- <dir>/<pool>/run
    /var/lib/libvirt    <- <dir>/<pool>/lib
    /etc/libvirt        <- <dir>/<pool>/etc
    /var/log/libvirt    <- <dir>/<pool>/log
    /var/cache/libvirt  <- <dir>/<pool>/cache

so the daemon socket /run/libvirt/libvirt-sock is reachable from outside as
``<dir>/<pool>/run/libvirt-sock``.  The network namespace has only a
loopback interface; the NAT network ``machinery`` (bridge mcbr0) and its
dnsmasq and iptables rules live entirely inside it.

Usage::

    python3 lab/lab.py up --pools 3 --dir .lab [--image PATH]
    python3 lab/lab.py status --dir .lab [--json]
    python3 lab/lab.py down --dir .lab [--purge]

Must run as root.  Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
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

# (sub directory of the pool dir, mount point inside the pool's namespace)
BIND_MOUNTS = [
    ("run", "/run/libvirt"),
    ("lib", "/var/lib/libvirt"),
    ("etc", "/etc/libvirt"),
    ("log", "/var/log/libvirt"),
    ("cache", "/var/cache/libvirt"),
]

LIBVIRTD_CONF = """\
# Written by lab/lab.py for one lab pool host.  Paths are as seen inside the
# pool's mount namespace.
listen_tls = 0
listen_tcp = 0
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
min_workers = 2
max_workers = 8
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
# No cgroups and no private /dev namespace for QEMU in this container.
cgroup_controllers = [ ]
namespaces = [ ]
# QEMU stdout/stderr go straight to /var/log/libvirt/qemu/<dom>.log, so no
# virtlogd is needed.  No lock manager is configured (no virtlockd).
stdio_handler = "file"
"""

# Runs inside the new namespaces (as PID == the one unshare got) and turns
# into libvirtd.  $1 = pool dir (absolute), $2 = libvirtd binary.
NAMESPACE_SCRIPT = r"""
set -e
D="$1"
LIBVIRTD="$2"
mount --make-rprivate /
# A sysfs mounted from inside the new network namespace shows that
# namespace's interfaces (mcbr0, vnetN) instead of the machine's.
mount -t sysfs lab-sysfs /sys
mount --bind "$D/run" /run/libvirt
mount --bind "$D/lib" /var/lib/libvirt
mount --bind "$D/etc" /etc/libvirt
mount --bind "$D/log" /var/log/libvirt
mount --bind "$D/cache" /var/cache/libvirt
ip link set lo up
exec "$LIBVIRTD" --pid-file "$D/libvirtd.pid" --config /etc/libvirt/libvirtd.conf
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

    # -- state ------------------------------------------------------------

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

    def prepare(self) -> None:
        for sub, _mountpoint in BIND_MOUNTS:
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        etc = self.dir / "etc"
        (etc / "libvirtd.conf").write_text(LIBVIRTD_CONF)
        (etc / "qemu.conf").write_text(QEMU_CONF)
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

    def seed_capabilities(self, donors: list["Pool"]) -> None:
        """Copy QEMU capability cache from another pool (same binaries) to
        skip the expensive first probe."""
        dst = self.dir / "cache" / "qemu" / "capabilities"
        if dst.is_dir() and any(dst.glob("*.xml")):
            return
        for donor in donors:
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
    for tool in ("virsh", "unshare"):
        if not shutil.which(tool, path=CHILD_ENV["PATH"]):
            raise LabError(f"{tool} not found")
    return path


def write_lab_json(lab_dir: Path, image: str | None) -> None:
    running = [p for p in existing_pools(lab_dir) if p.daemon_pid() is not None]
    data = {
        "pools": [
            {
                "name": p.name,
                "uri": p.uri,
                "network": NETWORK_NAME,
                "storage_pool": STORAGE_POOL_NAME,
            }
            for p in running
        ],
        "image": image,
    }
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


def cmd_up(args: argparse.Namespace) -> int:
    require_root()
    lab_dir: Path = args.dir
    if not 1 <= args.pools <= MAX_POOLS:
        raise LabError(f"--pools must be between 1 and {MAX_POOLS}")
    libvirtd = find_libvirtd()
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
    to_start = []
    for pool in wanted:
        if pool.daemon_pid() is not None:
            log(f"{pool.name}: already running (pid {pool.daemon_pid()})")
            continue
        if pool.state() == "stale":
            log(f"{pool.name}: cleaning up after a dead daemon")
            pool.kill_everything()
        pool.clear_runtime()
        pool.prepare()
        to_start.append(pool)

    # The first QEMU capability probe costs seconds of CPU; do it once and let
    # the other pools start from a copy of the cache.
    donors = [
        p for p in existing_pools(lab_dir) if any((p.dir / "cache/qemu/capabilities").glob("*.xml"))
    ]
    first_batch, second_batch = to_start, []
    if to_start and not donors:
        first_batch, second_batch = to_start[:1], to_start[1:]
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
        donors = donors or batch

    for pool in wanted:
        pool.wait_ready(args.timeout)
        pool.ensure_resources()

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


def cmd_status(args: argparse.Namespace) -> int:
    lab_dir: Path = args.dir
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
                "domains": doms[0] if doms else None,
                "running_domains": doms[1] if doms else None,
            }
        )
    if args.json:
        print(
            json.dumps(
                {"dir": str(lab_dir), "pools": rows, "image": read_lab_json(lab_dir).get("image")},
                indent=2,
            )
        )
        return 0
    if not rows:
        print(f"no lab pools in {lab_dir}")
        return 0
    for r in rows:
        doms = (
            "-"
            if r["domains"] is None
            else f"{r['domains']} domains, {r['running_domains']} running"
        )
        print(f"{r['name']:<8} {r['state']:<8} pid={r['pid'] or '-':<8} {r['uri']}  {doms}")
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
        "--timeout",
        type=float,
        default=120,
        help="seconds to wait for each daemon to answer (default 120)",
    )
    p_up.set_defaults(func=cmd_up)

    p_down = sub.add_parser("down", help="stop everything the lab started (idempotent)")
    add_dir(p_down)
    p_down.add_argument("--purge", action="store_true", help="also delete the lab directory")
    p_down.set_defaults(func=cmd_down)

    p_status = sub.add_parser("status", help="show the pool hosts")
    add_dir(p_status)
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_status.set_defaults(func=cmd_status)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LabError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
