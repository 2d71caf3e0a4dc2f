"""The history rounds as one table: per round and workload, llmkiln-ngram with earlier replies as a second draft
source (H: `--history-tokens 16384`, speculative.history_tokens) and without (N: its own prompt and output only),
each ÷ GenAI's prompt lookup (out tok/s, GenAI from the round's H run); tokens a decode step; the history's drafts
and how many were accepted; means over the rounds.

    PYTHONPATH=. python bench/results/spec-decode-xeon/history/table.py bench/results/spec-decode-xeon/history
"""

import sys
from pathlib import Path
from statistics import mean

from experiments.spec_decode import level_result

root = Path(sys.argv[1])


print(
    "| round | workload | H ÷ GenAI | N ÷ GenAI | H ÷ N | tok/s H / N / GenAI | tokens a step H / N / GenAI "
    "| history drafts accepted |"
)
print("|---|---|---:|---:|---:|---:|---:|---:|")
ratios: dict[str, dict[str, list[float]]] = {}
for r in sorted({p.name.split("-")[0] for p in root.glob("R*-H")}, key=lambda x: int(x[1:])):
    for wl in ("grounded", "open"):
        h = level_result(root / f"{r}-H", wl, "llmkiln-ngram", 1)
        g = level_result(root / f"{r}-H", wl, "ovgenai-lookup", 1)
        n = level_result(root / f"{r}-N", wl, "llmkiln-ngram", 1)
        if not (h and g and n):
            continue
        t = [x["output_tok_s"] for x in (h, n, g)]
        s = [x["spec"]["tokens_per_decode_step"] for x in (h, n, g)]
        hd, ha = h["spec"].get("history_drafted"), h["spec"].get("history_accepted")
        acc = f"{ha:.0f} of {hd:.0f}" if hd else "-"
        r_ = ratios.setdefault(wl, {"H": [], "N": [], "HN": []})
        r_["H"].append(t[0] / t[2])
        r_["N"].append(t[1] / t[2])
        r_["HN"].append(t[0] / t[1])
        print(
            f"| {r} | {wl} | {t[0] / t[2]:.2f} | {t[1] / t[2]:.2f} | {t[0] / t[1]:.2f} | "
            f"{t[0]:.0f} / {t[1]:.0f} / {t[2]:.0f} | {s[0]:.2f} / {s[1]:.2f} / {s[2]:.2f} | {acc} |"
        )
for wl, r_ in ratios.items():
    ahead = sum(x >= 1.0 for x in r_["H"])
    print(
        f"| mean | {wl} | **{mean(r_['H']):.2f}** ({ahead} of {len(r_['H'])} ≥ 1) | {mean(r_['N']):.2f} "
        f"| {mean(r_['HN']):.2f} | | | |"
    )
