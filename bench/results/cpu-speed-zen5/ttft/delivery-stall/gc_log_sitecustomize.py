"""Log the served worker's and the benchmark process's gen1 / gen2 collections (and any collection over 5 ms)
(README.md; ../../../gc-freeze/gc_log_sitecustomize.py logged the worker only): copy this file as sitecustomize.py
into a folder, put that folder first on PYTHONPATH of the benchmark (the launch passes its environment to the
worker), `mkdir -p /tmp/gcsite`, and read /tmp/gcsite/gc-PID.log: unix time, generation, milliseconds, objects
frozen, objects tracked (gen2 only)."""

import gc
import os
import time

if (
    b"dynamo.worker" in open("/proc/self/cmdline", "rb").read()
    or b"experiments.cpu_peers" in open("/proc/self/cmdline", "rb").read()
):
    _f = open(f"/tmp/gcsite/gc-{os.getpid()}.log", "a", buffering=1)
    _t = [0.0]

    def _cb(phase, info):
        if phase == "start":
            _t[0] = time.perf_counter()
        elif info["generation"] >= 1 or (time.perf_counter() - _t[0]) > 0.005:
            _f.write(
                f"{time.time():.3f} {info['generation']} {(time.perf_counter() - _t[0]) * 1e3:.3f} {gc.get_freeze_count()} {len(gc.get_objects()) if info['generation'] == 2 else 0}\n"
            )

    gc.callbacks.append(_cb)
