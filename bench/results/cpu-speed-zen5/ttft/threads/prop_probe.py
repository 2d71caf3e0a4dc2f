import json
import os
import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, prefix_with_decoders, token_ids

extra = json.loads(os.environ.get("OVX", "{}")) or None
r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40, compile_extra=extra)
dec7 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(7)]
dec8 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(8)]


def run(plan):
    t = time.perf_counter()
    r._run(plan, [1] * len(plan), cascade=True)
    return (time.perf_counter() - t) * 1e3


mixed = [("t", token_ids(r, 900, 100), PAST, turn)] + dec7
for _ in range(3):
    run(mixed)
m, d = [], []
for _ in range(15):
    m.append(run(mixed))
    d.append(run(dec8))
inforce = {
    k: str(r.compiled.get_property(k)) for k in ("TBB_PARTITIONER", "ENABLE_CPU_PINNING", "PERFORMANCE_HINT")
}
print(
    f"{os.environ.get('OVX', '{}'):40s} mixed {statistics.median(m):6.2f}  dec8 {statistics.median(d):6.2f}  {inforce}"
)
