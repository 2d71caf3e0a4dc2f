"""OpenVINO GenAI stepping one request steadily for perf (c1-profile/perf.out): MODE plain (greedy) or lookup (prompt
lookup K=8, sampled at temperature 1.5 so that drafts fail and every step verifies 8 candidates); a random
300-token prompt; /tmp/gperf_ready_MODE marks the end of the warm-up. Run with the GenAI venv's python:

    python bench/results/spec-decode-xeon/c1-profile/genai_perf_loop.py MODEL_DIR plain|lookup
"""

import pathlib
import sys
import time

import numpy as np
import openvino as ov
import openvino_genai as og

model_dir, mode = sys.argv[1], sys.argv[2]
props: dict[str, object] = {
    "INFERENCE_PRECISION_HINT": "bf16",
    "KV_CACHE_PRECISION": "bf16",
    "INFERENCE_NUM_THREADS": 2,
}
if mode == "lookup":
    props["prompt_lookup"] = True
sc = og.SchedulerConfig()
sc.cache_size = 2
sc.enable_prefix_caching = False
pipe = og.ContinuousBatchingPipeline(model_dir, sc, "CPU", props)
cfg = og.GenerationConfig()
cfg.max_new_tokens = cfg.min_new_tokens = 1800
cfg.ignore_eos = True
cfg.do_sample = mode == "lookup"
cfg.temperature = 1.5
cfg.rng_seed = 1
if mode == "lookup":
    cfg.num_assistant_tokens = 8
    cfg.max_ngram_size = 3
rng = np.random.default_rng(0)
pipe.add_request(0, ov.Tensor(np.array([rng.integers(100, 40000, 300)], dtype=np.int64)), cfg)
for _ in range(30):
    pipe.step()
pathlib.Path(f"/tmp/gperf_ready_{mode}").write_text("1")
t, n = time.perf_counter(), 0
while time.perf_counter() - t < 14 and pipe.has_non_finished_requests():
    pipe.step()
    n += 1
print(mode, "steps", n, f"ms/step {(time.perf_counter() - t) * 1000 / n:.2f}", flush=True)
