import os
import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, prefix_with_decoders, token_ids

n = int(os.environ.get("NTHR", "0"))
r, tables, turn = prefix_with_decoders(
    pathlib.Path(sys.argv[1]), 8, 40, compile_extra={"INFERENCE_NUM_THREADS": n} if n else None
)
dec7 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(7)]


def run(plan):
    t = time.perf_counter()
    r._run(plan, [1] * len(plan), cascade=True)
    return (time.perf_counter() - t) * 1e3


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec7
for _ in range(3):
    run(mixed)
print(
    f"nthr={n} mixed {statistics.median([run(mixed) for _ in range(20)]):.2f}  dec7 {statistics.median([run(dec7) for _ in range(20)]):.2f}"
)
