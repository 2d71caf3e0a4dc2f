"""Step profiles of a served engine: read the runtime's profile file (llmkiln.runtime.profile) and aggregate it.

A level's profile covers the engine steps between the first arrival and the last finish of that level's
requests (matched by request id: the bench client sends the workload index as the Triton request id), and
breaks each request's TTFT into the hops it takes, all on the machine's wall clock (time.time_ns()):

    client send → backend got it → submitted → scheduled → first token sampled → seen by the stream
    → first response handed to Triton → received by the client

`Phases` says where the engine's busy time went (scheduling, prefix-block loads and saves, prefill runs,
decode batches, sampling, scheduler update, handing events to the streams) and how much of the level's wall
time the engine was idle.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from llmkiln.bench.stats import Dist, RequestRecord, summarize
from llmkiln.errors import BadInput

PHASES = ("schedule", "load", "prefill", "decode", "save", "sample", "update", "emit", "other")
HOPS = (
    ("to_backend", "client send → python backend got the request"),
    ("parse", "request parsed, submitted to the engine"),
    ("queue", "submitted → first scheduled (tokenization included)"),
    ("prefill", "first scheduled → first token sampled (own prefill + other work in those steps)"),
    ("to_stream", "first token sampled → seen by the request's stream (event loop)"),
    ("to_triton", "seen → first response ready for Triton (detokenize)"),
    ("to_client", "→ received by the client (response built, sent through the stub, Triton, gRPC)"),
)


@dataclass
class ProfileData:
    """The records of one profile file, by kind (requests and serve records keyed by request id)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    # by request id; a server may see an id more than once (each workload of a run counts from 0)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    serves: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def read_profile(path: str | Path) -> ProfileData:
    """Parse a profile file written with $LLMKILN_PROFILE / LLMEngine.enable_profile."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no profile file (was the engine started with $LLMKILN_PROFILE set?)")
    data = ProfileData()
    for line in p.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        kind = rec.get("kind")
        if kind == "step":
            data.steps.append(rec)
        elif kind == "request":
            data.requests.setdefault(rec["id"], []).append(rec)
        elif kind == "serve":
            data.serves.setdefault(rec["id"], []).append(rec)
    return data


class Phases(BaseModel):
    """Engine time by phase over a window, in ms, and each phase's share of the window's wall time."""

    model_config = ConfigDict(extra="forbid")

    wall_ms: float
    busy_ms: float
    idle_ms: float
    ms: dict[str, float]
    share: dict[str, float]  # of the wall time; idle included


class RunStats(BaseModel):
    """Runs of one kind (prefill or decode) over a window."""

    model_config = ConfigDict(extra="forbid")

    runs: int
    tokens: int  # prefill: tokens computed; decode: sequences decoded (= tokens)
    rows: int  # prefill: sequences (batch rows); decode: rows run, idle slots in the range included
    ms: Dist
    ms_per_token: float | None
    mean_context: float | None  # prefill: past length; decode: attention width


class LevelProfile(BaseModel):
    """The step profile of one concurrency level."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    steps: int
    step_ms: Dist
    phases: Phases
    prefill: RunStats
    decode: RunStats
    loads: int
    saves: int
    hops_ms: dict[str, Dist]  # per-request TTFT breakdown, see HOPS
    own_prefill_ms: Dist  # the request's own prefill runs (the rest of `prefill` is other work)
    send_ms: Dist  # per streamed response: time the serving loop spent inside the stub's send()
    ttft_ms: Dist  # the client's TTFT of the same requests


def _ms(us: float) -> float:
    return us / 1000.0


