"""In-process closed loop on the runtime (no server): the shared-prefix workload through LLMEngine with the
onnxruntime runner or the torch runner, so the runners compare with the same scheduler, settings and requests.

    PYTHONPATH=. OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m experiments.cpu_runner_loop \
        --runner torch-bf16 --out bench/results/cpu-kernels/loop-torch-bf16.json

A 1500-token system prompt (cached by one warm-up request), then `--requests` requests of prompt + 80-120 fresh
tokens, 32 output tokens each (ignore_eos), `--concurrency` clients in a closed loop; `--rounds` such loops
one after the other on the same engine (fresh user turns each), the median round reported. The engine uses the
bench-optimized recipe's settings (TTFT-first, tpot_slo_ms 100, 512-token chunks, prefix reuse with slot reuse);
with the torch and OpenVINO runners its TTFT-first prefill runs batch prompts on a cached past
(batches_prefills_with_past). The `ov-*` runners load the openvino-cpu engines of the same weights (`kiln build
bench-ov-fp32` / `bench-ov-bf16`, under `--ov-engines`; their recipes set max_prefill_tokens 256).
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


def _closed_loop(eng, prompts: list[list[int]], params: SamplingParams, concurrency: int) -> dict[str, float]:
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

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft.sort()
    return {
        "ttft_p50_ms": round(statistics.median(ttft), 1),
        "ttft_p95_ms": round(ttft[int(0.95 * (len(ttft) - 1))], 1),
        "output_tok_s": round(len(prompts) * params.max_tokens / wall, 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", default="ort", help="ort | torch-fp32 | torch-bf16 | ov-fp32 | ov-bf16")
    ap.add_argument(
        "--ov-engines",
        type=Path,
        default=Path("engines"),
        help="where `kiln build bench-ov-fp32` / `bench-ov-bf16` put their engines (backend openvino-cpu)",
    )
    ap.add_argument("--engine", type=Path, default=Path("/tmp/wt20/engines/bench-optimized"))
    ap.add_argument("--model", type=Path, default=Path("/tmp/wt20/bench-llama-125m"))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-prefill-tokens", type=int, default=None, help="override the recipe's (512)")
    ap.add_argument("--no-batch-past", action="store_true", help="TTFT-first runs a prompt on a past alone")
    ap.add_argument(
        "--rounds", type=int, default=3, help="closed loops run one after the other (median reported)"
    )
    ap.add_argument(
        "--profile", type=Path, default=None, help="write the runtime's step profile here (JSONL)"
    )
    args = ap.parse_args()
    overrides: dict = {"scheduler": {"intra_op_threads": 2}}
    if args.max_prefill_tokens:
        overrides["scheduler"]["max_prefill_tokens"] = args.max_prefill_tokens
    if args.runner == "ort":
        from llmkiln.runtime.loader import load_engine

        eng = load_engine(args.engine, overrides)
    elif args.runner.startswith("ov-"):  # the openvino-cpu engines of the same weights
        from llmkiln.runtime.loader import load_engine

        eng = load_engine(args.ov_engines / f"bench-{args.runner}", overrides)
    else:
        from experiments.torch_runner import load_torch_engine

        eng = load_torch_engine(args.engine, args.model, args.runner.split("-")[1], overrides)
    if args.profile:
        eng.enable_profile(args.profile)
    if args.no_batch_past:
        eng.scheduler.batch_past_prefills = False
    rng = np.random.default_rng(0)
    prefix = rng.integers(10, 30000, 1500).tolist()
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    eng.start()
    for _ in range(2):  # warm-up: caches the prefix, touches the pools
        eng.submit(prefix + rng.integers(10, 30000, 50).tolist(), params).result(timeout=600)
    load0 = os.getloadavg()[0]
    rounds = []
    for _ in range(args.rounds):  # fresh user turns each round; the median round is reported
        prompts = [
            prefix + rng.integers(10, 30000, int(rng.integers(80, 121))).tolist()
            for _ in range(args.requests)
        ]
        rounds.append(_closed_loop(eng, prompts, params, args.concurrency))
    m = eng.metrics()
    eng.shutdown()

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in rounds), 1)

    res = {
        "runner": args.runner
        + (" (past prefills alone)" if args.no_batch_past else "")
        + (f" (max_prefill_tokens {args.max_prefill_tokens})" if args.max_prefill_tokens else ""),
        "concurrency": args.concurrency,
        "requests": args.requests,
        "rounds": args.rounds,
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "ttft_p50_ms": med("ttft_p50_ms"),
        "ttft_p95_ms": med("ttft_p95_ms"),
        "output_tok_s": med("output_tok_s"),
        "per_round": rounds,
        "mean_decode_step_ms": round(m.get("mean_decode_step_ms", 0.0), 1),
        "mean_prefill_step_ms": round(m.get("mean_prefill_step_ms", 0.0), 1),
        "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
