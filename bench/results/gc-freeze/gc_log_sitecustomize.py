import gc
import os
import time

if b"dynamo.worker" in open("/proc/self/cmdline", "rb").read():
    _f = open(f"/tmp/gcsite/gc-{os.getpid()}.log", "a", buffering=1)
    _t = [0.0]

    def _cb(phase, info):
        if phase == "start":
            _t[0] = time.perf_counter()
        elif info["generation"] >= 1:
            _f.write(
                f"{time.time():.3f} {info['generation']} {(time.perf_counter() - _t[0]) * 1e3:.3f} {gc.get_freeze_count()}\n"
            )

    gc.callbacks.append(_cb)
