"""The served step profile of one run ($LLMKILN_PROFILE=FILE while experiments.cpu_peers serves the engine): the
decode run right after a step with prompt tokens against one after a decode step, and the mixed steps, medians.

    python bench/results/prompt-graph/served-rerun/steps.py PROFILE.jsonl ...
"""

import json
import statistics as st
import sys

for path in sys.argv[1:]:
    steps = [
        e for e in (json.loads(x) for x in open(path, encoding="utf-8") if x.strip()) if e["kind"] == "step"
    ]
    after_prompt, after_decode = [], []
    for a, b in zip(steps, steps[1:], strict=False):
        if b["decode"] and not b["prefill"]:
            (after_prompt if a["prefill"] else after_decode).append(b["decode"][3] / 1e3)
    mixed = [e["total_us"] / 1e3 for e in steps if e["prefill"] and e["decode"]]
    print(
        f"{path}: decode run after a prompt step {st.median(after_prompt):.1f} ms (n={len(after_prompt)}), after a "
        f"decode step {st.median(after_decode):.1f} ms (n={len(after_decode)}); mixed steps {st.median(mixed):.1f} ms"
    )
