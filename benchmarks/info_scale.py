"""machine_info over N machines on one pool (default 30, 300 and 1,000) against the raw libvirt calls it needs.

The machines are defined straight through libvirt with the collection's own domain XML and record (as
inventory_scale.py does), not started; they are undefined afterwards. Every figure is the median of --rounds
runs, each side in a process of its own (as Ansible runs a module on a host), taking turns:
  module      machinery.compute.machine_info with no filter: every machine's status and the table;
  floor       a libvirt-python script making the calls that status needs and nothing else: connect, one
              getAllDomainStats (state), the persistent XML of each domain (the record and sizes live there:
              libvirt has no bulk call for it), the DHCP leases of the pool's network and the storage pool's
              volume names;
  floor_bare  the same without the XML reads: listing, one stats call, leases (what no tool can stay under);
  static      static_module.py returning machine_info's very output from a file: what ansible-core alone spends
              on a module result of that size (python, AnsibleModule, the no_log scrub, JSON), whatever the module.
The module's own cost is module - static; it is compared with the floor (module_own_vs_floor).
Also in-process: list_machines() against the floor's calls in one interpreter, no start-up on either side, and
against those calls plus an lxml parse of each XML ("parsed": the record can only be read from the parsed XML).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils.core import connection as lv
from ansible_collections.machinery.compute.plugins.module_utils.core import elements
from ansible_collections.machinery.compute.plugins.module_utils.machines.machine_status import list_machines
from ansible_collections.machinery.compute.plugins.module_utils.machines.pool_context import PoolContext
from common import MODULES
from inventory_scale import define_machines, undefine_machines

HERE = os.path.dirname(os.path.abspath(__file__))


def floor_calls(uri, with_xml=True, parse=False):
    """The raw calls machine_info needs; the number of domains read. With ``parse``, each XML is also parsed with
    lxml (the least any reader of the record in it does)."""
    conn = libvirt.open(uri)
    domains = conn.getAllDomainStats(libvirt.VIR_DOMAIN_STATS_STATE, 0)
    if with_xml:
        for dom, _stats in domains:
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            if parse:
                elements.parse(xml)
    conn.networkLookupByName("machinery").DHCPLeases()
    conn.storagePoolLookupByName("machinery").listVolumes()
    conn.close()
    return len(domains)


def timed(args, stdin=None):
    start = time.perf_counter()
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode or '"failed": true' in proc.stdout:
        raise SystemExit("%s failed: %s %s" % (args, proc.stdout[-1500:], proc.stderr[-1500:]))
    return elapsed, proc.stdout


def module_args(path, uri):
    with open(path, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {"uri": uri}}, handle)
    return [sys.executable, "-m", MODULES + "machine_info", path]


def measure(uri, conn, count, rounds, work):
    undefine_machines({uri: conn})
    define_machines({uri: conn}, count)
    args_file = os.path.join(work, "info.json")
    sides = {
        "module": module_args(args_file, uri),
        "floor": [sys.executable, os.path.abspath(__file__), "--floor", uri],
        "floor_bare": [sys.executable, os.path.abspath(__file__), "--floor-bare", uri],
    }
    output = os.path.join(work, "info-output.json")
    _elapsed, out = timed(sides["module"])
    with open(output, "w") as handle:
        handle.write(out[out.index("{"):])
    static_args = os.path.join(work, "static.json")
    with open(static_args, "w") as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": {"path": output}}, handle)
    sides["static"] = [sys.executable, os.path.join(HERE, "static_module.py"), static_args]
    samples = {name: [] for name in list(sides) + ["in_process", "in_process_floor", "in_process_floor_parsed"]}
    shown = 0
    for _round in range(rounds):
        for name, args in sides.items():
            elapsed, out = timed(args)
            samples[name].append(elapsed)
            if name == "module":
                shown = len(json.loads(out[out.index("{"):])["machines"])
        start = time.perf_counter()
        with lv.Connection(uri) as own:
            list_machines(PoolContext(own, uri))
        samples["in_process"].append(time.perf_counter() - start)
        start = time.perf_counter()
        floor_calls(uri)
        samples["in_process_floor"].append(time.perf_counter() - start)
        start = time.perf_counter()
        floor_calls(uri, parse=True)
        samples["in_process_floor_parsed"].append(time.perf_counter() - start)
    row = {"machines": count, "shown": shown, "load": [round(value, 2) for value in os.getloadavg()]}
    row.update((name + "_s", round(statistics.median(values), 3)) for name, values in samples.items())
    row["module_vs_floor"] = round(row["module_s"] / row["floor_s"], 2)
    row["module_vs_floor_bare"] = round(row["module_s"] / row["floor_bare_s"], 2)
    row["module_own_s"] = round(row["module_s"] - row["static_s"], 3)
    row["module_own_vs_floor"] = round(row["module_own_s"] / row["floor_s"], 2)
    row["in_process_vs_floor"] = round(row["in_process_s"] / row["in_process_floor_s"], 2)
    row["in_process_vs_parsed"] = round(row["in_process_s"] / row["in_process_floor_parsed_s"], 2)
    row["module_per_machine_ms"] = round(row["module_s"] / count * 1000, 2)
    row["floor_per_machine_ms"] = round(row["floor_s"] / count * 1000, 2)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--pool", type=int, default=-1, help="index of the lab pool to use (default: the last)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--plot", help="write a PNG of ms per machine against size")
    parser.add_argument("--floor", help=argparse.SUPPRESS)
    parser.add_argument("--floor-bare", help=argparse.SUPPRESS)
    parser.add_argument("sizes", nargs="*", type=int, default=[30, 300, 1000])
    options = parser.parse_args()
    if options.floor or options.floor_bare:
        floor_calls(options.floor or options.floor_bare, with_xml=bool(options.floor))
        return
    with open(options.lab) as handle:
        lab = json.load(handle)
    uri = lab["pools"][options.pool]["uri"]
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    conn = libvirt.open(uri)
    work = tempfile.mkdtemp()
    rows = []
    try:
        for count in options.sizes:
            rows.append(measure(uri, conn, count, options.rounds, work))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        undefine_machines({uri: conn})
    print("%-9s %9s %9s %9s %11s %10s %14s %12s %14s %15s" % (
        "machines", "module s", "static s", "floor s", "floor_bare s", "mod/floor", "(mod-static)/fl",
        "in-process", "in-proc/floor", "in-proc/parsed"))
    for row in rows:
        print("%-9d %9.3f %9.3f %9.3f %11.3f %10.2f %14.2f %12.3f %14.2f %15.2f" % (
            row["machines"], row["module_s"], row["static_s"], row["floor_s"], row["floor_bare_s"],
            row["module_vs_floor"], row["module_own_vs_floor"], row["in_process_s"], row["in_process_vs_floor"],
            row["in_process_vs_parsed"]))
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    if options.plot:
        from parallel_floor import plot  # pylint: disable=import-outside-toplevel
        for row in rows:
            row["pools"] = 1
            row["in_process_per_machine_ms"] = round(row["in_process_s"] / row["machines"] * 1000, 2)
            row["in_process_floor_per_machine_ms"] = round(row["in_process_floor_s"] / row["machines"] * 1000, 2)
        plot(rows, options.plot, "machine_info, one pool", [
            ("floor_per_machine_ms", "raw floor (own process)"), ("module_per_machine_ms", "machine_info module"),
            ("in_process_floor_per_machine_ms", "raw floor, in-process"),
            ("in_process_per_machine_ms", "list_machines, in-process")])


if __name__ == "__main__":
    main()
