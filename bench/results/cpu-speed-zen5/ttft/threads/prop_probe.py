import json
import os
import pathlib
import statistics
import sys

from experiments.shared_prefix_runs import PAST, decodes_on, prefix_with_decoders, run_ms, token_ids

extra = json.loads(os.environ.get("OVX", "{}")) or None
r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40, compile_extra=extra)
dec7 = decodes_on(tables, 7, 40)
dec8 = decodes_on(tables, 8, 40)


def run(plan):
    return run_ms(r, plan, True)


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
