import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import decodes_on, prefix_with_decoders, run_ms

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)


def dec(n):
    return decodes_on(tables, n, 40)


def run(plan, cascade):
    return run_ms(r, plan, cascade)


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
