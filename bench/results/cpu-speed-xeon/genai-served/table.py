"""The served three-way table of bench/results/cpu-speed-xeon/genai-served: each run's llmkiln, OpenVINO GenAI served
the same way and vLLM bf16, and llmkiln's ratios to both (run 1 / run 2 ...).

    python bench/results/cpu-speed-xeon/genai-served/table.py DIR [DIR ...]   (folders holding a summary.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

METRICS = (("ttft_ms", "p50", "TTFT p50"), ("ttft_ms", "p95", "TTFT p95"), ("itl_ms", "p99", "ITL p99"))


def value(level: dict, key: str, q: str | None) -> float:
    return float(level[key][q]) if q else float(level[key])


def main(dirs: list[str]) -> None:
    runs = [json.loads((Path(d) / "summary.json").read_text()) for d in dirs]
    systems = list(runs[0]["systems"])
    ours = next(s for s in systems if s.endswith("/dynamo"))
    peers = [s for s in systems if s != ours]
    levels = sorted({int(c) for r in runs for c in r["systems"][ours]["levels"]})
    cols = [*(m[2] for m in METRICS), "out tok/s"]
    print("| c | system | " + " | ".join(cols) + " |")
    print("|---:|---|" + "---:|" * len(cols))
    for c in levels:
        for s in [ours, *peers]:
            cells = []
            for key, q in [*((m[0], m[1]) for m in METRICS), ("output_tok_s", None)]:
                vals = [value(r["systems"][s]["levels"][str(c)], key, q) for r in runs]
                cell = " / ".join(f"{v:.0f}" if key != "itl_ms" else f"{v:.1f}" for v in vals)
                if s != ours:
                    mine = [value(r["systems"][ours]["levels"][str(c)], key, q) for r in runs]
                    cell += " (" + " / ".join(f"{a / b:.2f}" for a, b in zip(mine, vals, strict=True)) + "×)"
                cells.append(cell)
            print(f"| {c} | {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
