"""In-process closed loop on the runtime (no server): the shared-prefix workload through LLMEngine with the
onnxruntime runner or the torch runner, so the runners compare with the same scheduler, settings and requests.

    PYTHONPATH=. OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m experiments.cpu_runner_loop \
        --runner torch-bf16 --out bench/results/cpu-kernels/loop-torch-bf16.json

A 1500-token system prompt (cached by one warm-up request), then `--requests` requests of prompt + 80-120 fresh
tokens, 32 output tokens each (ignore_eos), `--concurrency` clients in a closed loop. The engine uses the
bench-optimized recipe's settings (TTFT-first, tpot_slo_ms 100, 512-token chunks, prefix reuse with slot reuse);
with the torch and OpenVINO runners its TTFT-first prefill runs batch prompts on a cached past
(batches_prefills_with_past). The `ov-*` runners run in the OpenVINO venv (openvino, plus pydantic, pyyaml,
ml_dtypes and tokenizers for the runtime), with PYTHONPATH at this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from llmkiln.runtime.request import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", default="ort", help="ort | torch-fp32 | torch-bf16 | ov-fp32 | ov-bf16")
    ap.add_argument(
        "--ov-model", type=Path, default=Path("/tmp/wt20/ov-bench-fp32"), help="optimum-intel export"
    )
    ap.add_argument("--engine", type=Path, default=Path("/tmp/wt20/engines/bench-optimized"))
    ap.add_argument("--model", type=Path, default=Path("/tmp/wt20/bench-llama-125m"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    overrides = {"scheduler": {"intra_op_threads": 2}}
    if args.runner == "ort":
        from llmkiln.runtime.loader import load_engine

        eng = load_engine(args.engine, overrides)
    elif args.runner.startswith("ov-"):  # in the OpenVINO venv (openvino is not a package dependency)
        from llmkiln.runtime.openvino_runner import load_openvino_engine

        eng = load_openvino_engine(args.engine, args.ov_model, args.runner.split("-")[1], overrides)
    else:
        from llmkiln.runtime.torch_runner import load_torch_engine

        eng = load_torch_engine(args.engine, args.model, args.runner.split("-")[1], overrides)
    rng = np.random.default_rng(0)
    prefix = rng.integers(10, 30000, 1500).tolist()
    prompts = [
        prefix + rng.integers(10, 30000, int(rng.integers(80, 121))).tolist() for _ in range(args.requests)
    ]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    eng.start()
    for _ in range(2):  # warm-up: caches the prefix, touches the pools
        eng.submit(prefix + rng.integers(10, 30000, 50).tolist(), params).result(timeout=600)
    ttft: list[float] = []
    lock = threading.Lock()
    it = iter(prompts)

    def client() -> None:
        while True:
            with lock:
                p = next(it, None)
            if p is None:
                return
            h = eng.submit(p, params)
            h.result(timeout=600)
            with lock:
                ttft.append(h.timings.ttft_ns / 1e6)

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    m = eng.metrics()
    eng.shutdown()
    ttft.sort()
    res = {
        "runner": args.runner,
        "concurrency": args.concurrency,
        "requests": args.requests,
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "ttft_p50_ms": round(statistics.median(ttft), 1),
        "ttft_p95_ms": round(ttft[int(0.95 * (len(ttft) - 1))], 1),
        "output_tok_s": round(args.requests * 32 / wall, 1),
        "mean_decode_step_ms": round(m.get("mean_decode_step_ms", 0.0), 1),
        "mean_prefill_step_ms": round(m.get("mean_prefill_step_ms", 0.0), 1),
        "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate"),
        "wall_s": round(wall, 2),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
