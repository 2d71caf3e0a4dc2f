"""A served request's TTFT split into hops, per concurrency level of one experiments.cpu_peers run.

    python bench/results/served-ttft/ttft_split.py OUT/raw/SYSTEM.jsonl PROFILE.jsonl

Hops: client -> worker (client, Dynamo's frontend, request plane: until the worker's generate has the request);
worker -> submit (the worker's Python until the engine took it); wait (arrival -> first scheduled); compute (first
scheduled -> first token sampled); token -> loop (the engine thread hands the token to the worker's event loop);
loop -> Dynamo (the first chunk yielded and taken); Dynamo -> client (back through the request plane, the
frontend, SSE, the client). Without the worker's serve records (before 2026-12-06) only client -> arrival,
wait, compute and first token -> client. Dynamo's request ids are not the client's, so the i-th send of a level
is paired with the i-th request the worker received inside the level's time window.
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
    lines = [json.loads(line) for line in Path(prof).read_text().splitlines() if line.strip()]
    engine = {e["id"]: e for e in lines if e.get("kind") == "request" and e.get("first_token")}
    serves = {e["id"]: e for e in lines if e.get("kind") == "serve" and e.get("first_sent")}
    if serves:  # a worker's request: its serve record and the engine's record of it
        seen = sorted(
            (s | {"engine": engine[i]} for i, s in serves.items() if i in engine), key=lambda x: x["received"]
        )
    else:
        seen = sorted(
            ({"received": e["arrival"], "engine": e} for e in engine.values()), key=lambda x: x["received"]
        )
    steps = [e for e in lines if e.get("kind") == "step"]
    for c in sorted({r["concurrency"] for r in recs}):
        rs = sorted(
            (r for r in recs if r["concurrency"] == c and r.get("token_ns")), key=lambda r: r["send_wall_ns"]
        )
        t0 = rs[0]["send_wall_ns"]
        t1 = max(r["send_wall_ns"] + (r["end_ns"] - r["send_ns"]) for r in rs)
        level = [x for x in seen if t0 <= x["received"] <= t1]
        hops: dict[str, list[float]] = {}
        for r, x in zip(rs, level, strict=False):
            e = x["engine"]
            first = r["send_wall_ns"] + (r["token_ns"][0] - r["send_ns"])
            if serves:
                path = [
                    ("client -> worker", r["send_wall_ns"], x["received"]),
                    ("worker -> submit", x["received"], x["submit"]),
                    ("wait", e["arrival"], e["scheduled"]),
                    ("compute", e["scheduled"], e["first_token"]),
                    ("token -> loop", e["first_token"], x["first_seen"]),
                    ("loop -> Dynamo", x["first_seen"], x["first_sent"]),
                    ("Dynamo -> client", x["first_sent"], first),
                ]
            else:
                path = [
                    ("client -> arrival", r["send_wall_ns"], e["arrival"]),
                    ("wait", e["arrival"], e["scheduled"]),
                    ("compute", e["scheduled"], e["first_token"]),
                    ("first token -> client", e["first_token"], first),
                ]
            for name, a, b in [("client TTFT", r["send_wall_ns"], first), *path]:
                hops.setdefault(name, []).append((b - a) / 1e6)
        print(f"c={c}: {len(rs)} client, {len(level)} worker records")
        for k, v in hops.items():
            print(
                f"  {k:22s} p50 {statistics.median(v):7.1f}  p95 {pct(v, 0.95):7.1f}  mean {statistics.mean(v):7.1f} ms"
            )
        totals = [s["total_us"] / 1000 for s in steps if t0 <= s["t"] <= t1]
        if totals:
            print(
                f"  steps {len(totals)}: p50 {statistics.median(totals):.1f} ms, mean {statistics.mean(totals):.1f}"
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
