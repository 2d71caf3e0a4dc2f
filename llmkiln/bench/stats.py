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
- Prefix hit rate: cached prompt tokens / prompt tokens over the level's successful requests (server-reported
  prompt tokens when the server gives them, e.g. an OpenAI usage; the workload's count otherwise).
- Goodput under an SLO (DistServe, vLLM's benchmark --goodput): requests per second of wall time that met every
  per-request objective (TTFT ≤ slo.ttft_ms, TPOT ≤ slo.tpot_ms; failed requests never do); attainment is their
  share of all requests; the percentile objectives (TTFT p95, TPOT p95 within the same limits) are reported too.
Percentiles use linear interpolation between closest ranks (numpy's default), over successful requests only.
A tail percentile is quoted in summaries only when it rests on enough samples (`quotable`: p95 needs 20, p99
100, i.e. at least one sample beyond it on average); with fewer it is an interpolation between the top few.
"""

from __future__ import annotations

import math
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


def min_samples(percentile: float) -> int:
    """Samples a percentile needs to be quoted: 100 / (100 - p) rounded up (p95: 20, p99: 100), 1 up to the median."""
    if percentile <= 50:
        return 1
    return math.ceil(100 / (100 - percentile) - 1e-9)


def quotable(d: Dist, percentile: int) -> float | None:
    """d's p-th percentile (50, 90, 95 or 99) when it rests on at least `min_samples(p)` samples, else None."""
    value = getattr(d, f"p{percentile}")
    return value if value is not None and d.count >= min_samples(percentile) else None


class GroupStats(BaseModel):
    """TTFT and e2e of one request group (e.g. the short requests of mixed-long-short)."""

    model_config = ConfigDict(extra="forbid")

    num_requests: int
    ttft_ms: Dist
    e2e_ms: Dist


class Slo(BaseModel):
    """Service-level objectives of one request (milliseconds)."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0


class Goodput(BaseModel):
    """How much of a level's traffic met the SLO (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    slo: Slo
    good_requests: int
    goodput_rps: float
    attainment: float  # good requests / all requests
    ttft_p95_met: bool
    tpot_p95_met: bool


def goodput(records: Sequence[RequestRecord], slo: Slo, duration_s: float) -> Goodput:
    """Goodput of one level's records under `slo`."""
    ok = [r for r in records if r.ok]
    good = [
        r
        for r in ok
        if r.ttft_ms is not None
        and r.ttft_ms <= slo.ttft_ms
        and (r.tpot_ms is None or r.tpot_ms <= slo.tpot_ms)
    ]
    ttft, tpot = summarize(r.ttft_ms for r in ok), summarize(r.tpot_ms for r in ok)
    return Goodput(
        slo=slo,
        good_requests=len(good),
        goodput_rps=len(good) / duration_s if duration_s else 0.0,
        attainment=len(good) / len(records) if records else 0.0,
        ttft_p95_met=ttft.p95 is not None and ttft.p95 <= slo.ttft_ms,
        tpot_p95_met=tpot.p95 is None or tpot.p95 <= slo.tpot_ms,
    )


def prefix_hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """Cached prompt tokens / prompt tokens of the successful records; None when the server reports no cache."""
    ok = [r for r in records if r.ok and r.num_cached_tokens is not None]
    prompt = sum(r.server.get("prompt_tokens", r.num_prompt_tokens) for r in ok)
    if not ok or not prompt:
        return None
    return sum(r.num_cached_tokens or 0 for r in ok) / prompt


class SpecStats(BaseModel):
    """Speculative decoding during one level, from the engine's counters (llmkiln.bench.spec_counters)."""

    model_config = ConfigDict(extra="forbid")

    drafted_tokens: int
    accepted_tokens: int
    verifications: int  # decodes that verified at least one draft
    acceptance_rate: float | None  # accepted / drafted (None: nothing drafted)
    mean_accepted_length: float | None  # accepted drafts per verification
    # of drafted / accepted, those drafted where a row was free (a lone padded sequence: no cost whatever the
    # acceptance); 0 from an engine that does not count them
    free_drafted_tokens: int = 0
    free_accepted_tokens: int = 0
    # of the free ones, those drafted from earlier requests' outputs (speculative.history_tokens)
    history_drafted_tokens: int = 0
    history_accepted_tokens: int = 0


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
    prefix_hit_rate: float | None = None  # cached prompt tokens / prompt tokens (None: not reported)
    request_rate: float | None = None  # open loop: Poisson arrivals per second (None: closed loop)
    goodput: Goodput | None = None  # when an SLO was given
    speculative: SpecStats | None = None  # `kiln bench --metrics URL`: the engine's drafted / accepted tokens


def level_stats(
    concurrency: int,
    records: Sequence[RequestRecord],
    slo: Slo | None = None,
    request_rate: float | None = None,
) -> LevelStats:
    """Statistics of one level's records (concurrency: the closed loop's, or the open loop's in-flight bound)."""
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
        prefix_hit_rate=prefix_hit_rate(records),
        request_rate=request_rate,
        goodput=goodput(records, slo, duration) if slo is not None else None,
    )
