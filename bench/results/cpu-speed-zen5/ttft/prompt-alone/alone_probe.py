import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, prefix_with_decoders, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
dec7 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(7)]


def run(plan):
    t = time.perf_counter()
    r._run(plan, [1] * len(plan), cascade=True)
    return (time.perf_counter() - t) * 1e3


alone = [("t", token_ids(r, 900, 100), PAST, turn)]
mixed = alone + dec7
for _rnd in range(3):
    a, m, d = [], [], []
    for _ in range(12):
        a.append(run(alone))
        d.append(run(dec7))
        m.append(run(mixed))
        d.append(run(dec7))
    print(
        f"alone {statistics.median(a):.2f}  mixed {statistics.median(m):.2f}  dec7 {statistics.median(d):.2f}"
    )
