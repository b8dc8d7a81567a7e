"""Creating N machines on P pools from nothing, against the parallel raw floor; then the no-op re-run.

For each size COUNT:POOLS (default 30:3 and 300:10), on the first POOLS pools of the lab, the machines spread
evenly, every one `state: present` (defined with its disks, not started) from the lab image, class bench (1 cpu,
128Mi), no NIC:
  floor   a hand-written libvirt-python script: one thread and one connection per pool, each making a thin
          qcow2 overlay on the cached image and defining the domain, with the very XML the collection builds
          (taken from a warm-up machine, so it is the same size);
  role    the machines role (machine_batch) through ansible-playbook: create, then the no-op re-run;
  set     machinery.compute.machine_set with replicas COUNT through ansible-playbook: create, then the no-op.
The three run back to back within a size, so a busy spell of the shared machine falls on all of them; each side's
machines are removed (straight through libvirt, untimed) before the next. The ratios role/floor and set/floor
and seconds per machine are printed, and the same net of a run's fixed cost (the role with no machine:
ansible-playbook starting, the module shipped, a connection and a listing per pool); --json writes them, --plot draws seconds per machine against size.
Each timed side also records the CPU the whole machine spent on it (every process, the libvirtds and qemu-img
too, from /proc/stat): floor_cores_busy says how many cores the floor kept busy (on two cores, near 2 means the
floor is the CPU's), and role_net_cpu_vs_floor / set_net_cpu_vs_floor compare the CPU each spent net of the empty
run with the floor's: where the floor already fills the cores, the wall-time ratio cannot go below that. The
*_daemons_cpu_s part of each is what the pools' libvirtds spent (with the qemu-img they ran): the rest is the
controller's (ansible-playbook, the module, or the floor's script).
--keep leaves the role's machines of the last size defined (for profiling the no-op).
--kept adds two floors: the kept floor, the raw floor doing also what the collection's create keeps on purpose and
libvirt has no cheaper form of (per machine, the hold: a lock volume made in the pool's registry and deleted; and
the read-back of the defined domain's XML and state), and ansible-core's floor of the role's input and output
(static_module.py returning the very result machine_batch returned, net of the same with no machine). Their sum
is the composite floor: role_net_vs_composite is what the collection's own code costs beyond both.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.coordination.keys import hold_volume
from common import MODULES, cpu_of, run_module
from fleet_sets import playbook

HERE = os.path.dirname(os.path.abspath(__file__))
WARM = "bench-warm"
PLAY_ROLE = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: machinery.compute.machines
      vars:
        machines_pools: "{{ pools }}"
        machines_wait: none
        machines_show_table: false
        machines_return_machines: "{{ return_machines | default('all') }}"
        machines_list: "{{ machines }}"
"""
PLAY_SET = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - machinery.compute.machine_set:
        pools: "{{ pools }}"
        name: bnset
        state: "{{ state | default('present') }}"
        replicas: "{{ replicas | default(0) }}"
        selector: {match_labels: {bench: set}}
        template: {machine_class: bench, image: "{{ image }}", labels: {bench: set}, network_interfaces: [],
                   state: present}
        wait: none
