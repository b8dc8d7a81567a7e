"""The time of make test's steps: each step's wall clock and the CPU its processes used, and a table of them.

    python3 tests/steptime.py FILE NAME COMMAND [ARGS...]   run COMMAND, append a row for NAME to FILE
    python3 tests/steptime.py FILE                          print FILE's rows as a table

COMMAND runs with this process's file descriptors (make's jobserver among them) and its exit status is this
process's: a step killed by a signal kills this process with the same signal. The row records the step's wall
seconds, the CPU seconds of every process below it, the CPU seconds the whole machine spent meanwhile (other
users' work included: the cores are shared) and the 1-minute load average at its end.

The CPU of a step's daemons counts too: this process is a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so the
libvirtd a lab starts and the QEMU each libvirtd daemonizes end as its children, and reaping them adds their CPU
to its own children's. A process still running when COMMAND ends (a lab left up for a later step) is not waited
for here: it passes to the step that runs this one, if any, and counts there. So a step inside another (the table
indents it) does not count the guests of a lab its parent brought up; the parent does.

Under make -n nothing is recorded: make runs the recursive make a step wraps even then.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """CPU seconds the machine's cores have been busy since boot (every field of /proc/stat's cpu line but idle
    and iowait)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLOCK_TICKS


def load_average():
    with open("/proc/loadavg", encoding="ascii") as handle:
        return float(handle.read().split()[0])


def dry_run():
    """True inside make -n: MAKEFLAGS' first word holds the single-letter flags, n among them."""
    flags = os.environ.get("MAKEFLAGS", "").split(" ", 1)[0]
    return not flags.startswith("-") and "n" in flags


def run(path, name, argv):
    libc = ctypes.CDLL(None, use_errno=True)
    subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    started, busy_before = time.time(), machine_cpu()
    parents = [part for part in os.environ.get("STEPTIME_PARENTS", "").split("/") if part]
    pid = os.posix_spawnp(argv[0], argv, dict(os.environ, STEPTIME_PARENTS="/".join(parents + [name])))
    # ^C reaches the whole foreground process group: the step decides what it does with it, and this process
    # waits to pass on how the step ended.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    status = None
    while status is None:
        try:
            child, child_status = os.wait()
        except ChildProcessError:
            break
        if child == pid:
            status = child_status
    # what ended and waits to be reaped (a daemon stopped at the step's end); what still runs is left alone
    while True:
        try:
            child, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if child == 0:
            break
    wall = time.time() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not dry_run():
        record = {"step": name, "depth": len(parents), "start": round(started, 3), "wall": round(wall, 1),
                  "cpu": round(usage.ru_utime + usage.ru_stime, 1),
                  "machine_cpu": round(machine_cpu() - busy_before, 1), "load": load_average(),
                  "rc": os.waitstatus_to_exitcode(status), "daemons_counted": subreaper}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    return os.waitstatus_to_exitcode(status)


def table(path):
    try:
        with open(path, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        rows = []
    if not rows:
        print("no steps recorded in %s" % path)
        return 0
    rows.sort(key=lambda row: row["start"])
    first = rows[0]["start"]
    lines = [("step", "start s", "wall s", "cpu s", "cores", "machine cpu s", "load", "rc")]
    for row in rows:
        lines.append(("  " * row.get("depth", 0) + row["step"], "%.0f" % (row["start"] - first), "%.1f" % row["wall"], "%.1f" % row["cpu"],
                      "%.2f" % (row["cpu"] / row["wall"] if row["wall"] else 0), "%.1f" % row["machine_cpu"],
                      "%.2f" % row["load"], str(row["rc"])))
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    print("-- make's steps (%s), in seconds. start: after the first step's; cpu: the step's processes and the" % path)
    print("   daemons and guests it started (an indented step is part of the one above, which counts the guests of the")
    print("   labs it brought up); cores: cpu / wall; machine cpu: every process's on the machine meanwhile, other")
    print("   users' too; load: the 1-minute load average at the step's end")
    for line in lines:
        print("  ".join([line[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(line[1:], widths[1:])]))
    return 0


def main(args):
    if len(args) == 1:
        return table(args[0])
    if len(args) < 3:
        sys.stderr.write(__doc__)
        return 2
    return run(args[0], args[1], args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
