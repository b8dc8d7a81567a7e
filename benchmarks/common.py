"""What the benchmarks share: running a module of the collection as Ansible runs it on a host."""

import json
import os
import subprocess
import sys
import tempfile

MODULES = "ansible_collections.machinery.compute.plugins.modules."


def busy_seconds():
    """CPU seconds the machine's cores have spent busy since boot, every process counted (all of /proc/stat's first
    line but idle and iowait): the difference around a run is the CPU that run cost the whole machine, the
    libvirtds and their qemu-img included."""
    with open("/proc/stat") as handle:
        fields = [int(value) for value in handle.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_of(work, *args, **kwargs):
    """(work's result, the CPU seconds the machine spent meanwhile)."""
    before = busy_seconds()
    result = work(*args, **kwargs)
    return result, busy_seconds() - before


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
