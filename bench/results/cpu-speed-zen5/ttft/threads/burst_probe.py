import pathlib
import statistics
import sys
import time

import numpy as np

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)


def dec(n):
    return decodes_on(tables, n, 40)


def run(plan):
    return run_ms(r, plan, True)


a = np.random.rand(1024, 1024).astype(np.float32)


def burst(ms):
    t = time.perf_counter()
    while (time.perf_counter() - t) * 1e3 < ms:
        a @ a


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec(8)[:7]
for _ in range(3):
    run(dec(7))
    run(mixed)
t = time.perf_counter()
a @ a
print("one 1024^3 sgemm ms", (time.perf_counter() - t) * 1e3)
for _rnd in range(3):
    res = {"same": statistics.median([run(dec(7)) for _ in range(10)])}
    for name, f in [
        ("after 60ms numpy sgemm", lambda: burst(60)),
        ("after 60ms sleep", lambda: time.sleep(0.06)),
        ("after mixed", lambda: run(mixed)),
    ]:
        v = []
        for _ in range(10):
            f()
            v.append(run(dec(7)))
        res[name] = statistics.median(v)
    print(" | ".join(f"{k} {v:.1f}" for k, v in res.items()))
