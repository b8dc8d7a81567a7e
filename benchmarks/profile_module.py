"""cProfile of one module run, in-process, as Ansible would run it on the host (JSON arguments in a file).

    python benchmarks/profile_module.py machine_batch args.json [--top 25] [--out run.prof]

Every thread is profiled (the worker threads' stats are added to the main thread's). Prints the wall time,
the module's changed flag, the functions with the most cumulative time, and the libvirt calls the run made
(every libvirt RPC goes through libvirtmod, so its call counts are the round trips).
"""

import argparse
import contextlib
import cProfile
import importlib
import io
import json
import pstats
import sys
import threading
import time

MODULES = "ansible_collections.machinery.compute.plugins.modules."


PROFILES = []


def profiled_threads():
    """Every thread started from now on runs under a profiler of its own (cProfile sees one thread only)."""
    original = threading.Thread.run

    def run(self):
        profile = cProfile.Profile()
        PROFILES.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()
    threading.Thread.run = run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module")
    parser.add_argument("args", help="a JSON file: {\"ANSIBLE_MODULE_ARGS\": {...}}")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="also write the raw profile here (for snakeviz, pstats)")
    options = parser.parse_args()
    module = importlib.import_module(MODULES + options.module)
    sys.argv = [options.module, options.args]
    profiled_threads()
    output = io.StringIO()
    profile = cProfile.Profile()
    start = time.perf_counter()
    with contextlib.redirect_stdout(output):
        profile.enable()
        try:
            module.main()
        except SystemExit:
            pass
        profile.disable()
    elapsed = time.perf_counter() - start
    text = output.getvalue()
    result = json.loads(text[text.index("{"):])
    print("%s: %.2f s in-process, changed=%s, failed=%s %s" % (
        options.module, elapsed, result.get("changed"), result.get("failed", False), result.get("msg", "")))
    stats = pstats.Stats(profile)
    for thread_profile in PROFILES:
        stats.add(thread_profile)
    if options.out:
        stats.dump_stats(options.out)
    stats.sort_stats("cumulative").print_stats(options.top)
    calls = sorted(((value[1], value[3], key[2]) for key, value in stats.stats.items()
                    if "libvirtmod" in key[2]), reverse=True)
    print("libvirt calls (count, cumulative s, function):")
    for count, cumulative, name in calls:
        print("  %7d %8.3f  %s" % (count, cumulative, name))


if __name__ == "__main__":
    main()
