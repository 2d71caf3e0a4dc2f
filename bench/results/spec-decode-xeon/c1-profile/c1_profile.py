"""Where a lone speculating sequence's step goes (issue 30, c=1): llmkiln-ngram in-process, stepped harness, the
spec_decode workloads at c=1, with the engine's step profile on; per decode-only step: the runner's run (the
graph), sampling/acceptance, the scheduler's update, events, scheduling, and the harness between steps.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/c1_profile.py ENGINE_DIR OUT_DIR [N]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from experiments import spec_decode as sd
from llmkiln.engine_dir import EngineDir
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.runtime.loader import load_engine


def main() -> None:
    folder = EngineDir(Path(sys.argv[1]))
    out = Path(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 24
    out.mkdir(parents=True, exist_ok=True)
    cfg = sd.Config(levels=(1,), requests=(n,), warmup=4, draft_len=8)
    eng = load_engine(folder, cfg.ngram_overrides())
    encoder = PromptEncoder.from_engine(folder)
    summary = {}
    for wl in ("grounded", "open"):
        part = sd.build_part(wl, encoder, cfg)
        sd.stepped_loop(eng, part.warmup, part.ids, 1)
        prof = out / f"{wl}.jsonl"
        prof.unlink(missing_ok=True)
        p = eng.enable_profile(prof)
        t0 = time.perf_counter()
        recs, outs = sd.stepped_loop(eng, part.levels[1], part.ids, 1)
        wall = time.perf_counter() - t0
        p.close()
        eng.profiler = None
        toks = sum(r.num_output_tokens for r in recs)
        steps = [json.loads(x) for x in prof.read_text().splitlines() if '"kind":"step"' in x]
        dec = [s for s in steps if s["decode"] and not s["prefill"]]
        gaps = [(b["t"] - a["t"]) / 1e3 - a["total_us"] for a, b in zip(steps, steps[1:], strict=False)]
        med = lambda xs: round(statistics.median(xs), 1) if xs else None  # noqa: E731
        row = {
            "tok_s": round(toks / wall, 1),
            "steps": len(steps),
            "decode_steps": len(dec),
            "tokens_a_decode_step": round(
                sum(len(o) for o in outs.values()) / max(1, len(dec) + len(steps) - len(dec)), 2
            ),
            "rows_run_med": med([s["decode"][1] for s in dec]),
            "step_us_med": med([s["total_us"] for s in dec]),
            "run_us_med": med([s["decode"][3] for s in dec]),
            "sched_us_med": med([s["sched_us"] for s in dec]),
            "sample_us_med": med([s["sample_us"] for s in dec]),
            "update_us_med": med([s["update_us"] for s in dec]),
            "emit_us_med": med([s["emit_us"] for s in dec]),
            "rest_us_med": med(
                [
                    s["total_us"]
                    - s["decode"][3]
                    - s["sched_us"]
                    - s["sample_us"]
                    - s["update_us"]
                    - s["emit_us"]
                    for s in dec
                ]
            ),
            "between_steps_us_med": med(gaps),
            "step_us_mean": round(statistics.fmean(s["total_us"] for s in dec), 1),
            "run_us_mean": round(statistics.fmean(s["decode"][3] for s in dec), 1),
        }
        summary[wl] = row
        print(wl, json.dumps(row), flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    eng.shutdown(5.0)


if __name__ == "__main__":
    main()
