import os
import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40)
casc = os.environ.get("CASC", "1") == "1"
print("twin:", r.prompt_req is not None, r.cascade_prompt_req is not None, "cascade", casc)


def dec(n):
    return decodes_on(tables, n, 40)


def run(plan):
    # prompt runs marked as the engine marks them: they take the prompt copy
    return run_ms(r, plan, casc, prompt=any(len(s[1]) > 1 for s in plan))


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec(7)
for _ in range(3):
    run(mixed)
    run(dec(7))
    run(dec(6))
for _rnd in range(2):
    same = [run(dec(7)) for _ in range(10)]
    am = []
    for _ in range(10):
        run(mixed)
        am.append(run(dec(7)))
    a6 = []
    for _ in range(10):
        run(dec(6))
        a6.append(run(dec(7)))
    sl = []
    for _ in range(10):
        time.sleep(0.06)
        sl.append(run(dec(7)))
    print(
        f"dec7 same {statistics.median(same):.1f} | after mixed {statistics.median(am):.1f} | after dec6 {statistics.median(a6):.1f} | after 60ms sleep {statistics.median(sl):.1f}"
    )
