"""A served request's TTFT split into hops, per concurrency level of one experiments.cpu_peers run.

    python bench/results/served-ttft/ttft_split.py OUT/raw/SYSTEM.jsonl PROFILE.jsonl

in: client send -> the worker's submit (engine arrival); wait: arrival -> first scheduled; compute: scheduled ->
first token sampled; out: sampled -> the client has it. Dynamo's request ids are not the client's, so the i-th
send of a level is paired with the i-th engine arrival inside the level's time window.
"""

import json
import statistics
import sys
from pathlib import Path


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(raw: str, prof: str) -> None:
    recs = [json.loads(line) for line in Path(raw).read_text().splitlines() if line.strip()]
    eng = [json.loads(line) for line in Path(prof).read_text().splitlines() if line.strip()]
    reqs = sorted(
        (e for e in eng if e.get("kind") == "request" and e.get("first_token")), key=lambda e: e["arrival"]
    )
    steps = [e for e in eng if e.get("kind") == "step"]
    for c in sorted({r["concurrency"] for r in recs}):
        rs = sorted(
            (r for r in recs if r["concurrency"] == c and r.get("token_ns")), key=lambda r: r["send_wall_ns"]
        )
        t0 = rs[0]["send_wall_ns"]
        t1 = max(r["send_wall_ns"] + (r["end_ns"] - r["send_ns"]) for r in rs)
        es = [e for e in reqs if t0 <= e["arrival"] <= t1]
        parts: dict[str, list[float]] = {"client": [], "in": [], "wait": [], "compute": [], "out": []}
        for r, e in zip(rs, es, strict=False):
            first = r["send_wall_ns"] + (r["token_ns"][0] - r["send_ns"])
            parts["client"].append((first - r["send_wall_ns"]) / 1e6)
            parts["in"].append((e["arrival"] - r["send_wall_ns"]) / 1e6)
            parts["wait"].append((e["scheduled"] - e["arrival"]) / 1e6)
            parts["compute"].append((e["first_token"] - e["scheduled"]) / 1e6)
            parts["out"].append((first - e["first_token"]) / 1e6)
        print(f"c={c}: {len(rs)} client, {len(es)} engine records")
        for k, v in parts.items():
            print(
                f"  {k:8s} p50 {statistics.median(v):7.1f}  p95 {pct(v, 0.95):7.1f}  mean {statistics.mean(v):7.1f} ms"
            )
        totals = [s["total_us"] / 1000 for s in steps if t0 <= s["t"] <= t1]
        if totals:
            print(
                f"  steps {len(totals)}: p50 {statistics.median(totals):.1f} ms, mean {statistics.mean(totals):.1f}"
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