def _phase_ms(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    ms = dict.fromkeys(PHASES, 0.0)
    for s in steps:
        prefill = sum(r[3] for r in s["prefill"])
        decode = s["decode"][3] if s["decode"] else 0
        known = {
            "schedule": s["sched_us"],
            "load": s["load_us"],
            "prefill": prefill,
            "decode": decode,
            "save": s["save_us"],
            "sample": s["sample_us"],
            "update": s["update_us"],
            "emit": s["emit_us"],
        }
        for k, v in known.items():
            ms[k] += _ms(v)
        ms["other"] += _ms(max(0, s["total_us"] - sum(known.values())))
    return ms


def _runs(steps: Sequence[dict[str, Any]], kind: str) -> RunStats:
    if kind == "prefill":
        runs = [r for s in steps for r in s["prefill"]]
        tokens = sum(r[1] for r in runs)
        rows = sum(r[0] for r in runs)
        times = [_ms(r[3]) for r in runs]
        ctx = [r[2] for r in runs]
    else:
        runs = [s["decode"] for s in steps if s["decode"]]
        tokens = sum(r[0] for r in runs)
        rows = sum(r[1] for r in runs)
        times = [_ms(r[3]) for r in runs]
        ctx = [r[2] for r in runs]
    total = sum(times)
    return RunStats(
        runs=len(runs),
        tokens=tokens,
        rows=rows,
        ms=summarize(times),
        ms_per_token=total / tokens if tokens else None,
        mean_context=sum(ctx) / len(ctx) if ctx else None,
    )


def _near(recs: list[dict[str, Any]], key: str, t_ns: int) -> dict[str, Any] | None:
    """The record whose `key` stamp is closest after t_ns (the client's send of that request)."""
    after = [r for r in recs if r.get(key) and r[key] >= t_ns - 1_000_000]
    return min(after, key=lambda r: r[key]) if after else None


def level_profile(
    concurrency: int, records: Sequence[RequestRecord], data: ProfileData
) -> LevelProfile | None:
    """The profile of the steps and requests of one level (None when the file has none of its requests).

    Requests are matched by id and, since ids repeat across the workloads of one server, by time: the engine
    and serve records of a request are the first ones after the client sent it."""
    ok = [r for r in records if r.ok and r.send_wall_ns]
    engine: dict[str, dict[str, Any]] = {}
    serve: dict[str, dict[str, Any]] = {}
    for r in ok:
        rid = str(r.index)
        e = _near(data.requests.get(rid, []), "arrival", r.send_wall_ns)
        sv = _near(data.serves.get(rid, []), "received", r.send_wall_ns)
        if e is not None:
            engine[rid] = e
        if sv is not None:
            serve[rid] = sv
    ids = list(engine)
    reqs = list(engine.values())
    if not reqs:
        return None
    start = min(r["arrival"] for r in reqs)
    end = max(r["finish"] or r["arrival"] for r in reqs)
    steps = [s for s in data.steps if start <= s["t"] <= end]
    ms = _phase_ms(steps)
    wall = max((end - start) / 1e6, 1e-9)
    busy = sum(_ms(s["total_us"]) for s in steps)
    idle = max(0.0, wall - busy)
    share = {k: v / wall for k, v in ms.items()} | {"idle": idle / wall}
    own: dict[str, float] = {}
    for s in steps:
        for run in s["prefill"]:
            for rid in run[4]:
                own[rid] = own.get(rid, 0.0) + _ms(run[3]) / len(run[4])
    hops: dict[str, list[float]] = {name: [] for name, _ in HOPS}
    by_id = {str(r.index): r for r in ok}
    for rid in ids:
        e, sv, c = engine[rid], serve.get(rid), by_id[rid]
        if sv is None or not e.get("first_token") or not sv.get("first_sent"):
            continue
        client_first = c.send_wall_ns + (c.token_ns[0] - c.send_ns)
        stamps = [
            c.send_wall_ns,
            sv["received"],
            sv["submit"],
            e["scheduled"],
            e["first_token"],
            sv["first_seen"],
            sv["first_sent"],
            client_first,
        ]
        # NOTE: the engine stamps arrival at submit(); "queue" starts at the backend's submit stamp.
        for (name, _), a, b in zip(HOPS, stamps, stamps[1:], strict=False):
            hops[name].append((b - a) / 1e6)
    return LevelProfile(
        concurrency=concurrency,
        steps=len(steps),
        step_ms=summarize(_ms(s["total_us"]) for s in steps),
        phases=Phases(wall_ms=wall, busy_ms=busy, idle_ms=idle, ms=ms, share=share),
        prefill=_runs(steps, "prefill"),
        decode=_runs(steps, "decode"),
        loads=sum(s["loads"] for s in steps),
        saves=sum(s["saves"] for s in steps),
        hops_ms={k: summarize(v) for k, v in hops.items()},
        own_prefill_ms=summarize(own[i] for i in ids if i in own),
        send_ms=summarize(
            serve[i]["send_us"] / 1000 / serve[i]["sends"] for i in serve if serve[i].get("sends")
        ),
        ttft_ms=summarize(r.ttft_ms for r in records if r.ok),
    )


def profile_levels(records: dict[int, list[RequestRecord]], path: str | Path) -> dict[str, LevelProfile]:
    """Profiles of every level of a run (keyed by str(concurrency)), from the server's profile file."""
    data = read_profile(path)
    out = {}
    for c, recs in records.items():
        prof = level_profile(c, recs, data)
        if prof is not None:
            out[str(c)] = prof
    return out


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def markdown_profile(prof: LevelProfile) -> str:
    """Phase shares, run statistics and the TTFT breakdown of one level as Markdown."""
    ph = prof.phases
    lines = [
        f"Concurrency {prof.concurrency}: {prof.steps} steps in {ph.wall_ms / 1000:.2f} s "
        f"(busy {ph.busy_ms / 1000:.2f} s, idle {ph.idle_ms / 1000:.2f} s); "
        f"step p50 {_f(prof.step_ms.p50)} ms, p95 {_f(prof.step_ms.p95)} ms; "
        f"{prof.loads} block loads, {prof.saves} block saves.",
        "",
        "| phase | ms | share of wall time |",
        "|---|---:|---:|",
    ]
    for k in (*PHASES, "idle"):
        v = ph.idle_ms if k == "idle" else ph.ms[k]
        lines.append(f"| {k} | {v:.0f} | {ph.share[k] * 100:.1f}% |")
    lines += [
        "",
        "| runs | count | tokens | rows | ms p50 | ms p95 | ms / token | mean context |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in (("prefill", prof.prefill), ("decode", prof.decode)):
        lines.append(
            f"| {name} | {r.runs} | {r.tokens} | {r.rows} | {_f(r.ms.p50)} | {_f(r.ms.p95)} | "
            f"{_f(r.ms_per_token, 2)} | {_f(r.mean_context, 0)} |"
        )
    lines += [
        "",
        "| TTFT hop (per request) | p50 ms | p95 ms | mean ms |",
        "|---|---:|---:|---:|",
    ]
    for name, what in HOPS:
        d = prof.hops_ms[name]
        lines.append(f"| {name}: {what} | {_f(d.p50)} | {_f(d.p95)} | {_f(d.mean)} |")
    d = prof.own_prefill_ms
    lines.append(f"| (own prefill runs, inside `prefill`) | {_f(d.p50)} | {_f(d.p95)} | {_f(d.mean)} |")
    d = prof.ttft_ms
    lines.append(f"| client TTFT (sum of the hops) | {_f(d.p50)} | {_f(d.p95)} | {_f(d.mean)} |")
    d = prof.send_ms
    lines.append(
        f"| (per streamed response: the serving loop inside the stub's send(), per-request means) "
        f"| {_f(d.p50, 2)} | {_f(d.p95, 2)} | {_f(d.mean, 2)} |"
    )
    return "\n".join(lines) + "\n"
