"""c=4/8 with and without the history (H / N), llmkiln-ngram alone, out tok/s per run and the means; the history's
drafts per H run. `PYTHONPATH=. python bench/results/spec-decode-xeon/history/c4-8/table.py FOLDER` (before-fix/ or
after-fix/)."""

import statistics as st
import sys
from pathlib import Path

from experiments.spec_decode import level_result

runs = sorted(Path(sys.argv[1]).glob("*-[HN]"))
for wl in ("grounded", "open"):
    for c in ("4", "8"):
        v: dict[str, list[float]] = {"H": [], "N": []}
        hist = []
        for r in runs:
            d = level_result(r, wl, "llmkiln-ngram", int(c))
            assert d is not None, f"{r}: no {wl} c={c}"
            v[r.name[-1]].append(d["output_tok_s"])
            if r.name.endswith("H"):
                hist.append(int(d["spec"].get("history_drafted") or 0))
        print(
            f"| {wl} | {c} | {' / '.join(f'{x:.0f}' for x in v['H'])} | {' / '.join(f'{x:.0f}' for x in v['N'])} "
            f"| **{st.mean(v['H']) / st.mean(v['N']):.2f}** | {min(hist)}-{max(hist)} |"
        )
