"""Inventory at scale: N machines (default 1,000) defined, not started, over the lab's pools (5 recommended).

Every figure is the median of --rounds runs of `ansible-inventory` (wall time, CPU time = user + sys, peak RSS):
  machinery cold       the machinery.compute.machines plugin, --list, cache emptied before each run
  machinery cached     the same source again, --list, served from the jsonfile inventory cache
  machinery graph      the same, cached, --graph: loading the inventory without printing hostvars, which is what
                       ansible-playbook pays
  community.libvirt    its libvirt inventory plugin, --list, one source file per URI (it takes one URI)
and three floors that involve no plugin work at all:
  startup              ansible-inventory --version
  static hosts         a script inventory printing the same hosts and groups without hostvars: what ansible-core
                       itself spends on 1,000 hosts, whatever the plugin
  static full          a script inventory printing machinery's own --list output: what ansible-core spends
                       reading and printing exactly this inventory (its output is checked to be identical)
  read full            static full, whose script first reads every pool as the least reading of a cold
                       inventory must (a thread and a connection per pool, one stats call, each domain's XML read
                       and parsed): ansible-core's cost plus libvirt's, the floor of a cold run

With --core VERSION (repeatable) the whole set runs again under that ansible-core release, from a virtual
environment of its own made under .venv/bench-cores/ on first use.

The machines are defined straight through libvirt with the collection's own domain XML and record, so the
setup is quick; they are undefined afterwards.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.core import options

BIN = os.path.dirname(sys.executable)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def run_once(args, env):
    """(wall seconds, CPU seconds, peak RSS MiB, stdout) of one command.

    GNU time reports the command's resource usage: a child forked straight from this process would count this
    process's own memory in its peak RSS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as usage:
        start = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-q", "-o", usage.name, "-f", "%U %S %M"] + args, stdout=out,
                              stderr=err, env=env, check=False)
        elapsed = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit("%s failed: %s" % (" ".join(args), err.read()[-2000:]))
        user, system, peak_kib = usage.read().split()
        return elapsed, float(user) + float(system), int(peak_kib) / 1024, out.read()


def summary(samples):
    """Median wall and CPU seconds, fastest wall and highest peak RSS of (wall, cpu, rss) samples."""
    walls = [sample[0] for sample in samples]
    return {"wall_s": round(statistics.median(walls), 2), "wall_min_s": round(min(walls), 2),
            "cpu_s": round(statistics.median(sample[1] for sample in samples), 2),
            "peak_rss_mib": round(max(sample[2] for sample in samples), 1)}


