"""CPU kernel study, OpenVINO's own LLM path: openvino-genai's ContinuousBatchingPipeline (PagedAttention, prefix
caching, batched prefill + decode) on an optimum-intel export of the same HF checkpoint.

Its own venv (the one of experiments/cpu_study_openvino.py, plus optimum-intel, which pulls torch from PyPI):

    /tmp/wt20/venv-ov/bin/pip install "openvino-genai==2026.4.*" "openvino-tokenizers==2026.4.*" "optimum-intel[openvino]"
    /tmp/wt20/venv-ov/bin/optimum-cli export openvino --model MODEL --weight-format fp32 \
        --task text-generation-with-past /tmp/wt20/ov-bench-fp32
    /tmp/wt20/venv-ov/bin/python experiments/cpu_study_openvino_genai.py /tmp/wt20/ov-bench-fp32 --out X.json

Measured per engine step (`pipe.step()`, one scheduler iteration): a 1500-token prefix is cached first, then
B = 1/4/8 requests of prefix + 100 fresh tokens arrive together and generate 16 tokens: the steps that run only
their prefills (batched by the pipeline up to max_num_batched_tokens) and the median decode step at batch B
(context ~1600). Then one 2048-token cold prompt (one step, max_num_batched_tokens 2048). f32 and bf16 inference
precision, the KV cache in the same type.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as og


def pipeline(path: Path, prec: str):
    sc = og.SchedulerConfig()
    sc.max_num_batched_tokens = 2048
    sc.max_num_seqs = 8
    sc.cache_size = 2
    sc.enable_prefix_caching = True
    sc.dynamic_split_fuse = True
    props = {"INFERENCE_PRECISION_HINT": prec, "KV_CACHE_PRECISION": prec, "INFERENCE_NUM_THREADS": 2}
    return og.ContinuousBatchingPipeline(str(path), sc, "CPU", props)


def run_requests(pipe, prompts: list[list[int]], new_tokens: int, base_id: int) -> list[float]:
    cfg = og.GenerationConfig()
    cfg.max_new_tokens = new_tokens
    cfg.ignore_eos = True
    handles = [
        pipe.add_request(base_id + i, ov.Tensor(np.asarray([p], np.int64)), cfg)
        for i, p in enumerate(prompts)
    ]
    steps = []
    while pipe.has_non_finished_requests():
        t = time.perf_counter()
        pipe.step()
        steps.append((time.perf_counter() - t) * 1e3)
    del handles
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--precisions", default="f32,bf16")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    prefix = rng.integers(10, 30000, 1500).tolist()
    out: dict = {"openvino_genai": og.__version__, "loadavg_start": os.getloadavg()[0]}
    rid = 0
    for prec in args.precisions.split(","):
        t = time.perf_counter()
        pipe = pipeline(args.model, prec)
        r: dict = {"load_s": round(time.perf_counter() - t, 1)}
        run_requests(pipe, [prefix + rng.integers(10, 30000, 4).tolist()], 1, rid)  # caches the prefix
        rid += 100
        for b in (1, 4, 8):
            prompts = [prefix + rng.integers(10, 30000, 100).tolist() for _ in range(b)]
            steps = run_requests(pipe, prompts, 16, rid)
            rid += 100
            # with 16 new tokens: the first step(s) prefill (and sample the first token), the rest decode
            decode = steps[-12:]
            r[f"b{b}"] = {
                "prefill_steps_ms": [round(s, 1) for s in steps[: len(steps) - 15]],
                "decode_step_ms": round(statistics.median(decode), 2),
                "decode_min": round(min(decode), 2),
                "decode_max": round(max(decode), 2),
                "steps": len(steps),
            }
        cold = []
        for _ in range(2):
            steps = run_requests(pipe, [rng.integers(10, 30000, 2048).tolist()], 1, rid)
            rid += 100
            cold.append(sum(steps))
        r["cold_prefill_2048_ms"] = round(min(cold), 1)
        out[prec] = r
        print(prec, json.dumps(r), flush=True)
        del pipe
    out["loadavg_end"] = os.getloadavg()[0]
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
