"""Signals from Prometheus metrics: llmkiln's own (serve/metrics.py: llmkiln_* and llmkiln_engine{metric=...},
whose names are runtime.metrics.EngineMetric), Triton's nv_inference_*, and the Dynamo frontend's
dynamo_frontend_* (names as in ai-dynamo-runtime 1.6.1: dynamo/prometheus_names.py, frontend_service)."""

from __future__ import annotations

from llmkiln.diagnose.signals import Figure, Signals
from llmkiln.diagnose.snapshot import Histogram, MetricSnapshot
from llmkiln.runtime.metrics import EngineMetric as M

DYNAMO = "dynamo_frontend_"


def _engine(s: MetricSnapshot, name: M) -> float | None:
    return s.total("llmkiln_engine", metric=str(name))


def _ttft(sig: Signals, h: Histogram, name: str, scale: float) -> None:
    src = f"{name} histogram"
    for attr, q in (("ttft_p50_ms", 0.5), ("ttft_p95_ms", 0.95), ("ttft_p99_ms", 0.99)):
        v = h.quantile(q)
        if v is not None:
            setattr(sig, attr, Figure(v * scale, f"{src} (p{round(q * 100)}, bucket-interpolated)"))
    if h.mean is not None:
        sig.ttft_mean_ms = Figure(h.mean * scale, f"{name}_sum / {name}_count")
    if h.max_bound is not None:
        sig.ttft_max_ms = Figure(h.max_bound * scale, f"{src} (upper bound of the slowest bucket)")
    sig.requests = sig.requests or Figure(h.count, f"{name}_count")


def llmkiln_signals(s: MetricSnapshot) -> Signals:
    sig = Signals()
    h = s.histogram("llmkiln_ttft_ms")
    if h is not None:
        _ttft(sig, h, "llmkiln_ttft_ms", 1.0)
    if (v := _engine(s, M.MEAN_QUEUE_TIME_MS)) is not None:
        sig.queue_ms = Figure(v, 'llmkiln_engine{metric="mean_queue_time_ms"} (mean since start)')
    if (v := _engine(s, M.MEAN_PREFILL_STEP_MS)) is not None:
        sig.prefill_step_ms = Figure(v, 'llmkiln_engine{metric="mean_prefill_step_ms"}')
    if (v := _engine(s, M.MEAN_DECODE_STEP_MS)) is not None:
        sig.decode_step_ms = Figure(v, 'llmkiln_engine{metric="mean_decode_step_ms"}')
    running, free = _engine(s, M.NUM_RUNNING), _engine(s, M.NUM_FREE_SLOTS)
    slots = running + free if running is not None and free is not None else None
    if slots:
        sig.max_batch_size = Figure(slots, "num_running + num_free_slots")
    gen, steps, done, accepted = (
        _engine(s, M.GENERATED_TOKENS),
        _engine(s, M.DECODE_STEPS),
        _engine(s, M.REQUESTS_FINISHED),
        _engine(s, M.SPEC_ACCEPTED_TOKENS),
    )
    if slots and gen is not None and steps:
        # every decode step samples one token per running sequence (plus its accepted drafts); each request's
        # first token comes from its prefill, so (generated - finished - accepted) / decode steps is the mean
        # number of sequences per decode step
        busy = max(0.0, gen - (done or 0.0) - (accepted or 0.0)) / steps
        sig.utilization = Figure(
            min(1.0, busy / slots),
            "(generated_tokens - requests_finished - spec_accepted_tokens) / decode_steps / "
            "(num_running + num_free_slots)",
        )
    drafted = _engine(s, M.SPEC_DRAFTED_TOKENS)
    if drafted:
        sig.set_speculation(
            drafted,
            accepted or 0.0,
            _engine(s, M.SPEC_FREE_DRAFTED_TOKENS) or 0.0,
            _engine(s, M.SPEC_FREE_ACCEPTED_TOKENS) or 0.0,
            "llmkiln_engine metric spec_",
        )
    prompt, hit = s.total("llmkiln_prompt_tokens_total"), s.total("llmkiln_prefix_cache_hit_tokens_total")
    if prompt:
        sig.hit_rate = Figure(
            (hit or 0.0) / prompt, "llmkiln_prefix_cache_hit_tokens_total / llmkiln_prompt_tokens_total"
        )
        if h is not None and h.count:
            sig.prompt_tokens_mean = Figure(
                prompt / h.count, "llmkiln_prompt_tokens_total / llmkiln_ttft_ms_count"
            )
    for attr, name in (
        ("kv_blocks_used", M.KV_BLOCKS_USED),
        ("kv_blocks_total", M.KV_BLOCKS_TOTAL),
        ("kv_blocks_evicted", M.KV_BLOCKS_EVICTED),
        ("queue_length", M.QUEUE_LENGTH),
    ):
        if (v := _engine(s, name)) is not None:
            setattr(sig, attr, Figure(v, f'llmkiln_engine{{metric="{name}"}}'))
    if (v := s.total("llmkiln_requests_rejected_total")) is not None:
        sig.rejected = Figure(v, "llmkiln_requests_rejected_total")
    if (v := s.total("llmkiln_warmup_requests_total")) is not None:
        sig.warmup_requests = Figure(v, "llmkiln_warmup_requests_total")
    return sig


