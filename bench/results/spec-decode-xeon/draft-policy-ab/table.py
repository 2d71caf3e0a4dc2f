"""llmkiln-ngram ÷ ovgenai-lookup output tok/s per run (tokens a decode step, acceptance), from the runs' summaries.

python bench/results/spec-decode-xeon/draft-policy-ab/table.py A1 B1 B2 A2 ...    # from the repository root
(a tag is a run folder beside this script, or any run folder's path)
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(tags: list[str]) -> None:
    rows: dict[tuple[str, str], dict[str, tuple[float, float, float]]] = {}
    for t in tags:
        path = HERE / t / "summary.json"
        if not path.exists():
            path = Path(t) / "summary.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())["results"]
        for workload, systems in results.items():
            ours, genai = systems.get("llmkiln-ngram", {}), systems.get("ovgenai-lookup", {})
            for c, lv in ours.items():
                ref = genai.get(c)
                if not ref or not lv.get("output_tok_s") or not ref.get("output_tok_s"):
                    continue
                sp = lv.get("spec", {})
                ratio = lv["output_tok_s"] / ref["output_tok_s"]
                rows.setdefault((workload, c), {})[t] = (
                    ratio,
                    sp["tokens_per_decode_step"],
                    sp["acceptance"],
                )
    print("workload c | " + " | ".join(tags))
    for (workload, c), d in rows.items():
        cells = [f"{d[t][0]:.2f} ({d[t][1]:.2f}, {d[t][2]:.2f})" if t in d else "-" for t in tags]
        print(f"{workload} {c} | " + " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1:])
