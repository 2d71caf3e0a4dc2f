"""Run a module with every garbage collection timed: python gcprobe.py MODULE ARGS..."""

import atexit
import collections
import gc
import runpy
import sys
import time

stats = collections.defaultdict(list)
T0 = time.perf_counter()
_t = {}


def cb(phase, info):
    if phase == "start":
        _t["t"] = time.perf_counter()
    else:
        stats[info["generation"]].append((time.perf_counter() - _t["t"]) * 1e3)
        if info["generation"] == 2:
            print(
                f"gc gen2 at {time.perf_counter() - T0:.1f} s: {stats[2][-1]:.1f} ms, collected {info['collected']}",
                file=sys.stderr,
            )


gc.callbacks.append(cb)


def report():
    for g in sorted(stats):
        xs = sorted(stats[g])
        print(
            f"gc gen{g}: {len(xs)} collections, total {sum(xs):.1f} ms, p50 {xs[len(xs) // 2]:.3f} ms, max {xs[-1]:.2f} ms",
            file=sys.stderr,
        )
    print(f"tracked objects at exit: {len(gc.get_objects())}", file=sys.stderr)


atexit.register(report)
mod = sys.argv[1]
sys.argv = [mod] + sys.argv[2:]
runpy.run_module(mod, run_name="__main__", alter_sys=True)
