"""Hot-plug latency, request to guest-visible, and the leftover check of a create/attach/delete cycle.

latency: a running guest from the test image; volume_attach / nic_attach are run as Ansible runs them, and the
         clock stops when the guest's own console shows MACHINERY-BLOCK-ADDED / -REMOVED, MACHINERY-NIC-ADDED /
         -REMOVED (the guest polls its devices once a second, so up to 1 s of each figure is that poll).
leftovers: N machines (default 20) created with machine_batch, each given an ephemeral volume and one shared
         referenced volume, then deleted; the pool's volumes are listed from libvirt before and after.
"""

import argparse
import json
import os
import statistics
import time

import libvirt

from common import run_module

HERE = os.path.dirname(os.path.abspath(__file__))


def console(conn, machine):
    pool = conn.storagePoolLookupByName("machinery")
    pool.refresh(0)
    vol = pool.storageVolLookupByName("%s-console.log" % machine)
    stream = conn.newStream(0)
    vol.download(stream, 0, 0, 0)
    chunks = []
    while True:
        data = stream.recv(1 << 20)
        if not data or data == -2:
            break
        chunks.append(data)
    stream.finish()
    return b"".join(chunks).decode(errors="replace")


def timed(conn, machine, marker, action, timeout=60):
    """Seconds from starting ``action`` until one more line with ``marker`` is on the console."""
    before = console(conn, machine).count(marker)
    start = time.perf_counter()
    action()
    while console(conn, machine).count(marker) <= before:
        if time.perf_counter() - start > timeout:
            raise SystemExit("the guest never printed %s" % marker)
        time.sleep(0.05)
    return time.perf_counter() - start


def volumes(conn):
    pool = conn.storagePoolLookupByName("machinery")
    pool.refresh(0)
    return sorted(pool.listVolumes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--machines", type=int, default=20)
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    entry = lab["pools"][0]
    uri = entry["uri"]
    conn = libvirt.open(uri)
    run_module("machine_pool", {"uri": uri, "name": entry["name"], "networks": [{"name": "machinery"}],
                                "overcommit": {"cpu": 32.0}})
    run_module("machine_class", {"uri": uri, "name": "bench", "cpu": 1, "memory": "128Mi"})
    name = "hotplug-bench"
    run_module("machine", {"uri": uri, "name": name, "state": "absent", "shutdown_timeout": 2})
    run_module("machine", {"uri": uri, "name": name, "machine_class": "bench", "image": lab["image"],
                           "wait": "address"})
    deadline = time.time() + 120
    while "MACHINERY-READY" not in console(conn, name) and time.time() < deadline:
        time.sleep(0.5)
    timings = {"disk_plug": [], "disk_unplug": [], "nic_plug": [], "nic_unplug": []}
    volume = {"uri": uri, "machine": name, "volume": name + "-hot.qcow2", "size": "64Mi", "ephemeral": True}
    nic = {"uri": uri, "machine": name, "name": "eth1", "network": "machinery"}
    for _round in range(options.rounds):
        timings["disk_plug"].append(timed(conn, name, "MACHINERY-BLOCK-ADDED",
                                          lambda: run_module("volume_attach", volume)))
        timings["disk_unplug"].append(timed(conn, name, "MACHINERY-BLOCK-REMOVED",
                                            lambda: run_module("volume_attach", dict(volume, state="detached"))))
        timings["nic_plug"].append(timed(conn, name, "MACHINERY-NIC-ADDED", lambda: run_module("nic_attach", nic)))
        timings["nic_unplug"].append(timed(conn, name, "MACHINERY-NIC-REMOVED",
                                           lambda: run_module("nic_attach", dict(nic, state="detached"))))
    run_module("machine", {"uri": uri, "name": name, "state": "absent", "shutdown_timeout": 5})
    report = {"rounds": options.rounds}
    for key, values in timings.items():
        report[key + "_median_s"] = round(statistics.median(values), 2)
        report[key + "_max_s"] = round(max(values), 2)

    before = volumes(conn)
    names = ["cycle-%02d" % index for index in range(options.machines)]
    shared = "cycle-shared.raw"
    run_module("machine_batch", {"pools": [uri], "machines": [
        {"name": machine, "machine_class": "bench", "image": lab["image"], "state": "present",
         "network_interfaces": [{"name": "eth0", "network": "machinery"}], "ignition": {"ignition": {}},
         "cloud_init": {"user_data": {"runcmd": ["true"]}}} for machine in names]})
    for index, machine in enumerate(names):
        run_module("volume_attach", {"uri": uri, "machine": machine, "volume": machine + "-extra.qcow2",
                                     "size": "16Mi", "ephemeral": True})
        run_module("volume_attach", {"uri": uri, "machine": machine, "volume": shared, "size": "16Mi",
                                     "format": "raw", "shareable": True})
    during = volumes(conn)
    run_module("machine_batch", {"pools": [uri], "machines": [{"name": m, "state": "absent"} for m in names]})
    after = volumes(conn)
    leftovers = sorted(set(after) - set(before) - {shared})
    report.update(cycle_machines=options.machines, volumes_before=len(before), volumes_during=len(during),
                  volumes_after=len(after), referenced_kept=shared in after, leftovers=leftovers)
    pool = conn.storagePoolLookupByName("machinery")
    if shared in after:
        pool.storageVolLookupByName(shared).delete(0)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
