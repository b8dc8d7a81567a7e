"""What a manifest costs to plan: check mode of machinery.compute.manifest over N new MachineClass documents on
every pool of a lab, and over a small document of nested YAML aliases.

    python benchmarks/manifest_scale.py --lab .lab/lab.json --classes 500 [--aliases 10] [--before DIR]

Classes: N IronCore MachineClass documents (bench-mc-0000 ...) that no pool publishes yet, in check mode on every
pool of the lab (registered first when they are not): each plans a publish on each pool and writes nothing. The
cost of a class document that does not exist yet is the point: its absence must not be waited for.
Aliases: a document of a few hundred bytes whose anchors each name the one before ten times, LEVELS deep (the
last level stands for 10**LEVELS nodes once expanded): it must be refused or read at once, not walked node by node.

With --before DIR (a directory holding ansible_collections/machinery/compute, e.g. an older commit unpacked with
git archive) the same runs are made from that copy first. Prints wall and CPU seconds of each run and the load
average before and after it.
"""

import argparse
import json
import os
import tempfile

from common import run_module, timed_module

HERE = os.path.dirname(os.path.abspath(__file__))


def class_documents(count):
    return [{"apiVersion": "compute.ironcore.dev/v1alpha1", "kind": "MachineClass",
             "metadata": {"name": "bench-mc-%04d" % index},
             "capabilities": {"cpu": 1 + index % 4, "memory": "%dMi" % (128 * (1 + index % 8))}}
            for index in range(count)]


def alias_document(levels):
    """A MachineClass whose labels hold an alias bomb of ``levels`` levels, as YAML text."""
    lines = ["apiVersion: compute.ironcore.dev/v1alpha1", "kind: MachineClass",
             "metadata:", "  name: bench-alias", "  annotations:",
             "    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        lines.append("    l%d: &l%d [%s]" % (level, level, ", ".join(["*l%d" % (level - 1)] * 10)))
    lines += ["capabilities:", "  cpu: 1", "  memory: 128Mi"]
    return "\n".join(lines) + "\n"


def loadavg():
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def timed_run(label, args, pythonpath):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=True)}, handle)
    load = loadavg()
    try:
        result, elapsed, cpu = timed_module("manifest", handle.name, pythonpath)
    finally:
        os.unlink(handle.name)
    outcome = "failed: %s" % result.get("msg", "")[:160] if result.get("failed") else \
        "changed=%s, %d action(s)" % (result.get("changed"), len(result.get("actions", [])))
    print("%-28s %8.1f s wall %7.1f s cpu   load %s -> %s   %s"
          % (label, elapsed, cpu, load, loadavg(), outcome), flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--classes", type=int, default=500)
    parser.add_argument("--aliases", type=int, default=10, help="levels of the alias document (0: none)")
    parser.add_argument("--before", help="an older copy of the collection to run first")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    pools = [{"name": pool["name"], "uri": pool["uri"]} for pool in lab["pools"]]
    for pool in pools:
        run_module("machine_pool", dict(pool, networks=[{"name": "machinery"}]))
    copies = ([("before", os.path.abspath(options.before))] if options.before else []) + [("this", None)]
    for label, pythonpath in copies:
        if options.classes:
            timed_run("%s: %d classes, %d pools" % (label, options.classes, len(pools)),
                      {"pools": pools, "definition": class_documents(options.classes)}, pythonpath)
        if options.aliases:
            with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
                handle.write(alias_document(options.aliases))
            try:
                timed_run("%s: %d alias levels" % (label, options.aliases),
                          {"pools": pools, "src": handle.name}, pythonpath)
            finally:
                os.unlink(handle.name)


if __name__ == "__main__":
    main()
