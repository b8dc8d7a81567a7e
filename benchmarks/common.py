"""What the benchmarks share: running a module of the collection as Ansible runs it on a host."""

import json
import os
import subprocess
import sys
import tempfile
import time

MODULES = "ansible_collections.machinery.compute.plugins.modules."


def busy_seconds():
    """CPU seconds the machine's cores have spent busy since boot, every process counted (all of /proc/stat's first
    line but idle and iowait): the difference around a run is the CPU that run cost the whole machine, the
    libvirtds and their qemu-img included."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def daemon_seconds():
    """CPU seconds the libvirtd processes running now have spent, with their reaped children (qemu-img): the
    pools' side of the work, as opposed to the controller's."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                stat = handle.read()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if name == "libvirtd":
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def cpu_of(work, *args, **kwargs):
    """(work's result, the CPU seconds the machine spent meanwhile, the part of it the libvirtds spent)."""
    before, daemons = busy_seconds(), daemon_seconds()
    result = work(*args, **kwargs)
    return result, busy_seconds() - before, daemon_seconds() - daemons


def timed_module(name, path, pythonpath=None):
    """(result, wall seconds, CPU seconds of its process) of machinery.compute.<name> run in its own process on
    the JSON arguments in ``path``, from the copy of the collection at ``pythonpath`` when given."""
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else dict(os.environ)
    before, start = os.times(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", MODULES + name, path], capture_output=True, text=True, env=env,
                          check=False)
    elapsed, after = time.perf_counter() - start, os.times()
    cpu = after.children_user + after.children_system - before.children_user - before.children_system
    return json.loads(proc.stdout[proc.stdout.index("{"):]), elapsed, cpu


def run_module(name, args):
    """machinery.compute.<name> in its own process with JSON arguments; its result, or exit on failure."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        proc = subprocess.run([sys.executable, "-m", MODULES + name, handle.name], capture_output=True,
                              text=True, check=False)
    finally:
        os.unlink(handle.name)
    result = json.loads(proc.stdout[proc.stdout.index("{"):])
    if result.get("failed"):
        raise SystemExit("%s failed: %s" % (name, result["msg"]))
    return result
