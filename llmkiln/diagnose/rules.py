"""The symptom -> likely cause -> next step table. Each row reads its figures from Signals, says whether it
applies ("yes"), does not ("no") or cannot be judged ("no data"), and names the recipe fields to change with
their new values (computed from the current recipe when it is known, else from the schema's defaults)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from llmkiln.capabilities import Backend
from llmkiln.diagnose.signals import Figure, Signals
from llmkiln.recipe import KvCache, Recipe, Scheduler, Warmup
from llmkiln.recipe_trtllm import Speculative

QUEUE_SHARE = 0.3  # queueing is a likely cause once the wait is this share of TTFT
PREFILL_SHARE = 0.3  # ... and prefill (with cache misses) once the rest of TTFT is this share
LOW_HIT_RATE = 0.5
SPIKE_P99_OVER_P50 = 3.0
SPIKE_P95_OVER_P50 = 2.5
COLD_FACTOR = 3.0  # a first request this many times slower than the median is a cold start
LOW_UTILIZATION = 0.5
KV_FULL = 0.9
THROUGHPUT_DROP = 0.1
LOW_ACCEPTANCE = 0.5  # speculative decoding: below this share of accepted drafts verification rarely pays
MIN_DRAFTED = 64  # ... judged once this many tokens were drafted

Status = Literal["yes", "no", "no data"]


@dataclass
class Row:
    """One line of the table, filled."""

    symptom: str
    cause: str
    next_step: str
    status: Status
    figures: list[str] = field(default_factory=list)
    changes: dict[str, Any] = field(default_factory=dict)  # dotted recipe field -> new value


@dataclass(frozen=True)
class Current:
    """The recipe sections the rows read (the schema's defaults when no recipe is known)."""

    scheduler: Scheduler
    kv_cache: KvCache
    warmup: Warmup
    backend: Backend
    speculative: Speculative | None = None

    @classmethod
    def of(cls, recipe: Recipe | None) -> Current:
        if recipe is None:
            return cls(Scheduler(), KvCache(), Warmup(), Backend.ONNX_CPU)
        return cls(recipe.scheduler, recipe.kv_cache, recipe.warmup, recipe.backend, recipe.speculative)


def _f(name: str, fig: Figure | None, unit: str = "ms") -> str:
    if fig is None:
        return f"{name}: -"
    value = f"{fig.value:.0%}" if unit == "%" else f"{fig.value:.1f} {unit}".rstrip()
    return f"{name} = {value}  [{fig.source}]"


def _ttft(sig: Signals) -> Figure | None:
    return sig.ttft_mean_ms or sig.ttft_p50_ms


def queueing(sig: Signals, cur: Current) -> Row:
    row = Row(
        "high TTFT, low utilization",
        "queueing: requests wait before they run (batching policy and timeouts, queue bounds, too few replicas)",
        "scheduler.batching: inflight, lower scheduler.static_batch_timeout_ms; bound scheduler.max_queue_size; "
        "when slots are full, raise scheduler.max_batch_size or add replicas",
        "no data",
    )
    ttft, queue, util = _ttft(sig), sig.queue_ms, sig.utilization
    row.figures = [_f("TTFT", ttft), _f("queue wait", queue), _f("slot utilization", util, "%")]
    if ttft is None or queue is None or ttft.value <= 0:
        return row
    share = queue.value / ttft.value
    row.figures.append(f"queue share of TTFT = {share:.0%}")
    row.status = "yes" if share >= QUEUE_SHARE else "no"
    if row.status == "yes":
        s = cur.scheduler
        if s.batching == "static":
            row.changes["scheduler.batching"] = "inflight"
        if util is not None and util.value >= 1 - LOW_UTILIZATION and s.batching != "static":
            row.changes["scheduler.max_batch_size"] = s.max_batch_size * 2
            row.cause += "; the slots are busy: more slots or replicas"
        if s.max_queue_size > 4 * s.max_batch_size:
            row.changes["scheduler.max_queue_size"] = 4 * s.max_batch_size
    return row


def long_prefill(sig: Signals, cur: Current) -> Row:
    row = Row(
        "high TTFT with long prefill",
        "long prompts or prefix-cache misses",
        "lint the prompts (`kiln lint-prompts`), kv_cache.prefix_reuse: true, put the shared system prompt in "
        "warmup.prefixes; raise kv_cache.max_bytes when blocks are evicted",
        "no data",
    )
    ttft, queue, hit = _ttft(sig), sig.queue_ms, sig.hit_rate
    row.figures = [
        _f("TTFT", ttft),
        _f("queue wait", queue),
        _f("prefill step", sig.prefill_step_ms),
        _f("prompt tokens (mean)", sig.prompt_tokens_mean, ""),
        _f("prefix-cache hit rate", hit, "%"),
        _f("KV blocks evicted", sig.kv_blocks_evicted, ""),
    ]
    if ttft is None or ttft.value <= 0 or (hit is None and cur.kv_cache.prefix_reuse):
        return row
    share = 1 - (queue.value / ttft.value if queue is not None else 0.0)
    row.figures.append(f"prefill share of TTFT = {share:.0%}")
    misses = (hit is not None and hit.value < LOW_HIT_RATE) or not cur.kv_cache.prefix_reuse
    row.status = "yes" if share >= PREFILL_SHARE and misses else "no"
    if row.status == "yes":
        if not cur.kv_cache.prefix_reuse:
            row.changes["kv_cache.prefix_reuse"] = True
        if sig.kv_blocks_evicted is not None and sig.kv_blocks_evicted.value > 0:
            row.changes["kv_cache.max_bytes"] = cur.kv_cache.max_bytes * 2
    return row


def spikes(sig: Signals, cur: Current) -> Row:
    row = Row(
        "p95/p99 TTFT spikes",
        "long prefills block short ones",
        "scheduler.chunked_prefill: true with a smaller scheduler.max_prefill_tokens; separate prefill from "
        "decode (Dynamo disaggregation) when it persists",
        "no data",
    )
    p50, p95, p99 = sig.ttft_p50_ms, sig.ttft_p95_ms, sig.ttft_p99_ms
    row.figures = [_f("TTFT p50", p50), _f("TTFT p95", p95), _f("TTFT p99", p99)]
    if p50 is None or p50.value <= 0 or (p95 is None and p99 is None):
        return row
    r95 = p95.value / p50.value if p95 else 0.0
    r99 = p99.value / p50.value if p99 else 0.0
    row.figures.append(f"p95/p50 = {r95:.1f}, p99/p50 = {r99:.1f}")
    row.status = "yes" if r99 >= SPIKE_P99_OVER_P50 or r95 >= SPIKE_P95_OVER_P50 else "no"
    if row.status == "yes":
        s = cur.scheduler
        if not s.chunked_prefill:
            row.changes["scheduler.chunked_prefill"] = True
        row.changes["scheduler.max_prefill_tokens"] = max(64, s.max_prefill_tokens // 2)
    return row


def kv_crowding(sig: Signals, cur: Current) -> Row:
    row = Row(
        "cache on but throughput down",
        "the KV budget crowds out batch slots (cached prefixes hold memory that running sequences need)",
        "TensorRT-LLM: raise kv_cache.free_gpu_memory_fraction or lower scheduler.max_batch_size; CPU: "
        "lower kv_cache.max_bytes to what the hit set needs",
        "no data",
    )
    used, total, evicted, drop = (
        sig.kv_blocks_used,
        sig.kv_blocks_total,
        sig.kv_blocks_evicted,
        sig.throughput_drop,
    )
    row.figures = [
        _f("KV blocks used", used, ""),
        _f("KV blocks total", total, ""),
        _f("KV blocks evicted", evicted, ""),
        _f("throughput drop at the highest load", drop, "%"),
        _f("prefix-cache hit rate", sig.hit_rate, "%"),
    ]
    cache_on = cur.kv_cache.prefix_reuse and (sig.hit_rate is None or sig.hit_rate.value > 0)
    full = None
    if used is not None and total is not None and total.value > 0:
        full = used.value / total.value >= KV_FULL or (evicted is not None and evicted.value > 0)
    falling = drop.value >= THROUGHPUT_DROP if drop is not None else None
    if full is None and falling is None:
        return row
    row.status = "yes" if cache_on and (full or False) and (falling is not False) else "no"
    if full is None and falling:
        row.status = "yes" if cache_on else "no"
        row.figures.append("(no KV block figures: judged from throughput alone)")
    if row.status == "yes":
        if cur.backend.is_trtllm:
            row.changes["kv_cache.free_gpu_memory_fraction"] = round(
                min(0.95, cur.kv_cache.free_gpu_memory_fraction + 0.05), 2
            )
        else:
            row.changes["kv_cache.max_bytes"] = max(1 << 20, cur.kv_cache.max_bytes // 2)
    return row


def cold_start(sig: Signals, cur: Current) -> Row:
    row = Row(
        "cold-start spikes",
        "no (or unrepresentative) warmup: the first requests pay for graph/session setup and an empty prefix cache",
        "warm the engine with warmup.prompts (warmup.count >= 1) and prime the prefix cache with the shared "
        "system prompt(s) in warmup.prefixes, so the server is READY only when warm",
        "no data",
    )
    first, p50, top, warm = sig.first_ttft_ms, sig.ttft_p50_ms, sig.ttft_max_ms, sig.warmup_requests
    row.figures = [
        _f("first request TTFT", first),
        _f("TTFT p50", p50),
        _f("TTFT max", top),
        _f("warmup requests", warm, ""),
    ]
    median = next((n for n in sig.notes if n.startswith("median TTFT of the rest")), None)
    if first is not None and median is not None:
        rest = float(median.split(": ")[1].split()[0])
        row.figures.append(median)
        row.status = "yes" if rest > 0 and first.value >= COLD_FACTOR * rest else "no"
    elif warm is not None and top is not None and p50 is not None and p50.value > 0:
        row.status = "yes" if warm.value == 0 and top.value >= COLD_FACTOR * 2 * p50.value else "no"
    if row.status == "yes":
        w = cur.warmup
        if not w.prompts and not w.prefixes:  # a count without prompts warms nothing: they are the user's
            row.next_step += " (the recipe has no warmup prompts or prefixes: add your shared system prompt)"
        elif w.count < 1:
            row.changes["warmup.count"] = 1
    return row


def rejections(sig: Signals, cur: Current) -> Row:
    row = Row(
        "requests rejected",
        "the queue bound is too small for the load, or prompts exceed limits.max_input_len",
        "raise scheduler.max_queue_size (or add replicas); check limits.max_input_len against the prompts",
        "no data",
    )
    rej = sig.rejected
    row.figures = [
        _f("rejected", rej, ""),
        _f("requests", sig.requests, ""),
        _f("queue length now", sig.queue_length, ""),
    ]
    if rej is None:
        return row
    row.status = "yes" if rej.value > 0 else "no"
    if row.status == "yes":
        row.changes["scheduler.max_queue_size"] = cur.scheduler.max_queue_size * 2
    return row


def low_acceptance(sig: Signals, cur: Current) -> Row:
    row = Row(
        "speculative drafts mostly rejected",
        "the replies do not repeat their prompts (open chat): each verification runs drafted rows that are thrown "
        "away, a cost with no tokens for it",
        "turn speculation off for this traffic (remove the recipe's speculative section, or send "
        "num_speculative_tokens 0 with such requests), or draft less: a lower speculative.max_draft_len, a longer "
        "speculative.max_matching_ngram_size (fewer, surer matches)",
        "no data",
    )
    drafted, rate, free = sig.spec_drafted, sig.spec_acceptance, sig.spec_free_drafted
    row.figures = [
        _f("drafted tokens (rows that cost)", drafted, ""),
        _f("acceptance", rate, "%"),
        _f("drafted tokens (free rows: a lone padded sequence)", free, ""),
    ]
    if drafted is None or rate is None or drafted.value < MIN_DRAFTED:
        # drafts that rode free cost nothing whatever their acceptance (a lone sequence's runs are padded to
        # 1 + max_draft_len anyway): no finding from them
        if free is not None and free.value >= MIN_DRAFTED:
            row.status = "no"
        return row
    row.status = "yes" if rate.value < LOW_ACCEPTANCE else "no"
    if row.status == "yes" and cur.speculative is not None:
        spec = cur.speculative
        row.changes["speculative.max_draft_len"] = max(1, spec.max_draft_len // 2)
        row.changes["speculative.max_matching_ngram_size"] = spec.max_matching_ngram_size + 1
    return row


RULES: tuple[Callable[[Signals, Current], Row], ...] = (
    queueing,
    long_prefill,
    spikes,
    kv_crowding,
    cold_start,
    rejections,
    low_acceptance,
)


def evaluate(sig: Signals, recipe: Recipe | None) -> list[Row]:
    cur = Current.of(recipe)
    return [rule(sig, cur) for rule in RULES]
