"""OpenVINO's own PagedAttention graph with a u8 KV cache against the bf16 one (and the cascade graph), one run at a
time: 8 decodes with 40 own tokens each on a 1504-token prefix, and 7 of them + a 100-token turn; medians of 15
runs after 3. Needs u8-kv-probe.patch applied (the runner's pools by input shape: OpenVINO's u8 blocks carry their
scales), for KV "u8" only. The set-up and the timer are experiments.shared_prefix_runs' (u8-kv.txt was taken with an
inline copy of them: 4 blocks a decoder instead of 3, the same shapes and counts).

    PYTHONPATH=. python bench/results/cpu-speed-zen5/op-balance/u8_kv_probe.py engines/bench-ov-bf16 u8|same paged|cascade
"""

import pathlib
import sys

from experiments.shared_prefix_runs import PAST, median_run_ms, prefix_with_decoders, token_ids

kv, graph = sys.argv[2], sys.argv[3]
cascade = graph == "cascade"
extra = None if kv == "same" else {"KV_CACHE_PRECISION": kv}
r, tables, turn = prefix_with_decoders(pathlib.Path(sys.argv[1]), 8, 40, cascade, compile_extra=extra)
dec8 = [(f"s{i}", (7,), PAST + 40, tables[i]) for i in range(8)]
mixed = [("t", token_ids(r, 900, 100), PAST, turn), *dec8[:7]]
for name, plan in [("8 decodes", dec8), ("7 decodes + a 100-token turn", mixed)]:
    ms = median_run_ms(r, plan, cascade=cascade)
    print(f"KV {kv} ({r.cache_type}), {graph} graph, {name}: {ms:.2f} ms")
