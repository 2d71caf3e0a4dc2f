import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, prefix_with_decoders

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)


def dec(n):
    return [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(n)]


def run(plan, cascade):
    t = time.perf_counter()
    r._run(plan, [1] * len(plan), cascade=cascade)
    return (time.perf_counter() - t) * 1e3


for cascade in (True, False):
    for _ in range(3):
        run(dec(7), cascade)
        run(dec(6), cascade)
    for _rnd in range(2):
        same = [run(dec(7), cascade) for _ in range(10)]
        d6 = []
        for _ in range(10):
            run(dec(6), cascade)
            d6.append(run(dec(7), cascade))
        one = [run(dec(1), cascade) for _ in range(10)]
        o2 = []
        for _ in range(10):
            run(dec(2), cascade)
            o2.append(run(dec(1), cascade))
        print(
            f"cascade={cascade} dec7 same {statistics.median(same):.1f} after dec6 {statistics.median(d6):.1f} | dec1 same {statistics.median(one):.1f} after dec2 {statistics.median(o2):.1f}"
        )
