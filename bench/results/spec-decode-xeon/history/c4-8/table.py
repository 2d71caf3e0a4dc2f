"""c=4/8 with and without the history (H / N), llmkiln-ngram alone, out tok/s per run and the means; the history's
drafts per H run. `python table.py FOLDER` (before-fix/ or after-fix/)."""

import json
import statistics as st
import sys
from pathlib import Path

runs = sorted(Path(sys.argv[1]).glob("*-[HN]"))
for wl in ("grounded", "open"):
    for c in ("4", "8"):
        v: dict[str, list[float]] = {"H": [], "N": []}
        hist = []
        for r in runs:
            d = json.loads((r / "summary.json").read_text())["results"][wl]["llmkiln-ngram"][c]
            v[r.name[-1]].append(d["output_tok_s"])
            if r.name.endswith("H"):
                hist.append(int(d["spec"].get("history_drafted") or 0))
        print(
            f"| {wl} | {c} | {' / '.join(f'{x:.0f}' for x in v['H'])} | {' / '.join(f'{x:.0f}' for x in v['N'])} "
            f"| **{st.mean(v['H']) / st.mean(v['N']):.2f}** | {min(hist)}-{max(hist)} |"
        )
