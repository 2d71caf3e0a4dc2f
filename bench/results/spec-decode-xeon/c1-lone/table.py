"""The c1-lone rounds as one table: per round and workload, llmkiln-ngram ÷ GenAI's prompt lookup (out tok/s) with
a lone sequence's drafts free (on, the default) and priced by the learned fit (off, $LLMKILN_LONE_DRAFTS_FREE=0),
GenAI's from the round's `on` run; tokens a decode step.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-lone/table.py bench/results/spec-decode-xeon/c1-lone
"""

import sys
from pathlib import Path

from experiments.spec_decode import level_result

root = Path(sys.argv[1])


print(
    "| round | workload | on ÷ GenAI | off ÷ GenAI | on ÷ off | tok/s on / off / GenAI | tokens a step on / off / GenAI |"
)
print("|---|---|---:|---:|---:|---:|---:|")
for r in sorted({p.name.split("-")[0] for p in root.glob("R*-on")}, key=lambda x: int(x[1:])):
    for wl in ("grounded", "open"):
        on = level_result(root / f"{r}-on", wl, "llmkiln-ngram", 1)
        g = level_result(root / f"{r}-on", wl, "ovgenai-lookup", 1)
        off = level_result(root / f"{r}-off", wl, "llmkiln-ngram", 1)
        if not (on and g):
            continue
        if off is None:  # a round without the learned-price run (R5-R8)
            t, s = [on["output_tok_s"], g["output_tok_s"]], [on["spec"]["tokens_per_decode_step"]]
            s.append(g["spec"]["tokens_per_decode_step"])
            print(
                f"| {r} | {wl} | {t[0] / t[1]:.2f} | - | - | {t[0]:.0f} / - / {t[1]:.0f} | "
                f"{s[0]:.2f} / - / {s[1]:.2f} |"
            )
            continue
        t = [x["output_tok_s"] for x in (on, off, g)]
        s = [x["spec"]["tokens_per_decode_step"] for x in (on, off, g)]
        print(
            f"| {r} | {wl} | {t[0] / t[2]:.2f} | {t[1] / t[2]:.2f} | {t[0] / t[1]:.2f} | "
            f"{t[0]:.0f} / {t[1]:.0f} / {t[2]:.0f} | {s[0]:.2f} / {s[1]:.2f} / {s[2]:.2f} |"
        )
