"""In-process closed loop on the runtime (no server): the shared-prefix workload through LLMEngine with the
onnxruntime, torch or OpenVINO runner, so the runners compare with the same scheduler, settings and requests.

    PYTHONPATH=. OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m experiments.cpu_runner_loop --runner torch-bf16 \
        --engine engines/bench-optimized --model bench-llama-125m --out bench/results/cpu-kernels/loop-torch-bf16.json

(scripts/cpu_kernel_study.sh runs every runner.) A 1500-token system prompt (cached by two warm-up requests), then `--requests` requests of prompt + 80-120 fresh
tokens, 32 output tokens each (ignore_eos), `--concurrency` clients in a closed loop; `--rounds` such loops
one after the other on the same engine (fresh user turns each), the median round reported. The engine uses the
bench-optimized recipe's settings (TTFT-first, tpot_slo_ms 100, 512-token chunks, prefix reuse with slot reuse);
with the torch and OpenVINO runners its TTFT-first prefill runs batch prompts on a cached past
(batches_prefills_with_past). The `ov-*` runners load the openvino-cpu engines of the same weights (`kiln build
bench-ov-fp32` / `bench-ov-bf16`, under `--ov-engines`, or the one `--ov-engine` names; their recipes set
max_prefill_tokens 256). `--quick`: a 48-token system prompt, 8-16 fresh tokens, 4 output tokens, 4 requests,
2 clients, one round (any small model: stories260K; it checks the loop runs, its numbers measure nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llmkiln.runtime.request import SamplingParams

if TYPE_CHECKING:
    from llmkiln.runtime.engine import LLMEngine


@dataclass(frozen=True)
class Workload:
    """A `prefix`-token system prompt, then user turns of [fresh_min, fresh_max] tokens, `max_tokens` out each."""

    prefix: int = 1500
    fresh_min: int = 80
    fresh_max: int = 120
    max_tokens: int = 32
    warmups: int = 2


FULL = Workload()
QUICK = Workload(prefix=48, fresh_min=8, fresh_max=16, max_tokens=4, warmups=1)
MAX_ID = 30000  # prompt ids come from [10, min(MAX_ID, vocabulary size))


def _closed_loop(
    eng: LLMEngine, prompts: list[list[int]], params: SamplingParams, concurrency: int
) -> dict[str, float]:
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


RUNNERS = ("ort", "torch-fp32", "torch-bf16", "ov-fp32", "ov-bf16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", default="ort", help=" | ".join(RUNNERS))
    ap.add_argument(
        "--ov-engines",
        type=Path,
        default=Path("engines"),
        help="where `kiln build bench-ov-fp32` / `bench-ov-bf16` put their engines (backend openvino-cpu)",
    )
    ap.add_argument(
        "--ov-engine",
        type=Path,
        default=None,
        help="the openvino-cpu engine (default: OV_ENGINES/bench-RUNNER)",
    )
    ap.add_argument(
        "--engine",
        type=Path,
        default=None,
        help="the onnx-cpu engine (kiln build bench-optimized): the ort runner, the torch runners' settings",
    )
    ap.add_argument("--model", type=Path, default=None, help="the HF checkpoint the torch runners read")
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
    ap.add_argument("--quick", action="store_true", help="a tiny workload, one round (measures nothing)")
    args = ap.parse_args()
    work = QUICK if args.quick else FULL
    if args.quick:
        args.rounds, args.requests, args.concurrency = 1, 4, min(args.concurrency, 2)
    if args.runner not in RUNNERS:
        ap.error(f"--runner {args.runner}: one of {', '.join(RUNNERS)}")
    if args.runner == "ort" or args.runner.startswith("torch-"):
        if args.engine is None:
            ap.error(f"--runner {args.runner} needs --engine")
    if args.runner.startswith("torch-") and args.model is None:
        ap.error(f"--runner {args.runner} needs --model")
    overrides: dict[str, dict[str, int]] = {"scheduler": {"intra_op_threads": 2}}
    if args.max_prefill_tokens:
        overrides["scheduler"]["max_prefill_tokens"] = args.max_prefill_tokens
    if args.runner == "ort":
        from llmkiln.runtime.loader import load_engine

        eng = load_engine(args.engine, overrides)
    elif args.runner.startswith("ov-"):  # the openvino-cpu engines of the same weights
        from llmkiln.runtime.loader import load_engine

        eng = load_engine(args.ov_engine or args.ov_engines / f"bench-{args.runner}", overrides)
    else:
        from experiments.torch_runner import load_torch_engine

        eng = load_torch_engine(args.engine, args.model, args.runner.split("-")[1], overrides)
    if args.profile:
        eng.enable_profile(args.profile)
    if args.no_batch_past:
        eng.scheduler.batch_past_prefills = False
    rng = np.random.default_rng(0)
    hi = min(MAX_ID, eng.runner.vocab_size)
    prefix = rng.integers(10, hi, work.prefix).tolist()
    params = SamplingParams(max_tokens=work.max_tokens, ignore_eos=True)
    eng.start()
    for _ in range(work.warmups):  # warm-up: caches the prefix, touches the pools
        eng.submit(prefix + rng.integers(10, hi, 50).tolist(), params).result(timeout=600)
    load0 = os.getloadavg()[0]
    rounds = []
    for _ in range(args.rounds):  # fresh user turns each round; the median round is reported
        prompts = [
            prefix + rng.integers(10, hi, int(rng.integers(work.fresh_min, work.fresh_max + 1))).tolist()
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
