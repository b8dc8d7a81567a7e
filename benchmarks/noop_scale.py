"""The no-op re-run at scale: machine_batch (what the machines role runs) and machine_set over machines that are
already converged, each timed as the module process Ansible starts on the host, and through ansible-playbook.

    python benchmarks/noop_scale.py --lab .lab/lab.json --count 1000 --pools 10 [--before DIR] [--rounds 3]

The machines are those parallel_floor.py leaves with --keep (bench-r-0000 ... on the first POOLS pools, class
bench, state present, no NIC); the set's members are made first when missing (bnset, the same template as
parallel_floor.py). With --before DIR (a directory holding ansible_collections/machinery/compute, e.g. an older
commit unpacked with git archive) the same module runs from that copy too, in turns with this one, so the two
are compared under the same load. "ansible floor playbook" is ansible-playbook running static_module.py with the
role's input (the same machines list) and returning the batch's very output: what ansible-core alone spends on a
task of that size; "ansible floor set playbook" the same with the set's input and output. "read floor" is the
same with read_floor_module.py, which also reads and parses every domain's XML on the pools in parallel: the least
a no-op can do. Prints the medians, each playbook's ratio to its floors and the load average.
"""

import argparse
import json
import os
import statistics
import tempfile

from common import timed_module
from fleet_sets import playbook
from parallel_floor import FLOOR_TASK, PLAY_FLOOR, PLAY_ROLE, PLAY_SET, module_output

HERE = os.path.dirname(os.path.abspath(__file__))


def batch_args(pools, image, count):
    machines = [{"name": "bench-r-%04d" % index, "machine_class": "bench", "image": image, "state": "present",
                 "network_interfaces": [], "wait": "none", "wait_timeout": 300, "shutdown_timeout": 60}
                for index in range(count)]
    return {"pools": pools, "machines": machines, "strategy": "spread", "retries": 3, "workers": 16}


def set_args(pools, image, count):
    return {"pools": pools, "name": "bnset", "replicas": count, "selector": {"match_labels": {"bench": "set"}},
            "template": {"machine_class": "bench", "image": image, "labels": {"bench": "set"},
                         "network_interfaces": [], "state": "present"}, "wait": "none"}


PLAY_SET_FLOOR = FLOOR_TASK + """        name: bnset
        replicas: "{{ replicas }}"
        selector: {match_labels: {bench: set}}
        template: {machine_class: bench, image: "{{ image }}", labels: {bench: set}, network_interfaces: [],
                   state: present}
        wait: none
"""


def module_run(name, args, pythonpath=None):
    """Wall seconds of the module in its own process; fails unless it reports changed=false."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        result, elapsed, _cpu = timed_module(name, handle.name, pythonpath)
    finally:
        os.unlink(handle.name)
    if result.get("failed") or result.get("changed"):
        raise SystemExit("%s was not a no-op: %s" % (name, result.get("msg") or result.get("actions")))
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="a directory holding another copy of the collection to compare with")
    parser.add_argument("--kind", choices=("both", "role", "set"), default="both",
                        help="measure one side only (10 pools have room for 1,280 bench machines: 1,000 of the "
                             "role and 1,000 of the set need 20, or one kind at a time)")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    pools = [{"name": entry["name"], "uri": entry["uri"]} for entry in lab["pools"][:options.pools]]
    image = lab["image"]
    kinds = ("batch", "set") if options.kind == "both" else ({"role": "batch"}.get(options.kind, options.kind),)
    if "set" in kinds:
        playbook(PLAY_SET, {"pools": pools, "image": image, "replicas": options.count})  # members, if missing
    floor_output = os.path.join(tempfile.mkdtemp(), "batch-output.json")
    set_output = os.path.join(os.path.dirname(floor_output), "set-output.json")
    os.environ["ANSIBLE_LIBRARY"] = HERE
    if "batch" in kinds:  # ansible-playbook's own floor: a module taking the role's input, returning this output
        module_output("machine_batch", batch_args(pools, image, options.count), floor_output)
    if "set" in kinds:  # the same for the set: its input, its output
        module_output("machine_set", set_args(pools, image, options.count), set_output)
    sides = [("after", None)] + ([("before", os.path.abspath(options.before))] if options.before else [])
    samples = {}
    for _round in range(options.rounds):
        for label, path in sides:
            if "batch" in kinds:
                samples.setdefault("batch " + label, []).append(
                    module_run("machine_batch", batch_args(pools, image, options.count), path))
            if "set" in kinds:
                samples.setdefault("set " + label, []).append(
                    module_run("machine_set", set_args(pools, image, options.count), path))
        if "batch" in kinds:
            machines = batch_args(pools, image, options.count)["machines"]
            samples.setdefault("role playbook", []).append(playbook(PLAY_ROLE, {"pools": pools, "machines": machines}))
            samples.setdefault("ansible floor playbook", []).append(playbook(
                PLAY_FLOOR, {"pools": pools, "machines": machines, "output": floor_output}))
            samples.setdefault("read floor playbook", []).append(playbook(
                PLAY_FLOOR.replace("static_module", "read_floor_module"),
                {"pools": pools, "machines": machines, "output": floor_output}))
        if "set" in kinds:
            samples.setdefault("set playbook", []).append(
                playbook(PLAY_SET, {"pools": pools, "image": image, "replicas": options.count}))
            samples.setdefault("ansible floor set playbook", []).append(playbook(
                PLAY_SET_FLOOR, {"pools": pools, "image": image, "replicas": options.count, "output": set_output}))
            samples.setdefault("read floor set playbook", []).append(playbook(
                PLAY_SET_FLOOR.replace("static_module", "read_floor_module"),
                {"pools": pools, "image": image, "replicas": options.count, "output": set_output}))
    report = {"machines": options.count, "pools": options.pools, "rounds": options.rounds,
              "load": [round(value, 2) for value in os.getloadavg()]}
    report.update((key, round(statistics.median(values), 2)) for key, values in samples.items())
    report["samples"] = {key: [round(value, 2) for value in values] for key, values in samples.items()}
    for playbook_key, floor_key, read_key in (
            ("role playbook", "ansible floor playbook", "read floor playbook"),
            ("set playbook", "ansible floor set playbook", "read floor set playbook")):
        if playbook_key in report:
            report[playbook_key + " / floor"] = round(report[playbook_key] / report[floor_key], 2)
            report[read_key + " / floor"] = round(report[read_key] / report[floor_key], 2)
            report[playbook_key + " / read floor"] = round(report[playbook_key] / report[read_key], 2)
    if options.before:
        for kind in kinds:
            report[kind + " before/after"] = round(report[kind + " before"] / report[kind + " after"], 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
