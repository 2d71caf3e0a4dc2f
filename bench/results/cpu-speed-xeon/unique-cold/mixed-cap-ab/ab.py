"""Served mixed-long-short at c=8 under scheduler variants (`kiln serve --dynamo --workers 1`, max_batch_size 32;
8 warm-up requests, then 96 measured: a 2048-token prompt every 8th, 32-128-token ones otherwise, 32 ± 16 output
tokens), one server per round, rounds in the order VARIANTS gives:
- `cap` (mixed-cap-ab/): max_prefill_tokens_decoding 256 (the bench-ov recipes) against 1024: 256, 1024, 1024, 256;
- `short-prompt-cap` (short-prompt-cap/mixed/): the cap of 256 with decoding_cap_needs_short_prompts true, then
  false.

    python bench/results/cpu-speed-xeon/unique-cold/mixed-cap-ab/ab.py cap|short-prompt-cap OUT [ENGINE]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, ".")
from llmkiln.bench.report import save_report
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.bench.workloads import WorkloadSpec, build_workload, load_tokenizer
from llmkiln.dynamo.options import DynamoOptions


def _cap(n: int) -> tuple[str, dict[str, Any]]:
    return f"cap{n}", {"max_prefill_tokens_decoding": n}


def _short_prompts(on: bool) -> tuple[str, dict[str, Any]]:
    return f"flag{int(on)}", {"max_prefill_tokens_decoding": 256, "decoding_cap_needs_short_prompts": on}


VARIANTS = {  # rounds: (label, scheduler fields)
    "cap": [_cap(256), _cap(1024), _cap(1024), _cap(256)],
    "short-prompt-cap": [_short_prompts(True), _short_prompts(False)],
}


def main(variants: str, out: Path, engine: Path) -> None:
    tok = load_tokenizer(engine)
    spec = WorkloadSpec(
        name="mixed-long-short", num_requests=8 + 96, seed=0, output_tokens=32, output_spread=16
    )
    wl = build_workload(tok, spec)
    warm, meas = replace(wl, requests=wl.requests[:8]), replace(wl, requests=wl.requests[8:])
    out.mkdir(parents=True, exist_ok=True)
    for rnd, (label, fields) in enumerate(VARIANTS[variants], start=1):
        sched = {"max_batch_size": 32, **fields}
        opts = DynamoOptions(workers=1, grace_period_s=1.0, overrides={"scheduler": sched})
        with serve_dynamo_engine(engine, opts, ready_timeout_s=300) as launcher:
            common = {
                "url": launcher.url,
                "model": launcher.spec.served_model_name or "llmkiln",
                "api": "completions",
                "timeout_s": 900,
                "ready_timeout_s": 60,
                "seed": 0,
                "progress": False,
            }
            run_bench(
                BenchConfig(workload=warm, concurrency=(8,), requests_per_level=8, label="warm", **common)
            )
            report, recs = run_bench(
                BenchConfig(workload=meas, concurrency=(8,), requests_per_level=96, label=label, **common)
            )
        save_report(report, out / f"r{rnd}-{label}.json")
        line = [f"r{rnd} {label} tok/s {report.levels[0].output_token_throughput:.1f}"]
        for group in ("long", "short"):
            rs = [r for r in recs[8] if r.group == group and r.token_ns]
            ttft = [(r.token_ns[0] - r.send_ns) / 1e6 for r in rs]
            itl = [(b - a) / 1e6 for r in rs for a, b in zip(r.token_ns, r.token_ns[1:], strict=False)]
            line.append(
                f"{group}: n={len(rs)} TTFT p50 {np.percentile(ttft, 50):.0f} p95 {np.percentile(ttft, 95):.0f} "
                f"ITL p50 {np.percentile(itl, 50):.1f} p99 {np.percentile(itl, 99):.1f}"
            )
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3] if len(sys.argv) > 3 else "engines/bench-ov-bf16"))
