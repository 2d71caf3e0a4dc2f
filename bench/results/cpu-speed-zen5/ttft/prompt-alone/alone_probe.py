import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
dec7 = decodes_on(tables, 7, 40)


def run(plan):
    return run_ms(r, plan, True)


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
