"""cProfile of one module run, in-process, as Ansible would run it on the host (JSON arguments in a file).

    python benchmarks/profile_module.py machine_batch args.json [--top 25] [--out run.prof] [--cpu]

Every thread is profiled (the worker threads' stats are added to the main thread's). Prints the wall time,
the module's changed flag, the functions with the most cumulative time, and the libvirt calls the run made
(every libvirt RPC goes through libvirtmod, so its call counts are the round trips).

By default the profiler's clock is the wall clock, so a thread's time includes its waits (on a daemon, on the
interpreter lock). With --cpu it is each thread's own CPU time (time.thread_time): what a function costs the
machine, the measure that matters where the cores are full; the functions are then sorted by their own time,
and the process's CPU time is printed beside the wall time.

With --loop nothing is profiled: the run is timed, and libvirt's event loop thread (which keepalive needs) by its
own CPU clock, with the number of times it went round. The profiler inflates that thread: under --cpu a create
of 300 machines showed 0.77 s in virEventRunDefaultImpl, which --loop measures at 0.08-0.11 s.
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


def profiled_threads(clock=None):
    """Every thread started from now on runs under a profiler of its own (cProfile sees one thread only)."""
    original = threading.Thread.run

    def run(self):
        profile = cProfile.Profile(clock) if clock else cProfile.Profile()
        PROFILES.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()
    threading.Thread.run = run


def timed_loop(module):
    """Run ``module`` unprofiled; print its wall and CPU time and what libvirt's event loop thread spent."""
    import libvirt  # pylint: disable=import-outside-toplevel
    from ansible_collections.machinery.compute.plugins.module_utils.core import connection  # pylint: disable=import-outside-toplevel
    loop = {"rounds": 0, "cpu": 0.0}

    def event_loop():  # connection.event_loop, counting
        with connection._EVENTS_LOCK:  # pylint: disable=protected-access
            if connection._EVENTS["loop"] is None:  # pylint: disable=protected-access
                libvirt.virEventRegisterDefaultImpl()

                def run():
                    start = time.thread_time()
                    while True:
                        libvirt.virEventRunDefaultImpl()
                        loop["rounds"] += 1
                        loop["cpu"] = time.thread_time() - start
                thread = threading.Thread(target=run, name="libvirt-events", daemon=True)
                connection._EVENTS["loop"] = thread  # pylint: disable=protected-access
                thread.start()
        return connection._EVENTS["loop"]  # pylint: disable=protected-access
    connection.event_loop = event_loop
    output = io.StringIO()
    cpu_start, start = time.process_time(), time.perf_counter()
    with contextlib.redirect_stdout(output):
        try:
            module.main()
        except SystemExit:
            pass
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    text = output.getvalue()
    result = json.loads(text[text.index("{"):])
    print("%s: %.2f s in-process, CPU %.2f s, changed=%s, failed=%s; libvirt's event loop went round %d times "
          "on %.3f CPU s" % (module.__name__.rsplit(".", 1)[-1], elapsed, cpu, result.get("changed"),
                             result.get("failed", False), loop["rounds"], loop["cpu"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module")
    parser.add_argument("args", help="a JSON file: {\"ANSIBLE_MODULE_ARGS\": {...}}")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="also write the raw profile here (for snakeviz, pstats)")
    parser.add_argument("--cpu", action="store_true", help="time each thread's CPU, not the wall clock")
    parser.add_argument("--loop", action="store_true",
                        help="profile nothing: time the run and libvirt's event loop thread by its own CPU clock")
    options = parser.parse_args()
    module = importlib.import_module(MODULES + options.module)
    sys.argv = [options.module, options.args]
    if options.loop:
        timed_loop(module)
        return
    clock = time.thread_time if options.cpu else None
    profiled_threads(clock)
    output = io.StringIO()
    profile = cProfile.Profile(clock) if clock else cProfile.Profile()
    cpu_start = time.process_time()
    start = time.perf_counter()
    with contextlib.redirect_stdout(output):
        profile.enable()
        try:
            module.main()
        except SystemExit:
            pass
        profile.disable()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    text = output.getvalue()
    result = json.loads(text[text.index("{"):])
    print("%s: %.2f s in-process (CPU %.2f s, profiler included), changed=%s, failed=%s %s" % (
        options.module, elapsed, cpu, result.get("changed"), result.get("failed", False), result.get("msg", "")))
    stats = pstats.Stats(profile)
    for thread_profile in PROFILES:
        stats.add(thread_profile)
    if options.out:
        stats.dump_stats(options.out)
    stats.sort_stats("tottime" if options.cpu else "cumulative").print_stats(options.top)
    calls = sorted(((value[1], value[3], key[2]) for key, value in stats.stats.items()
                    if "libvirtmod" in key[2]), reverse=True)
    print("libvirt calls (count, cumulative s, function):")
    for count, cumulative, name in calls:
        print("  %7d %8.3f  %s" % (count, cumulative, name))


if __name__ == "__main__":
    main()
