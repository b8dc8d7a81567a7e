"""What each machine capability (issue 13) adds to creating a machine.

The machine module creates a machine (state present: defined, not started, so guest boots do not blur the
numbers) once without capabilities and once with each capability alone: a CPU topology, swap, a volume with QoS
limits (against the same volume without), an encrypted volume (against the same volume plain) and a fixed
address. Each round runs every variant in turn (deleted after each); the median wall time of the module run is
reported with its difference from its baseline. The image is cached on the pool before timing starts.

Run by hand against a lab:  .venv/bin/python benchmarks/capabilities.py --lab .lab/<dir>/lab.json
"""

import argparse
import ipaddress
import json
import os
import statistics
import time
import xml.etree.ElementTree as ET

import libvirt

from common import run_module

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "bench-cap"


def variants(ip):
    volume = {"name": "data", "size": "64Mi"}
    return [
        ("baseline", "baseline", {}),
        ("topology", "baseline", {"cpu": 2, "topology": {"sockets": 2, "cores": 1, "threads": 1}}),
        ("swap", "baseline", {"swap": "64Mi"}),
        ("ip_address", "baseline", {"network_interfaces": [{"name": "eth0", "network": "machinery",
                                                            "ip_address": ip}]}),
        ("volume", "baseline", {"volumes": [volume]}),
        ("volume + iops/throughput", "volume", {"volumes": [dict(volume, iops=500, throughput=200)]}),
        ("volume + encrypted", "volume", {"volumes": [dict(volume, encrypted=True,
                                                           passphrase="benchmark passphrase")]}),
    ]


def free_address(uri):
    conn = libvirt.open(uri)
    try:
        tree = ET.fromstring(conn.networkLookupByName("machinery").XMLDesc(0))
    finally:
        conn.close()
    return str(ipaddress.IPv4Address(tree.find("ip/dhcp/range").get("end")) - 40)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--pool", type=int, default=0, help="index of the lab pool to use")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    entry = lab["pools"][options.pool]
    uri = entry["uri"]
    run_module("machine_pool", {"uri": uri, "name": entry["name"], "networks": [{"name": "machinery"}],
                                "overcommit": {"cpu": 16.0, "memory": 1.0}})
    base = {"uri": uri, "name": NAME, "cpu": 1, "memory": "128Mi", "image": lab["image"], "state": "present",
            "wait": "none", "network_interfaces": []}
    run_module("machine", dict(base, state="absent"))
    run_module("machine", base)  # caches the image
    run_module("machine", dict(base, state="absent"))
    cases = variants(free_address(uri))
    times = {label: [] for label, _against, _extra in cases}
    for _round in range(options.rounds):  # variants interleaved, so a change of load hits them all alike
        for label, _against, extra in cases:
            start = time.perf_counter()
            run_module("machine", dict(base, **extra))
            times[label].append(time.perf_counter() - start)
            run_module("machine", dict(base, state="absent"))
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, against, _extra in cases:
        values = times[label]
        added = ""
        if label != against:
            added = "  %+6.0f ms against %s" % ((medians[label] - medians[against]) * 1000, against)
        print("%-26s median %6.0f ms (min %4.0f, max %4.0f, %d rounds)%s"
              % (label, medians[label] * 1000, min(values) * 1000, max(values) * 1000, len(values), added))


if __name__ == "__main__":
    main()