def triton_signals(s: MetricSnapshot) -> Signals:
    """Triton's per-model counters (µs, cumulative). For a decoupled python-backend model its queue is only
    Triton's scheduler queue: the runtime's own queue shows in llmkiln_engine, not here."""
    sig = Signals()
    ok = s.total("nv_inference_request_success")
    if ok:
        sig.requests = Figure(ok, "nv_inference_request_success")
        q = s.total("nv_inference_queue_duration_us")
        if q is not None:
            sig.queue_ms = Figure(
                q / ok / 1000, "nv_inference_queue_duration_us / nv_inference_request_success"
            )
    h = s.histogram("nv_inference_first_response_histogram_ms")
    if h is not None:
        _ttft(sig, h, "nv_inference_first_response_histogram_ms", 1.0)
    if (v := s.total("nv_inference_pending_request_count")) is not None:
        sig.queue_length = Figure(v, "nv_inference_pending_request_count")
    if (v := s.total("nv_inference_request_failure", reason="REJECTED")) is not None:
        sig.rejected = Figure(v, 'nv_inference_request_failure{reason="REJECTED"}')
    return sig


def dynamo_signals(s: MetricSnapshot) -> Signals:
    """The Dynamo frontend's metrics (seconds). It has no queue-time split: scrape the worker too for that."""
    sig = Signals()
    h = s.histogram(f"{DYNAMO}time_to_first_token_seconds")
    if h is not None:
        _ttft(sig, h, f"{DYNAMO}time_to_first_token_seconds", 1000.0)
    cached = s.histogram(f"{DYNAMO}cached_tokens")
    isl = s.histogram(f"{DYNAMO}input_sequence_tokens")
    if isl is not None and isl.count:
        sig.prompt_tokens_mean = Figure(isl.sum / isl.count, f"{DYNAMO}input_sequence_tokens_sum / _count")
        if cached is not None and isl.sum:
            sig.hit_rate = Figure(
                cached.sum / isl.sum, f"{DYNAMO}cached_tokens_sum / {DYNAMO}input_sequence_tokens_sum"
            )
    itl = s.histogram(f"{DYNAMO}inter_token_latency_seconds")
    if itl is not None and (v := itl.quantile(0.95)) is not None:
        sig.itl_p95_ms = Figure(v * 1000, f"{DYNAMO}inter_token_latency_seconds histogram (p95)")
    inflight, seqs = s.total(f"{DYNAMO}inflight_requests"), s.total(f"{DYNAMO}model_max_num_seqs")
    if seqs:
        sig.max_batch_size = Figure(seqs, f"{DYNAMO}model_max_num_seqs")
        if inflight is not None:
            sig.utilization = Figure(
                min(1.0, inflight / seqs),
                f"{DYNAMO}inflight_requests / {DYNAMO}model_max_num_seqs (at scrape time)",
            )
    if (v := s.total(f"{DYNAMO}queued_requests")) is not None:
        sig.queue_length = Figure(v, f"{DYNAMO}queued_requests")
    if (v := s.total(f"{DYNAMO}model_rejection_total")) is not None:
        sig.rejected = Figure(v, f"{DYNAMO}model_rejection_total")
    if (v := s.total(f"{DYNAMO}model_total_kv_blocks")) is not None:
        sig.kv_blocks_total = Figure(v, f"{DYNAMO}model_total_kv_blocks")
    if sig.ttft_mean_ms is not None:
        sig.notes.append(
            "Dynamo's frontend metrics do not split TTFT into queue and prefill: scrape the worker's metrics too "
            "(repeat --metrics) for that"
        )
    return sig


def signals_from_metrics(s: MetricSnapshot) -> Signals:
    """llmkiln's figures first (the runtime sees its own queue), then Triton's, then Dynamo's."""
    return llmkiln_signals(s).merge(triton_signals(s)).merge(dynamo_signals(s))
