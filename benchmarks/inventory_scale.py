"""Inventory at scale: N machines (default 1,000) defined, not started, over the lab's pools (5 recommended).

Measures wall time and peak RSS of `ansible-inventory --list` for:
  machinery cold   the machinery.compute.machines plugin, cache empty
  machinery cached the same source again, served from the jsonfile inventory cache
  community        community.libvirt's libvirt inventory plugin, one source file per URI (it takes one URI)
The machines are defined straight through libvirt with the collection's own domain XML and record, so the
setup is quick; they are undefined afterwards.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils import domain as dx

BIN = os.path.dirname(sys.executable)
HERE = os.path.dirname(os.path.abspath(__file__))


def measure(args, env):
    """(seconds, peak RSS MiB, stdout) of one command, its resource usage taken with wait4."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise SystemExit("%s failed: %s" % (" ".join(args), err.read()[-2000:]))
        return elapsed, usage.ru_maxrss / 1024, out.read()


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
        conns[uri].defineXML(dx.tostring(dx.build_domain(plan)))


def undefine_machines(conns):
    for conn in conns.values():
        for dom in conn.listAllDomains(0):
            if dom.name().startswith("scale-"):
                dom.undefine()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--community", help="collections path holding community.libvirt 2.x (optional)")
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    conns = {entry["uri"]: libvirt.open(entry["uri"]) for entry in lab["pools"]}
    work = tempfile.mkdtemp()
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    if options.community:
        env["ANSIBLE_COLLECTIONS_PATH"] = options.community
    undefine_machines(conns)
    start = time.perf_counter()
    define_machines(conns, options.count)
    report = {"machines": options.count, "pools": len(conns), "setup_s": round(time.perf_counter() - start, 1)}
    try:
        source = os.path.join(work, "fleet.machinery.yml")
        with open(source, "w") as handle:
            json.dump({"plugin": "machinery.compute.machines", "pools": lab["pools"], "cache": True,
                       "cache_plugin": "ansible.builtin.jsonfile",
                       "cache_connection": os.path.join(work, "cache"), "cache_timeout": 3600}, handle)
        inventory = os.path.join(BIN, "ansible-inventory")
        seconds, rss, out = measure([inventory, "-i", source, "--list"], env)
        hosts = len(json.loads(out)["_meta"]["hostvars"])
        report["machinery_cold"] = {"seconds": round(seconds, 2), "peak_rss_mib": round(rss, 1), "hosts": hosts}
        seconds, rss, out = measure([inventory, "-i", source, "--list"], env)
        report["machinery_cached"] = {"seconds": round(seconds, 2), "peak_rss_mib": round(rss, 1),
                                      "hosts": len(json.loads(out)["_meta"]["hostvars"])}
        seconds, rss, _output = measure([inventory, "--version"], env)
        report["ansible_inventory_startup"] = {"seconds": round(seconds, 2), "peak_rss_mib": round(rss, 1)}
        if options.community:
            sources = []
            for index, entry in enumerate(lab["pools"]):
                path = os.path.join(work, "pool%d.libvirt.yml" % index)
                with open(path, "w") as handle:
                    json.dump({"plugin": "community.libvirt.libvirt", "uri": entry["uri"]}, handle)
                sources += ["-i", path]
            seconds, rss, out = measure([inventory] + sources + ["--list"], env)
            report["community_libvirt"] = {"seconds": round(seconds, 2), "peak_rss_mib": round(rss, 1),
                                           "hosts": len(json.loads(out)["_meta"]["hostvars"])}
            report["community_vs_machinery_cold"] = round(report["community_libvirt"]["seconds"] /
                                                          report["machinery_cold"]["seconds"], 2)
    finally:
        undefine_machines(conns)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
