import os
import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

n = int(os.environ.get("NTHR", "0"))
r, tables, turn = prefix_with_decoders(
    pathlib.Path(sys.argv[1]), 8, 40, compile_extra={"INFERENCE_NUM_THREADS": n} if n else None
)
dec7 = decodes_on(tables, 7, 40)


def run(plan):
    return run_ms(r, plan, True)


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec7
for _ in range(3):
    run(mixed)
print(
    f"nthr={n} mixed {statistics.median([run(mixed) for _ in range(20)]):.2f}  dec7 {statistics.median([run(dec7) for _ in range(20)]):.2f}"
)
