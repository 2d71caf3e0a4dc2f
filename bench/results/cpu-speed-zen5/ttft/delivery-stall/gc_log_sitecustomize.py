"""Log the served worker's gen1 / gen2 collections (README.md): copy this file as sitecustomize.py into a folder,
put that folder first on PYTHONPATH of the benchmark (the launch passes its environment to the worker) and read
/tmp/gcsite/gc-PID.log: unix time, generation, milliseconds, objects frozen at the time."""

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

if b"experiments.cpu_peers" in open("/proc/self/cmdline", "rb").read():
    import threading

    def _beat():
        hb = open(f"/tmp/gcsite/beat-{os.getpid()}.log", "a", buffering=1)
        last = time.time()
        while True:
            time.sleep(0.002)
            now = time.time()
            if now - last > 0.02:
                hb.write(f"{last:.4f} {(now - last) * 1e3:.1f}\n")
            last = now

    threading.Thread(target=_beat, daemon=True).start()
