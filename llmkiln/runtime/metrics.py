"""Engine counters and the flat `metrics()` dict (names are stable: serve exports them, bench records them)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmkiln.runtime.kv_blocks import BlockStore
    from llmkiln.runtime.plan import SchedulerOutput
    from llmkiln.runtime.scheduler import Scheduler


@dataclass
class StepStats:
    """Counters the scheduler thread updates after every step (read under the engine lock)."""

    started_ns: int = field(default_factory=time.time_ns)
    prefill_steps: int = 0
    prefill_step_ns: int = 0
    decode_steps: int = 0
    decode_step_ns: int = 0
    prompt_tokens_computed: int = 0
    generated_tokens: int = 0
    requests_submitted: int = 0
    requests_rejected: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0

    def record_step(self, plan: SchedulerOutput, elapsed_ns: int, sampled: int) -> None:
        """A step with any prefill chunk counts as a prefill step, otherwise as a decode step."""
        if plan.prefills:
            self.prefill_steps += 1
            self.prefill_step_ns += elapsed_ns
        else:
            self.decode_steps += 1
            self.decode_step_ns += elapsed_ns
        self.prompt_tokens_computed += sum(len(c.token_ids) for c in plan.prefills)
        self.generated_tokens += sampled


class EngineMetric(enum.StrEnum):
    """The names of LLMEngine.metrics() — the one list that serve exports and bench records."""

    QUEUE_LENGTH = "queue_length"  # requests waiting (inbox + scheduler queue)
    NUM_RUNNING = "num_running"  # sequences holding a KV slot
    NUM_FREE_SLOTS = "num_free_slots"
    MEAN_QUEUE_TIME_MS = "mean_queue_time_ms"
    REQUESTS_SUBMITTED = "requests_submitted"
    REQUESTS_REJECTED = "requests_rejected"
    REQUESTS_FINISHED = "requests_finished"  # ended by a stop token or max_tokens
    REQUESTS_CANCELLED = "requests_cancelled"
    REQUESTS_FAILED = "requests_failed"
    PREFILL_STEPS = "prefill_steps"
    MEAN_PREFILL_STEP_MS = "mean_prefill_step_ms"
    DECODE_STEPS = "decode_steps"
    MEAN_DECODE_STEP_MS = "mean_decode_step_ms"
    PROMPT_TOKENS_COMPUTED = "prompt_tokens_computed"
    GENERATED_TOKENS = "generated_tokens"
    TOKENS_PER_S = "tokens_per_s"
    UPTIME_S = "uptime_s"
    PREFIX_CACHE_LOOKUPS = "prefix_cache_lookups"
    PREFIX_CACHE_HITS = "prefix_cache_hits"
    # prompt tokens served without compute: cached blocks, or beyond them the prefix a slot still holds
    PREFIX_CACHE_HIT_TOKENS = "prefix_cache_hit_tokens"
    PREFIX_CACHE_HIT_RATE = "prefix_cache_hit_rate"  # admissions with cached tokens / lookups
    PREFIX_CACHE_TOKEN_HIT_RATE = "prefix_cache_token_hit_rate"  # hit tokens / prompt tokens looked up
    KV_BLOCKS_TOTAL = "kv_blocks_total"
    KV_BLOCKS_USED = "kv_blocks_used"  # blocks holding a cached prefix (pinned or not)
    KV_BLOCKS_FREE = "kv_blocks_free"  # blocks a new prefix may take (empty + unpinned cached)
    KV_BLOCKS_PINNED = "kv_blocks_pinned"  # blocks running sequences use
    KV_BLOCKS_EVICTED = "kv_blocks_evicted"
    # waiting prompts that waited for prefix blocks a running prompt was computing (computed once, then hits)
    INFLIGHT_PREFIX_WAITS = "inflight_prefix_waits"
    # speculative decoding (recipe speculative section): tokens drafted and accepted, decodes that verified drafts
    SPEC_DRAFTED_TOKENS = "spec_drafted_tokens"
    SPEC_ACCEPTED_TOKENS = "spec_accepted_tokens"
    SPEC_VERIFICATIONS = "spec_verifications"
    # of the drafted / accepted tokens, those drafted where a verified row was free (a lone sequence whose runs
    # are padded to 1 + max_draft_len): their acceptance costs nothing either way
    SPEC_FREE_DRAFTED_TOKENS = "spec_free_drafted_tokens"
    SPEC_FREE_ACCEPTED_TOKENS = "spec_free_accepted_tokens"
    # of the free ones, those drafted from earlier requests' outputs (speculative.history_tokens)
    SPEC_HISTORY_DRAFTED_TOKENS = "spec_history_drafted_tokens"
    SPEC_HISTORY_ACCEPTED_TOKENS = "spec_history_accepted_tokens"
    SPEC_ACCEPTANCE_RATE = "spec_acceptance_rate"  # accepted / drafted (0 before any draft)
    SPEC_MEAN_ACCEPTED_LENGTH = "spec_mean_accepted_length"  # accepted drafts per verification


M = EngineMetric


def _ms(total_ns: int, n: int) -> float:
    return total_ns / n / 1e6 if n else 0.0


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def snapshot(
    stats: StepStats, scheduler: Scheduler, store: BlockStore | None, queued: int
) -> dict[str, float]:
    """The flat metrics dict of LLMEngine.metrics(), keyed by EngineMetric."""
    busy_ns = stats.prefill_step_ns + stats.decode_step_ns
    lookups = store.num_lookups if store else 0
    queried = store.num_queried_tokens if store else 0
    m: dict[EngineMetric, float] = {
        M.QUEUE_LENGTH: queued,
        M.NUM_RUNNING: scheduler.num_running,
        M.NUM_FREE_SLOTS: scheduler.num_free_slots,
        M.MEAN_QUEUE_TIME_MS: _ms(scheduler.queue_ns_total, scheduler.num_admitted),
        M.REQUESTS_SUBMITTED: stats.requests_submitted,
        M.REQUESTS_REJECTED: stats.requests_rejected,
        M.REQUESTS_FINISHED: stats.requests_finished,
        M.REQUESTS_CANCELLED: stats.requests_cancelled,
        M.REQUESTS_FAILED: stats.requests_failed,
        M.PREFILL_STEPS: stats.prefill_steps,
        M.MEAN_PREFILL_STEP_MS: _ms(stats.prefill_step_ns, stats.prefill_steps),
        M.DECODE_STEPS: stats.decode_steps,
        M.MEAN_DECODE_STEP_MS: _ms(stats.decode_step_ns, stats.decode_steps),
        M.PROMPT_TOKENS_COMPUTED: stats.prompt_tokens_computed,
        M.GENERATED_TOKENS: stats.generated_tokens,
        M.TOKENS_PER_S: stats.generated_tokens / (busy_ns / 1e9) if busy_ns else 0.0,
        M.UPTIME_S: (time.time_ns() - stats.started_ns) / 1e9,
        M.PREFIX_CACHE_LOOKUPS: lookups,
        M.PREFIX_CACHE_HITS: store.num_hits if store else 0,
        M.PREFIX_CACHE_HIT_TOKENS: store.num_hit_tokens if store else 0,
        M.PREFIX_CACHE_HIT_RATE: (store.num_hits / lookups) if store and lookups else 0.0,
        M.PREFIX_CACHE_TOKEN_HIT_RATE: (store.num_hit_tokens / queried) if store and queried else 0.0,
        M.KV_BLOCKS_TOTAL: store.num_blocks if store else 0,
        M.KV_BLOCKS_USED: store.num_cached if store else 0,
        M.KV_BLOCKS_FREE: store.num_free if store else 0,
        M.KV_BLOCKS_PINNED: store.num_pinned if store else 0,
        M.KV_BLOCKS_EVICTED: store.num_evicted if store else 0,
        M.INFLIGHT_PREFIX_WAITS: scheduler.num_inflight_prefix_waits,
        M.SPEC_DRAFTED_TOKENS: scheduler.num_drafted_tokens,
        M.SPEC_ACCEPTED_TOKENS: scheduler.num_accepted_tokens,
        M.SPEC_VERIFICATIONS: scheduler.num_verifications,
        M.SPEC_FREE_DRAFTED_TOKENS: scheduler.num_free_drafted_tokens,
        M.SPEC_FREE_ACCEPTED_TOKENS: scheduler.num_free_accepted_tokens,
        M.SPEC_HISTORY_DRAFTED_TOKENS: scheduler.num_history_drafted_tokens,
        M.SPEC_HISTORY_ACCEPTED_TOKENS: scheduler.num_history_accepted_tokens,
        M.SPEC_ACCEPTANCE_RATE: _ratio(scheduler.num_accepted_tokens, scheduler.num_drafted_tokens),
        M.SPEC_MEAN_ACCEPTED_LENGTH: _ratio(scheduler.num_accepted_tokens, scheduler.num_verifications),
    }
    return {str(k): float(v) for k, v in m.items()}
