"""machine_batch and the inventory over each transport the lab offers: unix socket, ssh, tls (and qemu+ssh through
the OpenSSH client). Run by hand against a lab of lab/lab.py, not by make test:

    python3 lab/lab.py up --pools 3 --dir .lab/bench --image .lab/image/machinery-test.qcow2
    .venv/bin/python benchmarks/transports.py --lab .lab/bench/lab.json --machines 30

For each transport, in this order: machine_batch creating --machines machines (state present: defined, not
started) spread over every pool, the same batch again (converged, no change), the inventory plugin cold
(ansible-inventory --list, no cache), and the batch deleting them. Each figure is the median of --rounds runs,
in seconds of wall time; "x unix" is the ratio to the same step over the unix sockets. For the ssh transports the
sessions the lab's sshd let in during each step are counted from its log: the goal is one per pool per run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import run_module  # noqa: E402  (benchmarks/ is not a package)

BIN = os.path.dirname(sys.executable)
CLASS = {"name": "small", "cpu": 1, "memory": "128Mi"}


def sessions(lab):
    try:
        with open(lab["ssh"]["log"]) as handle:
            return sum(1 for line in handle if "Accepted publickey" in line)
    except (OSError, TypeError, KeyError):
        return 0


def timed(lab, step):
    """(seconds, ssh sessions) of one call of ``step``."""
    before = sessions(lab)
    started = time.monotonic()
    step()
    return time.monotonic() - started, sessions(lab) - before


def inventory_cold(entries):
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "bench.machinery.yml")
        with open(source, "w") as handle:
            json.dump({"plugin": "machinery.compute.machines", "pools": entries, "strict": True}, handle)
        proc = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", source, "--list"], capture_output=True,
                              text=True, check=False, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    if proc.returncode != 0:
        raise SystemExit("ansible-inventory failed: %s" % proc.stderr)
    return len(json.loads(proc.stdout)["_meta"]["hostvars"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--lab", default=os.path.join(os.path.dirname(HERE), ".lab", "lab.json"))
    parser.add_argument("--machines", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--transports", default="unix,ssh,tls,openssh")
    args = parser.parse_args()
    with open(args.lab) as handle:
        lab = json.load(handle)
    pools = lab["pools"]
    transports = args.transports.split(",")
    if lab.get("ssh"):
        # qemu+ssh runs the OpenSSH client: the lab's wrapper makes it check the lab's known_hosts
        os.environ["PATH"] = lab["ssh"]["client_path"] + os.pathsep + os.environ["PATH"]
    for pool in pools:
        run_module("machine_pool", {"uri": pool["uri"], "name": pool["name"], "networks": [{"name": "machinery"}],
                                    "overcommit": {"cpu": 16.0, "memory": 1.0}})
        run_module("machine_class", dict(CLASS, uri=pool["uri"]))
    names = ["bench-tr-%03d" % index for index in range(args.machines)]
    present = [{"name": name, "machine_class": "small", "image": lab["image"], "state": "present",
                "network_interfaces": []} for name in names]
    absent = [{"name": name, "state": "absent"} for name in names]
    unix = [{"name": pool["name"], "uri": pool["uri"]} for pool in pools]
    run_module("machine_batch", {"pools": unix, "machines": absent})

    figures = {}
    for transport in transports:
        entries = [{"name": pool["name"], "uri": pool["uris"][transport]} for pool in pools]
        rows = {"create": [], "converged": [], "inventory cold": [], "delete": []}
        for _round in range(args.rounds):
            rows["create"].append(timed(lab, lambda: run_module("machine_batch", {"pools": entries,
                                                                                  "machines": present})))
            rows["converged"].append(timed(lab, lambda: run_module("machine_batch", {"pools": entries,
                                                                                     "machines": present})))
            rows["inventory cold"].append(timed(lab, lambda: inventory_cold(entries)))
            rows["delete"].append(timed(lab, lambda: run_module("machine_batch", {"pools": entries,
                                                                                  "machines": absent})))
        figures[transport] = {step: (statistics.median(v[0] for v in values), max(v[1] for v in values))
                              for step, values in rows.items()}

    print("%d machines on %d pools, median of %d round(s), load average %.1f at the end"
          % (args.machines, len(pools), args.rounds, os.getloadavg()[0]))
    print("%-9s %-15s %8s %8s %9s" % ("transport", "step", "seconds", "x unix", "sessions"))
    for transport in transports:
        for step, (seconds, count) in figures[transport].items():
            base = figures.get("unix", {}).get(step, (None,))[0]
            ratio = "%.2f" % (seconds / base) if base else "-"
            shown = str(count) if transport in ("ssh", "openssh") else "-"
            print("%-9s %-15s %8.2f %8s %9s" % (transport, step, seconds, ratio, shown))


if __name__ == "__main__":
    main()