"""


def each_pool(pools, work):
    """work(entry) on a thread per pool; results in pool order (an exception in a thread is re-raised)."""
    results = [None] * len(pools)

    def one(index, entry):
        try:
            results[index] = work(entry)
        except BaseException as exc:  # pylint: disable=broad-except
            results[index] = exc
    threads = [threading.Thread(target=one, args=(index, entry)) for index, entry in enumerate(pools)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def wipe(pools, prefix):
    """Every domain and volume whose name starts with ``prefix``, gone from every pool (in parallel)."""
    def one(entry):
        conn = libvirt.open(entry["uri"])
        try:
            for dom in conn.listAllDomains(0):
                if dom.name().startswith(prefix):
                    if dom.isActive():
                        dom.destroy()
                    dom.undefine()
            pool = conn.storagePoolLookupByName("machinery")
            pool.refresh(0)
            for vol in pool.listAllVolumes(0):
                if vol.name().startswith(prefix):
                    vol.delete(0)
        finally:
            conn.close()
    each_pool(pools, one)


def prepare(pools, image, per_pool):
    """Pools registered with room for ``per_pool`` machines, class bench published, the image cached; the
    collection's XML of a warm-up machine per pool, with @NAME@ and @ROOT@ in place of its name and root disk."""
    templates = {}
    for entry in pools:
        run_module("machine_pool", {"uri": entry["uri"], "name": entry["name"], "networks": [{"name": "machinery"}],
                                    "overcommit": {"cpu": float(min(64, max(32, per_pool))), "memory": 8.0}})
        run_module("machine_class", {"uri": entry["uri"], "name": "bench", "cpu": 1, "memory": "128Mi"})
    wipe(pools, "bench-")
    for entry in pools:
        run_module("machine", {"uri": entry["uri"], "name": WARM, "machine_class": "bench", "image": image,
                               "state": "present", "network_interfaces": []})
        conn = libvirt.open(entry["uri"])
        tree = dx.parse(conn.lookupByName(WARM).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
        conn.close()
        tree.remove(tree.find("uuid"))
        root = [source.get("file") for source in tree.iter("source") if
                source.get("file", "").endswith(WARM + "-root.qcow2")][0]
        templates[entry["uri"]] = dx.tostring(tree).replace(root, "@ROOT@").replace(WARM, "@NAME@")
    wipe(pools, "bench-")
    return templates


def floor(pools, names, templates, checksum, kept=False):
    """Seconds the parallel raw floor takes to define ``names[uri]`` on every pool. ``kept``: each create also
    does the two things of the collection's create that libvirt has no cheaper form of and that the collection
    keeps on purpose: the hold on the machine (a lock volume made in the pool's registry before the create and
    deleted after: the only atomic primitive a libvirt connection offers, which keeps a create and a move,
    update or deletion of the same name apart) and the read-back of what was defined (its XML and state: the
    check that the create converged, and the status)."""
    def one(entry):
        conn = libvirt.open(entry["uri"])
        pool = conn.storagePoolLookupByName("machinery")
        registry = conn.storagePoolLookupByName("machinery-registry") if kept else None
        image_vol, fmt = images.cached_volume(pool, checksum)
        backing = (image_vol.path(), fmt)
        capacity = image_vol.info()[1]
        template = templates[entry["uri"]]
        for name in names[entry["uri"]]:
            hold = registry.createXML(storage.volume_xml(hold_volume(name), 1, "raw", mode="0600"), 0) if kept \
                else None
            root = storage.create_volume(pool, name + "-root.qcow2", capacity, "qcow2", backing=backing)
            dom = conn.defineXML(template.replace("@ROOT@", root.path()).replace("@NAME@", name))
            if kept:
                dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                dom.state()
                hold.delete(0)
        conn.close()
    start = time.perf_counter()
    each_pool(pools, one)
    return time.perf_counter() - start


def measure(lab, count, pool_count, keep, kept=False, returned="all"):
    pools = [{"name": entry["name"], "uri": entry["uri"]} for entry in lab["pools"][:pool_count]]
    if len(pools) < pool_count:
        raise SystemExit("the lab has %d pools, %d wanted: lab.py up --pools %d"
                         % (len(pools), pool_count, pool_count))
    image = lab["image"]
    templates = prepare(pools, image, -(-count // pool_count))
    checksum = storage.sha256_file(image)
    names = {entry["uri"]: [] for entry in pools}
    for index in range(count):
        names[pools[index % pool_count]["uri"]].append("bench-f-%04d" % index)
    load = [round(value, 2) for value in os.getloadavg()]
    row = {"machines": count, "pools": pool_count, "return_machines": returned}
    row["floor_s"], row["floor_cpu_s"], row["floor_daemons_cpu_s"] = cpu_of(floor, pools, names, templates,
                                                                            checksum)
    wipe(pools, "bench-f-")
    if kept:
        row["kept_floor_s"], row["kept_floor_cpu_s"], row["kept_floor_daemons_cpu_s"] = cpu_of(
            floor, pools, names, templates, checksum, kept=True)
        wipe(pools, "bench-f-")
    machines = [{"name": "bench-r-%04d" % index, "machine_class": "bench", "image": image, "state": "present",
                 "network_interfaces": []} for index in range(count)]
    role = {"pools": pools, "machines": machines, "return_machines": returned}
    # what a run costs whatever its size: ansible-playbook, the module, a connection and a listing per pool
    row["role_empty_s"], row["role_empty_cpu_s"], row["role_empty_daemons_cpu_s"] = cpu_of(
        playbook, PLAY_ROLE, dict(role, machines=[]))
    row["role_s"], row["role_cpu_s"], row["role_daemons_cpu_s"] = cpu_of(playbook, PLAY_ROLE, role)
    row["role_noop_s"] = playbook(PLAY_ROLE, role)
    wipe(pools, "bench-r-")
    if kept:
        io_floor(row, pools, machines, returned)
    extra = {"pools": pools, "image": image, "replicas": count}
    row["set_s"], row["set_cpu_s"], row["set_daemons_cpu_s"] = cpu_of(playbook, PLAY_SET, extra)
    row["set_noop_s"] = playbook(PLAY_SET, extra)
    wipe(pools, "bnset-")
    playbook(PLAY_SET, dict(extra, replicas=0, state="absent"))
    if keep:  # the role's machines again, left for a profile of the no-op
        playbook(PLAY_ROLE, role)
    row["load_before"] = load
    row["load_after"] = [round(value, 2) for value in os.getloadavg()]
    for key in ("floor", "role", "set"):
        row[key + "_per_machine_ms"] = round(row[key + "_s"] / count * 1000, 1)
    row["role_vs_floor"] = round(row["role_s"] / row["floor_s"], 2)
    row["role_net_vs_floor"] = round((row["role_s"] - row["role_empty_s"]) / row["floor_s"], 2)
    row["set_net_vs_floor"] = round((row["set_s"] - row["role_empty_s"]) / row["floor_s"], 2)
    row["set_vs_floor"] = round(row["set_s"] / row["floor_s"], 2)
    # the CPU the whole machine spent (every process: the libvirtds and their qemu-img too): on two cores a run
    # whose CPU is more than its wall time kept both busy, and a ratio of CPU is one no scheduling can beat
    row["floor_cores_busy"] = round(row["floor_cpu_s"] / row["floor_s"], 2)
    row["role_net_cpu_vs_floor"] = round((row["role_cpu_s"] - row["role_empty_cpu_s"]) / row["floor_cpu_s"], 2)
    row["set_net_cpu_vs_floor"] = round((row["set_cpu_s"] - row["role_empty_cpu_s"]) / row["floor_cpu_s"], 2)
    if kept:
        # the floor of the collection's create through ansible-playbook: the kept floor, and what ansible-core
        # spends carrying this many machines in and their statuses out (net of a play with neither)
        row["composite_floor_s"] = row["kept_floor_s"] + row["io_floor_s"] - row["io_empty_s"]
        row["composite_floor_cpu_s"] = row["kept_floor_cpu_s"] + row["io_floor_cpu_s"] - row["io_empty_cpu_s"]
        row["kept_floor_vs_floor"] = round(row["kept_floor_s"] / row["floor_s"], 2)
        row["kept_floor_cpu_vs_floor"] = round(row["kept_floor_cpu_s"] / row["floor_cpu_s"], 2)
        row["composite_floor_vs_floor"] = round(row["composite_floor_s"] / row["floor_s"], 2)
        row["composite_floor_cpu_vs_floor"] = round(row["composite_floor_cpu_s"] / row["floor_cpu_s"], 2)
        row["role_net_vs_composite"] = round((row["role_s"] - row["role_empty_s"]) / row["composite_floor_s"], 2)
        row["role_net_cpu_vs_composite"] = round((row["role_cpu_s"] - row["role_empty_cpu_s"])
                                                 / row["composite_floor_cpu_s"], 2)
        row["set_net_vs_kept"] = round((row["set_s"] - row["role_empty_s"]) / row["kept_floor_s"], 2)
        row["set_net_cpu_vs_kept"] = round((row["set_cpu_s"] - row["role_empty_cpu_s"]) / row["kept_floor_cpu_s"],
                                           2)
    for key in list(row):
        if key.endswith("_s"):
            row[key] = round(row[key], 2)
    return row


# ansible-core's floor: static_module.py returning a JSON file as its result, given a task's input (noop_scale.py
# adds the set's to FLOOR_TASK)
FLOOR_TASK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - static_module:
        path: "{{ output }}"
        pools: "{{ pools }}"
"""
PLAY_FLOOR = FLOOR_TASK + """        machines: "{{ machines }}"
"""


def module_output(name, args, path):
    """Run machinery.compute.<name> once in its own process and keep its result in ``path``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    proc = subprocess.run([sys.executable, "-m", MODULES + name, handle.name], capture_output=True, text=True,
                          check=False)
    os.unlink(handle.name)
    with open(path, "w") as out:
        out.write(proc.stdout[proc.stdout.index("{"):])


def io_floor(row, pools, machines, returned="all"):
    """ansible-core's own floor of the role's create: ansible-playbook running static_module.py with the role's
    input (these machines) and returning the very result machine_batch returned creating them (taken from an
    untimed run of the module, whose machines are removed again), and the same with no machine."""
    os.environ["ANSIBLE_LIBRARY"] = HERE
    directory = tempfile.mkdtemp()
    full, empty = os.path.join(directory, "create.json"), os.path.join(directory, "empty.json")
    try:
        module_output("machine_batch", {"pools": pools, "machines": machines, "defaults": {"wait": "none"},
                                        "return_machines": returned}, full)
        wipe(pools, "bench-r-")
        module_output("machine_batch", {"pools": pools, "machines": [], "defaults": {"wait": "none"}}, empty)
        row["io_floor_s"], row["io_floor_cpu_s"], _daemons = cpu_of(
            playbook, PLAY_FLOOR, {"pools": pools, "machines": machines, "output": full})
        row["io_empty_s"], row["io_empty_cpu_s"], _daemons = cpu_of(
            playbook, PLAY_FLOOR, {"pools": pools, "machines": [], "output": empty})
        row["io_output_bytes"] = os.path.getsize(full)
    finally:
        for path in (full, empty):
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(directory)


def plot(rows, path, title, series):
    """Seconds per machine against the number of machines, one line per series (a PNG at ``path``)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    figure, axes = pyplot.subplots(figsize=(6, 3.6))
    sizes = [row["machines"] for row in rows]
    for key, label in series:
        axes.plot(sizes, [row[key] for row in rows], marker="o", label=label)
    axes.set_xscale("log")
    axes.set_xticks(sizes)
    axes.set_xticklabels(["%d\n(%d pools)" % (row["machines"], row["pools"]) for row in rows])
    axes.set_ylabel("ms per machine")
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("sizes", nargs="*", default=["30:3", "300:10"], help="COUNT:POOLS (default 30:3 300:10)")
    parser.add_argument("--keep", action="store_true", help="leave the role's machines of the last size")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--return-machines", choices=("all", "changed", "none"), default="all",
                        help="the role's machines_return_machines (which statuses its result carries)")
    parser.add_argument("--kept", action="store_true",
                        help="also measure the kept floor (the raw floor with the collection's hold and read-back "
                             "per create) and ansible-core's floor of the role's input and output")
    parser.add_argument("--plot", help="write a PNG of ms per machine against size")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    rows = []
    for index, size in enumerate(options.sizes):
        count, pool_count = (int(part) for part in size.split(":"))
        rows.append(measure(lab, count, pool_count, options.keep and index == len(options.sizes) - 1,
                            options.kept, options.return_machines))
        print(json.dumps(rows[-1]), flush=True)
    print("%-14s %8s %8s %8s %8s %10s %10s %8s %8s" % (
        "size", "floor s", "empty s", "role s", "set s", "role/floor", "set/floor", "role 0p", "set 0p"))
    for row in rows:
        print("%-14s %8.2f %8.2f %8.2f %8.2f %10.2f %10.2f %8.2f %8.2f" % (
            "%d on %d" % (row["machines"], row["pools"]), row["floor_s"], row["role_empty_s"], row["role_s"],
            row["set_s"], row["role_vs_floor"], row["set_vs_floor"], row["role_noop_s"], row["set_noop_s"]))
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    if options.plot:
        plot(rows, options.plot, "Create from nothing, state present",
             [("floor_per_machine_ms", "parallel raw floor"), ("role_per_machine_ms", "machines role"),
              ("set_per_machine_ms", "machine_set")])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
