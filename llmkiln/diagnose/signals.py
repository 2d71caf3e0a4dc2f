"""The figures a diagnosis reads, whatever they came from (metrics or a bench report), each with its source."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Figure:
    """One number and where it came from (a metric name and formula, or a report field)."""

    value: float
    source: str


@dataclass
class Signals:
    """Every field is optional: a source fills what it can; a table row needs its own figures or says 'no data'.

    Times in milliseconds. Cumulative metrics are averages since the server started."""

    ttft_mean_ms: Figure | None = None
    ttft_p50_ms: Figure | None = None
    ttft_p95_ms: Figure | None = None
    ttft_p99_ms: Figure | None = None
    ttft_max_ms: Figure | None = None
    first_ttft_ms: Figure | None = None  # the first request's TTFT (cold start), when known
    queue_ms: Figure | None = None  # mean (or median) wait before a request's first scheduling
    prefill_step_ms: Figure | None = None
    decode_step_ms: Figure | None = None
    tpot_p50_ms: Figure | None = None
    itl_p95_ms: Figure | None = None
    utilization: Figure | None = None  # busy sequence slots / slots (0-1)
    max_batch_size: Figure | None = None
    queue_length: Figure | None = None
    hit_rate: Figure | None = None  # prefix-cache hit tokens / prompt tokens
    prompt_tokens_mean: Figure | None = None
    kv_blocks_used: Figure | None = None
    kv_blocks_total: Figure | None = None
    kv_blocks_evicted: Figure | None = None
    requests: Figure | None = None
    rejected: Figure | None = None
    warmup_requests: Figure | None = None
    throughput_drop: Figure | None = None  # 1 - out tok/s at the highest load / best out tok/s (bench)
    # speculative decoding: tokens drafted where a verified row costs something (all drafts but the free ones),
    # and their accepted / drafted (0-1)
    spec_drafted: Figure | None = None
    spec_acceptance: Figure | None = None
    spec_free_drafted: Figure | None = None  # tokens drafted where a row was free (a lone padded sequence)
    notes: list[str] = field(default_factory=list)

    def set_speculation(
        self, drafted: float, accepted: float, free: float, free_accepted: float, source: str
    ) -> None:
        """The speculation figures from the counters (all drafts, accepted, and of those the free ones): drafted
        and acceptance of the drafts whose rows cost something, the free ones apart. `source`: the prefix that, with
        a counter's name (drafted_tokens, ...), says where it was read (a metric family, a bench report's fields)."""
        priced = drafted - free
        self.spec_free_drafted = Figure(free, f"{source}free_drafted_tokens")
        self.spec_drafted = Figure(priced, f"{source}drafted_tokens - {source}free_drafted_tokens")
        if priced > 0:
            self.spec_acceptance = Figure(
                (accepted - free_accepted) / priced,
                f"({source}accepted_tokens - {source}free_accepted_tokens) / ({source}drafted_tokens - "
                f"{source}free_drafted_tokens)",
            )

    def merge(self, other: Signals) -> Signals:
        """self, with other's figures where self has none."""
        out = Signals(notes=[*self.notes, *other.notes])
        for f in fields(self):
            if f.name != "notes":
                setattr(out, f.name, getattr(self, f.name) or getattr(other, f.name))
        return out

    def known(self) -> dict[str, Figure]:
        return {
            f.name: v
            for f in fields(self)
            if f.name != "notes" and isinstance(v := getattr(self, f.name), Figure)
        }
