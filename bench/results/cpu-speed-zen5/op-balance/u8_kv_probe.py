"""OpenVINO's own PagedAttention graph with a u8 KV cache against the bf16 one (and the cascade graph), one run at a
time: 8 decodes with 40 own tokens each on a 1504-token prefix, and 7 of them + a 100-token turn; medians of 15
runs after 3. Needs u8-kv-probe.patch applied (the runner's pools by input shape: OpenVINO's u8 blocks carry their
scales), for KV "u8" only.

    PYTHONPATH=. python bench/results/cpu-speed-zen5/op-balance/u8_kv_probe.py engines/bench-ov-bf16 u8|same paged|cascade
"""

import pathlib
import statistics
import sys
import time

from experiments.shared_prefix_runs import PAST, token_ids
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner
from llmkiln.runtime.openvino_settings import OpenVinoSettings

kv, graph = sys.argv[2], sys.argv[3]
real_properties = OpenVinoSettings.properties


def with_kv(self: OpenVinoSettings) -> dict[str, object]:
    return {**real_properties(self), "KV_CACHE_PRECISION": kv}


if kv != "same":
    OpenVinoSettings.properties = with_kv  # type: ignore[method-assign]
folder = EngineDir(pathlib.Path(sys.argv[1]))
cascade = graph == "cascade"
r = OpenVinoPagedRunner(
    folder.openvino_model(), 48, 2048, None, 0, folder.recipe().precision, cascade=cascade
)
r.padding.limit = 0
prefix = tuple(range(PAST // r.block_size))
nxt = len(prefix)
r._run([("p", token_ids(r, 1, PAST), 0, prefix)], [1], cascade=False)
tables = []
for i in range(8):
    tables.append(prefix + tuple(range(nxt, nxt + 4)))
    nxt += 4
    r._run([(f"s{i}", token_ids(r, 200 + i, 40), PAST, tables[i])], [1], cascade=False)
dec8 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(8)]
mixed = [("t", token_ids(r, 900, 100), PAST, prefix + tuple(range(nxt, nxt + 8))), *dec8[:7]]
for name, plan in [("8 decodes", dec8), ("7 decodes + a 100-token turn", mixed)]:
    for _ in range(3):
        r._run(plan, [1] * len(plan), cascade=cascade)
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        r._run(plan, [1] * len(plan), cascade=cascade)
        ts.append((time.perf_counter() - t) * 1e3)
    print(f"KV {kv} ({r.cache_type}), {graph} graph, {name}: {statistics.median(ts):.2f} ms")
