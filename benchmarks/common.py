"""What the benchmarks share: running a module of the collection as Ansible runs it on a host."""

import json
import os
import subprocess
import sys
import tempfile

MODULES = "ansible_collections.machinery.compute.plugins.modules."


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
