"""Per-machine create time: the machine module against the raw libvirt API floor for the same domain.

floor: one libvirt-python connection; thin qcow2 overlay on the cached image + defineXML + create, with the
       very XML the module builds (so both start the same guest).
module: machinery.compute.machine run as Ansible runs it on a host (own process, JSON arguments), state
       running, wait running; and the same through `ansible localhost -m` (controller overhead included).
Machines are deleted between rounds; the image is cached on the pool before timing starts.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import libvirt

from ansible_collections.machinery.compute.plugins.module_utils.core import domain as dx
from ansible_collections.machinery.compute.plugins.module_utils.machines import images
from ansible_collections.machinery.compute.plugins.module_utils.core import storage
from ansible_collections.machinery.compute.plugins.module_utils.core.connection import require_libvirt
from common import run_module as run_module_named

HERE = os.path.dirname(os.path.abspath(__file__))


def run_module(args):
    return run_module_named("machine", args)


def run_adhoc(args):
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    proc = subprocess.run([ansible, "localhost", "-m", "machinery.compute.machine", "-a", json.dumps(args), "-o"],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, ANSIBLE_LOCALHOST_WARNING="false",
                                   ANSIBLE_INVENTORY_UNPARSED_WARNING="false"))
    if "FAILED" in proc.stdout or proc.returncode:
        raise SystemExit("ansible failed: %s %s" % (proc.stdout, proc.stderr))


def floor_once(conn, pool, image_vol, fmt, xml_template, name):
    start = time.perf_counter()
    root = storage.create_volume(pool, name + "-root.qcow2", image_vol.info()[1], "qcow2",
                                 backing=(image_vol.path(), fmt))
    dom = conn.defineXML(xml_template.replace("@NAME@", name).replace("@ROOT@", root.path()))
    dom.create()
    elapsed = time.perf_counter() - start
    dom.destroy()
    dom.undefine()
    root.delete(0)
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=os.path.join(HERE, "..", ".lab", "lab.json"))
    parser.add_argument("--pool", type=int, default=-1, help="index of the lab pool to use (default: the last)")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    with open(options.lab) as handle:
        lab = json.load(handle)
    pool_entry = lab["pools"][options.pool]
    uri, image = pool_entry["uri"], lab["image"]
    require_libvirt()
    conn = libvirt.open(uri)
    common = {"uri": uri, "machine_class": "bench", "image": image, "network_interfaces": [], "wait": "running"}
    run_module_named("machine_class", {"uri": uri, "name": "bench", "cpu": 1, "memory": "128Mi"})
    # warm the image cache and libvirt's capability cache; keep the module's XML as the floor's template
    run_module(dict(common, name="bench-warm"))
    warm = conn.lookupByName("bench-warm")
    tree = dx.parse(warm.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    for node in tree.iter("uuid"):
        node.getparent().remove(node)
    tree.find("name").text = "@NAME@"
    for disk in tree.iter("disk"):
        source = disk.find("source")
        if source is not None and source.get("file", "").endswith("bench-warm-root.qcow2"):
            source.set("file", "@ROOT@")
    for log in tree.iter("log"):
        log.set("file", log.get("file").replace("bench-warm", "@NAME@"))
    xml_template = dx.tostring(tree)
    run_module({"uri": uri, "name": "bench-warm", "state": "absent", "shutdown_timeout": 1})
    pool = conn.storagePoolLookupByName("machinery")
    image_vol, fmt = images.cached_volume(pool, storage.sha256_file(image))

    floor, module, adhoc = [], [], []
    for index in range(options.rounds):
        floor.append(floor_once(conn, pool, image_vol, fmt, xml_template, "bench-floor-%d" % index))
        name = "bench-mod-%d" % index
        start = time.perf_counter()
        run_module(dict(common, name=name))
        module.append(time.perf_counter() - start)
        run_module({"uri": uri, "name": name, "state": "absent", "shutdown_timeout": 1})
        name = "bench-adhoc-%d" % index
        start = time.perf_counter()
        run_adhoc(dict(common, name=name))
        adhoc.append(time.perf_counter() - start)
        run_module({"uri": uri, "name": name, "state": "absent", "shutdown_timeout": 1})
    peak_child_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    report = {
        "pool": pool_entry["name"], "rounds": options.rounds,
        "floor_median_s": round(statistics.median(floor), 3),
        "module_median_s": round(statistics.median(module), 3),
        "ansible_adhoc_median_s": round(statistics.median(adhoc), 3),
        "module_vs_floor": round(statistics.median(module) / statistics.median(floor), 2),
        "adhoc_vs_floor": round(statistics.median(adhoc) / statistics.median(floor), 2),
        "peak_child_rss_mib": round(peak_child_mib, 1),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
