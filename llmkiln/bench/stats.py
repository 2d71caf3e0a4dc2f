"""Per-request records and their statistics: TTFT, TPOT, ITL and end-to-end latency percentiles, throughput.

Definitions (all times from the client's clock, milliseconds in reports):
- TTFT: first streamed token received − request sent.
- TPOT (time per output token): (last token − first token) / (output tokens − 1), one value per request with at
  least two output tokens.
- ITL (inter-token latency): every gap between consecutive tokens of a request, pooled over requests.
- e2e: final response − request sent.
- server TTFT / queue: from the server's perf fields (first token − arrival, first scheduled − arrival), when the
  server returns them: the engine's share of TTFT without client and transport time.
- Throughput: completed requests and output tokens per second of the level's wall time (first send → last end).
Percentiles use linear interpolation between closest ranks (numpy's default), over successful requests only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


@dataclass
class RequestRecord:
    """What the client saw for one request (times are time.perf_counter_ns() of the client process)."""

    index: int
    group: str
    send_ns: int
    token_ns: list[int] = field(default_factory=list)  # arrival of each streamed token
    send_wall_ns: int = 0  # time.time_ns() at send (to line up with server-side stamps in a profile)
    end_ns: int | None = None
    num_prompt_tokens: int = 0  # content tokens as the workload counted them
    num_output_tokens: int = 0
    num_cached_tokens: int | None = None  # server-reported reused KV tokens, when the server returns them
    server: dict[str, int] = field(default_factory=dict)  # other server perf fields (ns timestamps, counts)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end_ns is not None and bool(self.token_ns)

    @property
    def ttft_ms(self) -> float | None:
        return (self.token_ns[0] - self.send_ns) / 1e6 if self.token_ns else None

    @property
    def e2e_ms(self) -> float | None:
        return (self.end_ns - self.send_ns) / 1e6 if self.end_ns is not None else None

    @property
    def tpot_ms(self) -> float | None:
        if len(self.token_ns) < 2 or self.num_output_tokens < 2:
            return None
        return (self.token_ns[-1] - self.token_ns[0]) / 1e6 / (self.num_output_tokens - 1)

    @property
    def server_ttft_ms(self) -> float | None:
        """First token − arrival, both from the server's perf fields (no client or transport time)."""
        a, f = self.server.get("arrival_time_ns"), self.server.get("first_token_time_ns")
        return (f - a) / 1e6 if a and f and f >= a else None

    @property
    def server_queue_ms(self) -> float | None:
        """First scheduled − arrival on the server (time spent waiting for a slot / batch)."""
        a, q = self.server.get("arrival_time_ns"), self.server.get("first_scheduled_time_ns")
        return (q - a) / 1e6 if a and q and q >= a else None

    def itl_ms(self) -> list[float]:
        return [(b - a) / 1e6 for a, b in zip(self.token_ns, self.token_ns[1:], strict=False)]


class Dist(BaseModel):
    """Summary of one distribution (milliseconds); None fields mean there were no samples."""

    model_config = ConfigDict(extra="forbid")

    count: int
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


def summarize(values: Iterable[float | None]) -> Dist:
    """Count, mean, min, max and p50/p90/p95/p99 of the non-None values."""
    xs = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if xs.size == 0:
        return Dist(count=0)
    pct = np.percentile(xs, PERCENTILES)
    return Dist(
        count=int(xs.size),
        mean=float(xs.mean()),
        min=float(xs.min()),
        max=float(xs.max()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)},
    )


class GroupStats(BaseModel):
    """TTFT and e2e of one request group (e.g. the short requests of mixed-long-short)."""

    model_config = ConfigDict(extra="forbid")

    num_requests: int
    ttft_ms: Dist
    e2e_ms: Dist


class LevelStats(BaseModel):
    """Everything measured at one concurrency level."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int
    num_requests: int
    num_ok: int
    num_errors: int
    errors: list[str]  # up to five distinct messages
    duration_s: float
    request_throughput: float  # completed requests per second
    output_token_throughput: float  # output tokens per second
    ttft_ms: Dist
    tpot_ms: Dist
    itl_ms: Dist
    e2e_ms: Dist
    server_ttft_ms: Dist = Field(default_factory=lambda: Dist(count=0))  # from the server's perf fields
    server_queue_ms: Dist = Field(default_factory=lambda: Dist(count=0))
    prompt_tokens_mean: float | None
    output_tokens_mean: float | None
    cached_tokens_mean: float | None  # None when the server does not report it
    groups: dict[str, GroupStats]


def level_stats(concurrency: int, records: Sequence[RequestRecord]) -> LevelStats:
    """Statistics of one concurrency level's records."""
    ok = [r for r in records if r.ok]
    errors = [r.error or "no tokens received" for r in records if not r.ok]
    distinct: list[str] = []
    for e in errors:
        if e not in distinct and len(distinct) < 5:
            distinct.append(e)
    if records:
        start = min(r.send_ns for r in records)
        end = max((r.end_ns or r.send_ns) for r in records)
        duration = max((end - start) / 1e9, 1e-9)
    else:
        duration = 0.0
    out_tokens = sum(r.num_output_tokens for r in ok)
    cached = [r.num_cached_tokens for r in ok if r.num_cached_tokens is not None]
    groups = {}
    for g in sorted({r.group for r in records}):
        rs = [r for r in ok if r.group == g]
        groups[g] = GroupStats(
            num_requests=sum(1 for r in records if r.group == g),
            ttft_ms=summarize(r.ttft_ms for r in rs),
            e2e_ms=summarize(r.e2e_ms for r in rs),
        )
    return LevelStats(
        concurrency=concurrency,
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=len(errors),
        errors=distinct,
        duration_s=duration,
        request_throughput=len(ok) / duration if duration else 0.0,
        output_token_throughput=out_tokens / duration if duration else 0.0,
        ttft_ms=summarize(r.ttft_ms for r in ok),
        tpot_ms=summarize(r.tpot_ms for r in ok),
        itl_ms=summarize(x for r in ok for x in r.itl_ms()),
        e2e_ms=summarize(r.e2e_ms for r in ok),
        server_ttft_ms=summarize(r.server_ttft_ms for r in ok),
        server_queue_ms=summarize(r.server_queue_ms for r in ok),
        prompt_tokens_mean=float(np.mean([r.num_prompt_tokens for r in ok])) if ok else None,
        output_tokens_mean=float(np.mean([r.num_output_tokens for r in ok])) if ok else None,
        cached_tokens_mean=float(np.mean(cached)) if cached else None,
        groups=groups,
    )
