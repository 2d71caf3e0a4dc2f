"""Engine counters and the flat `metrics()` dict (names are stable: serve exports them, bench records them)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmkiln.runtime.kv_blocks import BlockStore
    from llmkiln.runtime.scheduler import Scheduler, SchedulerOutput


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


def _ms(total_ns: int, n: int) -> float:
    return total_ns / n / 1e6 if n else 0.0


def snapshot(
    stats: StepStats, scheduler: Scheduler, store: BlockStore | None, queued: int
) -> dict[str, float]:
    """The flat metrics dict of LLMEngine.metrics()."""
    busy_ns = stats.prefill_step_ns + stats.decode_step_ns
    m: dict[str, float] = {
        "queue_length": float(queued),
        "num_waiting": float(queued),
        "num_running": float(scheduler.num_running),
        "num_free_slots": float(scheduler.num_free_slots),
        "mean_queue_time_ms": _ms(scheduler.queue_ns_total, scheduler.num_admitted),
        "requests_submitted": float(stats.requests_submitted),
        "requests_rejected": float(stats.requests_rejected),
        "requests_finished": float(stats.requests_finished),
        "requests_cancelled": float(stats.requests_cancelled),
        "requests_failed": float(stats.requests_failed),
        "prefill_steps": float(stats.prefill_steps),
        "mean_prefill_step_ms": _ms(stats.prefill_step_ns, stats.prefill_steps),
        "decode_steps": float(stats.decode_steps),
        "mean_decode_step_ms": _ms(stats.decode_step_ns, stats.decode_steps),
        "prompt_tokens_computed": float(stats.prompt_tokens_computed),
        "generated_tokens": float(stats.generated_tokens),
        "tokens_per_s": stats.generated_tokens / (busy_ns / 1e9) if busy_ns else 0.0,
        "uptime_s": (time.time_ns() - stats.started_ns) / 1e9,
    }
    lookups = store.num_lookups if store else 0
    queried = store.num_queried_tokens if store else 0
    m.update(
        {
            "prefix_cache_lookups": float(lookups),
            "prefix_cache_hits": float(store.num_hits if store else 0),
            "prefix_cache_hit_tokens": float(store.num_hit_tokens if store else 0),
            "prefix_cache_hit_rate": (store.num_hits / lookups) if store and lookups else 0.0,
            "prefix_cache_token_hit_rate": (store.num_hit_tokens / queried) if store and queried else 0.0,
            "kv_blocks_total": float(store.num_blocks if store else 0),
            "kv_blocks_used": float(store.num_cached if store else 0),
            "kv_blocks_free": float(store.num_free if store else 0),
            "kv_blocks_pinned": float(store.num_pinned if store else 0),
            "kv_blocks_evicted": float(store.num_evicted if store else 0),
        }
    )
    return m
