"""Growing a fleet: ADD machines created on pools that already hold HOLD of them, by machine_batch or machine_set.

    python benchmarks/grow_scale.py --lab .lab/lab.json [--kind batch|set] [--hold 1000] [--add 100] [--pools 10]
                                    [--rounds 3] [--before DIR]

Creating on empty pools (parallel_floor.py) does not show what a create costs that grows with the machines
already on its pool: the room check against the run's listing, the records read under the admission lock. Here
the pools first get HOLD machines (class bench, state present, no NIC), then each round creates ADD more in one
module process and removes them again, untimed: with --kind batch (the default) a machine_batch of bench-g-...
beside HOLD bench-h-...; with --kind set the machine set bngrow scaled from HOLD to HOLD+ADD replicas, and back.
--hold 0 measures creates on empty pools, module against module. With --before DIR (a directory holding
ansible_collections/machinery/compute, an older commit unpacked with git archive) the same round runs from that
copy too, in turns with this one. Prints each side's medians: the module's wall time and its CPU, and the CPU the
pools' libvirtds spent meanwhile; then removes every machine it made.
"""

import argparse
import json
import os
import statistics
import tempfile

from common import cpu_of, timed_module
from parallel_floor import prepare, wipe

HERE = os.path.dirname(os.path.abspath(__file__))


def batch_file(pools, image, prefix, count):
    machines = [{"name": "%s%04d" % (prefix, index), "machine_class": "bench", "image": image, "state": "present",
                 "network_interfaces": [], "wait": "none"} for index in range(count)]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {"pools": pools, "machines": machines, "workers": 16}}, handle)
    return handle.name


def set_file(pools, image, replicas):
    template = {"machine_class": "bench", "image": image, "labels": {"bench": "grow"}, "network_interfaces": [],
                "state": "present"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {"pools": pools, "name": "bngrow", "replicas": replicas, "wait": "none",
                                           "selector": {"match_labels": {"bench": "grow"}}, "template": template,
                                           "workers": 16}}, handle)
    return handle.name


def module(name, path, pythonpath=None):
    """(wall seconds, CPU seconds of the module process) of one run of module ``name``; exits unless it
    succeeded."""
    result, elapsed, cpu = timed_module(name, path, pythonpath)
    if result.get("failed"):
        raise SystemExit("%s failed: %s" % (name, result.get("msg")))
    return elapsed, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--kind", choices=("batch", "set"), default="batch")
    parser.add_argument("--hold", type=int, default=1000)
    parser.add_argument("--add", type=int, default=100)
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="a directory holding another copy of the collection to compare with")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    pools = [{"name": entry["name"], "uri": entry["uri"]} for entry in lab["pools"][:options.pools]]
    prepare(pools, lab["image"], -(-(options.hold + options.add) // len(pools)))
    if options.kind == "set":
        name, held, grown = "machine_set", set_file(pools, lab["image"], options.hold), \
            set_file(pools, lab["image"], options.hold + options.add)
    else:
        name, held, grown = "machine_batch", batch_file(pools, lab["image"], "bench-h-", options.hold), \
            batch_file(pools, lab["image"], "bench-g-", options.add)
    sides = [("after", None)] + ([("before", os.path.abspath(options.before))] if options.before else [])
    samples = {}
    try:
        module(name, held)
        for _round in range(options.rounds):
            for label, path in sides:
                (wall, module_cpu), _machine_cpu, daemons_cpu = cpu_of(module, name, grown, path)
                samples.setdefault(label, []).append((wall, module_cpu, daemons_cpu))
                if options.kind == "set":
                    module(name, held)  # back to HOLD replicas, untimed
                else:
                    wipe(pools, "bench-g-")
    finally:
        if options.kind == "set":
            with open(held) as handle:
                args = json.load(handle)
            args["ANSIBLE_MODULE_ARGS"].update(state="absent", replicas=0)
            with open(held, "w") as handle:
                json.dump(args, handle)
            module(name, held)
        wipe(pools, "bench-")
        os.unlink(held)
        os.unlink(grown)
    report = {"kind": options.kind, "hold": options.hold, "add": options.add, "pools": len(pools),
              "rounds": options.rounds,
              "load": [round(value, 2) for value in os.getloadavg()]}
    for label, values in samples.items():
        report[label] = {key: round(statistics.median(value[index] for value in values), 2)
                         for index, key in enumerate(("wall_s", "module_cpu_s", "daemons_cpu_s"))}
        report[label]["module_cpu_samples"] = [round(value[1], 2) for value in values]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