def core_venv(version):
    """bin/ of a virtual environment with ansible-core ``version`` (made by tests/core_venv.sh)."""
    return subprocess.run(["bash", os.path.join(REPO, "tests", "core_venv.sh"), os.path.dirname(BIN), version],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()


def define_machines(conns, count):
    uris = list(conns)
    for index in range(count):
        uri = uris[index % len(uris)]
        name = "scale-%04d" % index
        record = {"version": 1, "created": "2026-01-01T00:00:00+00:00", "boots": 0, "last_error": None,
                  "spec": {"name": name, "machine_class": "small", "cpu": 1, "memory": 128 * 2 ** 20,
                           "labels": {"app": "scale", "shard": str(index % 10)}, "image": {"source": "bench"},
                           "volumes": [], "root_size": 2 ** 30, "files": {},
                           "network_interfaces": [{"name": "eth0", "network": "machinery",
                                                   "mac": dx.derive_mac(name, "eth0"), "ephemeral": True}]}}
        plan = {"name": name, "virt_type": "qemu", "cpu": 1, "memory": 128 * 2 ** 20, "firmware": "bios",
                "record": record, "nics": record["spec"]["network_interfaces"],
                "disks": [{"name": "root", "path": "/var/lib/libvirt/machinery/%s-root.qcow2" % name,
                           "format": "qcow2", "device": "vda", "boot": True}],
                "console_path": "/var/lib/libvirt/machinery/%s-console.log" % name}
        spec = dict(record["spec"], firmware="bios", tolerations=[], topology=None, boot_config=None, disk_qos={},
                    ip_reservations={})
        conns[uri].defineXML(dx.tostring(options.build_tree(plan, spec)))


def undefine_machines(conns):
    for conn in conns.values():
        for dom in conn.listAllDomains(0):
            if dom.name().startswith("scale-"):
                dom.undefine()


def static_script(work, name, data):
    """A script inventory printing ``data``; its path."""
    body = os.path.join(work, name + ".json")
    with open(body, "w") as handle:
        json.dump(data, handle)
    script = os.path.join(work, name + ".sh")
    with open(script, "w") as handle:
        handle.write("#!/bin/sh\nexec cat '%s'\n" % body)
    os.chmod(script, 0o755)
    return script


READ_FULL = """#!%(python)s
import sys
import threading

import libvirt
from lxml import etree

sys.path.insert(0, %(here)r)
from read_floor_module import read_pool

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
counts = []
threads = [threading.Thread(target=read_pool, args=(uri, counts)) for uri in %(uris)r]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with open(%(body)r) as handle:
    sys.stdout.write(handle.read())
"""


def read_script(work, name, data, uris):
    """A script inventory that reads every pool of ``uris`` as a cold inventory must, then prints ``data``."""
    body = os.path.join(work, name + ".json")
    with open(body, "w") as handle:
        json.dump(data, handle)
    script = os.path.join(work, name + ".py")
    with open(script, "w") as handle:
        handle.write(READ_FULL % {"python": sys.executable, "here": HERE, "uris": uris, "body": body})
    os.chmod(script, 0o755)
    return script


def run_set(bindir, lab, work, env, rounds, community):
    """Every measurement of the module docstring under the ansible-core installed in ``bindir``.

    The variants take turns within each round, so a slow spell of the machine falls on all of them alike."""
    inventory = os.path.join(bindir, "ansible-inventory")
    version = subprocess.run([inventory, "--version"], capture_output=True, text=True, env=env,
                             check=True).stdout.split("\n")[0]
    cache = os.path.join(work, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    source = os.path.join(work, "fleet.machinery.yml")
    with open(source, "w") as handle:
        json.dump({"plugin": "machinery.compute.machines", "pools": lab["pools"], "cache": True,
                   "cache_plugin": "ansible.builtin.jsonfile", "cache_connection": cache, "cache_timeout": 3600},
                  handle)
    listing = json.loads(run_once([inventory, "-i", source, "--list"], env)[3])
    variants = [  # name, command, environment, what to do before each run
        ("machinery_cold", [inventory, "-i", source, "--list"], env,
         lambda: shutil.rmtree(cache, ignore_errors=True)),
        ("machinery_cached", [inventory, "-i", source, "--list"], env, None),
        ("machinery_graph_cached", [inventory, "-i", source, "--graph"], env, None),
        ("startup", [inventory, "--version"], env, None),
        ("static_hosts", [inventory, "-i", static_script(work, "bare", dict(listing, _meta={"hostvars": {}})),
                          "--list"], env, None),
        ("static_full", [inventory, "-i", static_script(work, "full", listing), "--list"], env, None),
        ("read_full", [inventory, "-i", read_script(work, "read", listing, [p["uri"] for p in lab["pools"]]),
                       "--list"], env, None),
    ]
    if community:
        sources = []
        for index, entry in enumerate(lab["pools"]):
            path = os.path.join(work, "pool%d.libvirt.yml" % index)
            with open(path, "w") as handle:
                json.dump({"plugin": "community.libvirt.libvirt", "uri": entry["uri"]}, handle)
            sources += ["-i", path]
        variants.append(("community_libvirt", [inventory] + sources + ["--list"],
                         dict(env, ANSIBLE_COLLECTIONS_PATH=community), None))
    samples = {name: [] for name, _args, _env, _before in variants}
    outputs = {}
    for _round in range(rounds):
        for name, args, variant_env, before in variants:
            if before:
                before()
            wall, cpu, rss, outputs[name] = run_once(args, variant_env)
            samples[name].append((wall, cpu, rss))
    result = {"ansible_core": version, "hosts": len(listing["_meta"]["hostvars"])}
    result.update((name, summary(values)) for name, values in samples.items())
    result["cached_output_identical"] = outputs["machinery_cached"] == outputs["machinery_cold"]
    result["static_full_identical"] = json.loads(outputs["static_full"]) == json.loads(outputs["machinery_cold"])
    result["read_full_identical"] = json.loads(outputs["read_full"]) == json.loads(outputs["machinery_cold"])
    result["read_full_over_static_full"] = round(result["read_full"]["wall_s"] / result["static_full"]["wall_s"], 2)
    result["machinery_cold_over_read_full"] = round(result["machinery_cold"]["wall_s"] /
                                                    result["read_full"]["wall_s"], 2)
    for name in ("static_full", "community_libvirt"):
        if name in result:
            result["%s_over_machinery_cold" % name] = round(result[name]["wall_s"] /
                                                            result["machinery_cold"]["wall_s"], 2)
            result["%s_over_machinery_cached" % name] = round(result[name]["wall_s"] /
                                                              result["machinery_cached"]["wall_s"], 2)
    if community:
        result["community_libvirt"]["hosts"] = len(json.loads(outputs["community_libvirt"])["_meta"]["hostvars"])
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(REPO, ".lab", "lab.json"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--community", help="collections path holding community.libvirt 2.x (optional)")
    parser.add_argument("--core", action="append", default=[], metavar="VERSION",
                        help="also measure under this ansible-core release (repeatable)")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    conns = {entry["uri"]: libvirt.open(entry["uri"]) for entry in lab["pools"]}
    # the lab's own messages about stopped domains would only fill stderr
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    bindirs = [BIN] + [core_venv(version) for version in options.core]
    work = tempfile.mkdtemp()
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    undefine_machines(conns)
    start = time.perf_counter()
    define_machines(conns, options.count)
    report = {"machines": options.count, "pools": len(conns), "rounds": options.rounds,
              "setup_s": round(time.perf_counter() - start, 1), "runs": []}
    try:
        for bindir in bindirs:
            report["runs"].append(run_set(bindir, lab, work, env, options.rounds, options.community))
    finally:
        undefine_machines(conns)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
