import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
casc = True
decA = decodes_on(tables, 7, 40)
decB = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(1, 8)]
decC = [(f"s{i}", (7,), PAST + 30, tables[i]) for i in range(7)]


def run(plan):
    return run_ms(r, plan, casc)


for _ in range(3):
    run(decA)
    run(decB)
    run(decC)
for _rnd in range(2):
    same = [run(decA) for _ in range(10)]
    ab = []
    for _ in range(10):
        run(decB)
        ab.append(run(decA))
    ac = []
    for _ in range(10):
        run(decC)
        ac.append(run(decA))
    print(
        f"decA same {statistics.median(same):.1f} | after decB (other seqs, same shape) {statistics.median(ab):.1f} | after decC (shorter pasts) {statistics.median(ac):.1f}"
    )
