"""LLMEngine: ties the scheduler, the prefix block store and the runner together behind a thread-safe submit().

One scheduler thread runs steps: drain submissions and cancels → schedule() → runner.execute() → sample →
update_from_output() → push token events to the handles. `submit` never blocks: it validates the request,
checks the queue bound and hands it to the thread, raising a RequestRejected subclass at once otherwise.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from llmkiln.env_switch import env_switch
from llmkiln.errors import BadInput, KilnError
from llmkiln.recipe import Recipe
from llmkiln.runtime import compute_priority
from llmkiln.runtime import metrics as metrics_mod
from llmkiln.runtime.compute_priority import ComputePriority
from llmkiln.runtime.draft_acceptance import accept_drafts
from llmkiln.runtime.engine_kv import EngineKv
from llmkiln.runtime.handle import RequestHandle, push_events
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.kv_blocks import BlockStore, Reservation
from llmkiln.runtime.plan import BlockCopy, Runner, SchedulerOutput, StepCosts
from llmkiln.runtime.profile import Profiler, StepTrace, now_ns
from llmkiln.runtime.request import (
    BadRequestParams,
    FinishReason,
    QueueFull,
    Request,
    RequestTimings,
    SamplingParams,
    TokenEvent,
)
from llmkiln.runtime.request_check import check_request, prompt_token_ids
from llmkiln.runtime.sampling import make_rng, sample_token
from llmkiln.runtime.scheduler import LONE_DRAFTS_FREE_ENV, Scheduler, SchedulerConfig

if TYPE_CHECKING:
    from tokenizers import Tokenizer


_EMA = 0.25  # weight of the newest step in the step-cost estimates
T = TypeVar("T")


class EngineClosed(KilnError):
    """submit() after shutdown()."""


class EngineFailed(EngineClosed):
    """submit() after the scheduler thread died; the engine is unhealthy for good (start a new one)."""


class EngineStuck(KilnError):
    """shutdown(): the scheduler thread did not end after the stop command (its runner step never returned)."""


STOP_WAIT_S = (
    120.0  # how long shutdown waits for a running step to end and the thread to acknowledge the stop
)


class LLMEngine:
    """The CPU serving runtime. Build it with `from_engine_dir`, `start()` it, `submit()` prompts."""

    def __init__(
        self,
        config: SchedulerConfig,
        runner: Runner,
        tokenizer: Tokenizer | None = None,
        recipe: Recipe | None = None,
        engine_dir: Path | None = None,
    ) -> None:
        slots = config.scheduler.max_batch_size
        if runner.num_slots < slots:
            raise ValueError(f"runner has {runner.num_slots} slots, scheduler wants {slots}")
        if config.speculative is not None and not runner.verifies_drafts:
            raise BadInput(
                f"speculative: {type(runner).__name__} cannot verify drafted tokens (Runner.verifies_drafts); "
                "remove the recipe's speculative section or use backend openvino-cpu"
            )
        lone_drafts_free = config.speculative is not None and runner.expect_drafts(
            config.speculative.max_draft_len
        )
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.recipe = recipe
        self.engine_dir = engine_dir
        self.vocab_size = runner.vocab_size
        kv = config.kv_cache
        # the KV cache manager: a slot runner's prefix store, or every block of a paged runner's KV
        manager = (
            BlockStore(runner.num_blocks, kv.tokens_per_block) if kv.prefix_reuse or runner.paged_kv else None
        )
        self.kv_manager = manager
        self.block_store = manager if kv.prefix_reuse else None
        self.scheduler = Scheduler(config, manager, paged=runner.paged_kv)
        self.scheduler.batch_past_prefills = runner.batches_prefills_with_past
        self.scheduler.mix_decodes = runner.mixes_decodes_with_prefills
        self.scheduler.lone_drafts_free = lone_drafts_free and env_switch(LONE_DRAFTS_FREE_ENV, True)
        # the KV hand-off (runtime.engine_kv): reservations, exports, the routing hint, for host.kv_transfer
        self.kv = EngineKv(self.block_store, runner.block_memory, self.call)
        self.stats = metrics_mod.StepStats()
        self._lock = threading.Condition()
        self._inbox: list[tuple[Request, RequestHandle, Reservation | None]] = []
        self._calls: list[tuple[Callable[[], object], Future[object]]] = []
        self._cancels: list[str] = []
        self._handles: dict[str, RequestHandle] = {}
        self._rngs: dict[str, np.random.Generator] = {}
        self._num_queued = 0  # inbox + scheduler waiting queue
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._stop_ack: threading.Event | None = None
        self._closed = False
        self._runner_closed = False
        self._failure: str | None = None  # why the scheduler thread died (None: healthy)
        self._progress_ns = time.monotonic_ns()  # the last step's end, or when work arrived at an idle engine
        self.profiler: Profiler | None = None
        self.costs = StepCosts()  # running estimates for the TTFT-first scheduler
        # the scheduler thread's CPU priority (runtime.compute_priority), set before start()
        self.compute_priority: ComputePriority = "normal"

    def enable_profile(self, path: str | Path) -> Profiler:
        """Append a step profile to `path` from now on (runtime/profile.py; `kiln profile` reads it)."""
        if self.profiler is None:
            self.profiler = Profiler(path)
        return self.profiler

    # ------------------------------------------------------------------ text
    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequestParams("this engine has no tokenizer: submit token ids")
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            raise BadRequestParams("this engine has no tokenizer")
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LLMEngine:
        """Start the scheduler thread (idempotent)."""
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine was shut down; create a new one")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="llmkiln-scheduler", daemon=True)
                self._thread.start()
        return self

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Let running requests finish for up to timeout_s, then stop: what is left is cancelled.

        Stopping is a command the scheduler thread executes between two steps (cancel what is left, acknowledge,
        exit), so the runner is never closed under a running step: the caller waits for the acknowledgement and
        for the thread to end (a step in progress, e.g. a long prefill, finishes first) before it closes the
        runner. If the thread does not end within STOP_WAIT_S after its step, the runner is left open (the
        process owns it) and EngineStuck is raised. Safe to call twice.
        """
        deadline = time.monotonic() + timeout_s
        thread = self._thread
        while time.monotonic() < deadline and thread is not None and thread.is_alive():
            with self._lock:
                if not self._handles:
                    break
                self._lock.wait(0.005)  # woken by nothing in particular: a short poll of _handles
        ack = threading.Event()
        with self._lock:
            self._closed = True  # no submission gets in after this: the thread cancels a closed set
            self._stop = True
            self._stop_ack = ack
            self._lock.notify_all()
        if thread is not None and thread.is_alive():
            until = time.monotonic() + STOP_WAIT_S
            while not ack.wait(0.05) and thread.is_alive() and time.monotonic() < until:
                pass  # a step in progress ends first; the thread then runs the stop command and acknowledges
            thread.join(max(0.0, until - time.monotonic()))
            if thread.is_alive():
                raise EngineStuck(
                    f"the scheduler thread did not stop within {STOP_WAIT_S:.0f} s of the stop command "
                    "(a runner step that never returns); the runner was left open"
                )
        else:  # never started, or died on an exception: nothing else touches the scheduler now
            self._stop_in_caller()
        self._thread = None
        if not self._runner_closed:
            self._runner_closed = True
            self.runner.close()
        if self.profiler is not None:
            self.profiler.close()

    def _stop_in_caller(self) -> None:
        """The stop command's work (cancel everything left), done by the caller when there is no thread."""
        self._drain()
        for rid in list(self._handles):
            self._cancel_now(rid)
        # a request whose handle is known but which never reached the scheduler (cannot happen after _drain,
        # kept as a guard): finish it too, so no caller waits forever
        with self._lock:
            left = list(self._handles)
        for rid in left:
            self._finish_handle(rid, TokenEvent(None, 0, True, FinishReason.CANCELLED.value))

    @property
    def healthy(self) -> bool:
        """False once the scheduler thread died on an exception (every request then fails at once)."""
        return self._failure is None

    @property
    def failure(self) -> str | None:
        """Why the engine is unhealthy (None while healthy)."""
        return self._failure

    @property
    def stalled_for_s(self) -> float:
        """Seconds without progress while requests are in flight: since the last step ended, or since work
        arrived at an idle engine (0 when nothing is in flight). A liveness signal: a step that never returns,
        or a scheduler thread that cannot run, makes it grow."""
        with self._lock:
            if not self._handles:
                return 0.0
            return max(0.0, (time.monotonic_ns() - self._progress_ns) / 1e9)

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished yet (queued or running)."""
        with self._lock:
            return len(self._handles)

    def __enter__(self) -> LLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ submission
    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
        handoff: KvHandoff | None = None,
    ) -> RequestHandle:
        """Queue a request; raises QueueFull / PromptTooLong / BadRequestParams at once. Never blocks.

        handoff.kv_import: blocks of this prompt filled from another engine (`kv.reserve_import`): the scheduler
        thread publishes them right before it queues the request, so its admission finds them as a cached prefix.
        A submission refused here gives them back.
        handoff.export_prefix: when the request ends normally, the scheduler thread pins the prompt's stored
        blocks right after its last step published them (no extra step): `handle.exported` gives their ids
        (release them with `kv.release_blocks`); [] when it ended otherwise."""
        kv_import = handoff.kv_import if handoff is not None else None
        export_prefix = handoff.export_prefix if handoff is not None else False
        arrival = time.time_ns()
        params = params if params is not None else SamplingParams()
        try:
            prompt_ids = prompt_token_ids(prompt, self.encode, self.vocab_size)
            check_request(self.config, self.vocab_size, prompt_ids, params, priority)
        except Exception:
            with self._lock:
                self.stats.requests_rejected += 1
            if kv_import is not None:
                self.kv.end_import(kv_import, filled=False)
            raise
        try:
            return self._submit(prompt_ids, params, priority, request_id, arrival, kv_import, export_prefix)
        except Exception:
            if kv_import is not None:
                self.kv.end_import(kv_import, filled=False)
            raise

    def _submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int,
        request_id: str | None,
        arrival: int,
        kv_import: Reservation | None,
        export_prefix: bool = False,
    ) -> RequestHandle:
        with self._lock:
            if self._failure is not None:
                raise EngineFailed(f"the engine failed and serves no more requests: {self._failure}")
            if self._closed:
                raise EngineClosed("the engine was shut down; create a new one")
            rid = request_id if request_id is not None else f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
            if not isinstance(rid, str) or not rid:
                self.stats.requests_rejected += 1
                raise BadRequestParams(f"request_id must be a non-empty string, got {rid!r}")
            if rid in self._handles:  # client-chosen ids (e.g. Triton's) may repeat: keep both requests apart
                rid = f"{rid}#{next(self._ids)}"
            limit = self.config.scheduler.max_queue_size
            if self._num_queued >= limit:
                self.stats.requests_rejected += 1
                raise QueueFull(
                    f"queue full: {self._num_queued} requests wait (scheduler.max_queue_size = {limit}); "
                    "retry later or raise the limit in the recipe"
                )
            request = Request(rid, prompt_ids, params, priority, timings=RequestTimings(arrival_ns=arrival))
            handle = RequestHandle(request, self.cancel)
            if not self._handles:
                self._progress_ns = time.monotonic_ns()  # idle until now: the stall clock starts here
            if export_prefix:
                handle.exported = self.kv.open_export(rid)
            self._handles[rid] = handle
            self._rngs[rid] = make_rng(params.seed)
            self._inbox.append((request, handle, kv_import))
            self._num_queued += 1
            self.stats.requests_submitted += 1
            self._lock.notify_all()
        return handle

    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | None = None
    ) -> list[list[int]]:
        """Convenience: submit all, wait for all (starts the thread if needed)."""
        self.start()
        handles = [self.submit(p, params) for p in prompts]
        return [h.result() for h in handles]

    # ------------------------------------------------------------------ scheduler-thread calls
    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run fn on the scheduler thread between two steps (the thread that owns the scheduler and the block
        store); its result or exception arrives in the future. After shutdown or a failure the future holds
        EngineClosed. Keep fn short: every step waits for it."""
        fut: Future[T] = Future()
        with self._lock:
            if self._failure is not None or self._closed:
                fut.set_exception(EngineClosed(f"the engine is not running ({self._failure or 'shut down'})"))
                return fut
            self._calls.append((fn, fut))  # type: ignore[arg-type]
            self._lock.notify_all()
        return fut

    @property
    def runtime_settings(self) -> Mapping[str, str]:
        return self.runner.runtime_settings

    def cancel(self, request_id: str) -> None:
        """Cancel a request: it finishes with reason 'cancelled'; its slot and blocks are freed next step."""
        with self._lock:
            self._cancels.append(request_id)
            self._lock.notify_all()

    # ------------------------------------------------------------------ the scheduler thread
    def _loop(self) -> None:
        try:
            compute_priority.apply_to_this_thread(self.compute_priority)
            self._run_loop()
        except Exception as exc:  # a bug in scheduling: fail everything now rather than leave callers hanging
            self._fail_all(f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                ack = self._stop_ack
            if ack is not None:  # the stop command is done (or the thread died: nothing is left to stop)
                ack.set()

    def _fail_all(self, reason: str) -> None:
        """The scheduler thread is dying: mark the engine unhealthy and fail every unfinished request."""
        with self._lock:
            self._failure = reason
            self._inbox.clear()
            calls, self._calls = self._calls, []
        for _fn, fut in calls:
            fut.set_exception(EngineClosed(f"the engine failed: {reason}"))
        self.kv.drop_all()
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
            self._rngs.clear()
            self._num_queued = 0
            self.stats.requests_failed += len(handles)
        for handle in handles:
            handle._push(TokenEvent(None, len(handle.output_ids), True, FinishReason.ERROR.value), reason)

    def _run_loop(self) -> None:
        while True:
            with self._lock:
                stopping = self._stop
                idle = not self._inbox and not self._cancels and not self._calls
                if not stopping and idle and not self.scheduler.has_work():
                    if self.profiler is not None:
                        self.profiler.flush()  # idle: write the buffered records (the last request's too)
                    self._lock.wait()
                    continue
            if stopping:
                self._stop_in_caller()  # between steps, on this thread: cancel what is left
                return  # _loop acknowledges
            if not self.step():
                wake = self.scheduler.next_wakeup_ns()
                with self._lock:
                    if self._stop or self._inbox or self._cancels or self._calls:
                        continue
                    timeout = None if wake is None else max(0.0, (wake - time.time_ns()) / 1e9)
                    if timeout is None and not self.scheduler.has_work():
                        continue
                    self._lock.wait(timeout if timeout is not None else 0.05)

    def step(self) -> bool:
        """Run one iteration. Returns False when there was nothing to run (tests may call it without a thread)."""
        prof = self.profiler
        t_start = now_ns()
        self._drain()
        now = time.time_ns()
        plan = self.scheduler.schedule(now, self.costs)
        if plan.admitted:
            with self._lock:
                self._num_queued -= len(plan.admitted)
        if plan.is_empty:
            if prof is not None:
                prof.flush()  # idle: a good moment to write the buffered records
            return False
        trace = StepTrace(now) if prof is not None else None
        # Prompt blocks are copied into the store after this step's tokens are out: not on the TTFT path.
        saves, plan.saves = plan.saves, []
        t0 = now_ns()
        try:
            logits = self.runner.execute(plan, trace) if trace is not None else self.runner.execute(plan)
            t_sample = now_ns()
            drafts = {d.request_id: d.draft_ids for d in plan.decodes if d.draft_ids}
            sampled = {
                rid: self._sample(rid, logits[rid], drafts.get(rid, ())) for rid in plan.sampled_request_ids()
            }
        except Exception as exc:  # fail the running requests, keep serving the rest
            plan.saves = saves
            failed = self.scheduler.abandon(plan, time.time_ns())
            with self._lock:
                self.stats.requests_failed += len(failed)
            for request in failed:
                self._finish_handle(
                    request.request_id, TokenEvent(None, len(request.output_ids), True, "error"), repr(exc)
                )
            self._progress_ns = time.monotonic_ns()
            return True
        t_update = now_ns()
        elapsed = t_update - t0
        self.costs = self.costs.learned(plan, elapsed, _EMA)
        emitted = sum(len(t) for t in sampled.values())
        if self.config.speculative is not None and plan.decodes and not plan.prefills:
            drafted = plan.num_tokens - len(plan.decodes)
            self.scheduler.draft_cost.update(len(plan.decodes), drafted, elapsed, emitted)
        events = self.scheduler.update_from_output(plan, sampled, time.time_ns())
        t_emit = now_ns()
        with self._lock:
            self.stats.record_step(plan, elapsed, emitted)
        exports = self.kv.take_exports(events)
        batch: list[tuple[RequestHandle, TokenEvent]] = []
        finished: list[tuple[Request, TokenEvent]] = []
        for request, event in events:
            if event.finished:
                finished.append((request, event))
            else:
                handle = self._handles.get(request.request_id)
                if handle is not None:
                    batch.append((handle, event))
        push_events(batch)  # first: a verification's tokens before the one that ends its request
        for request, event in finished:
            self._finish_handle(request.request_id, event)
        if saves:
            self._save(saves, trace)
        for request, fut in exports:  # after the save: the prompt's last blocks are published now
            fut.set_result(self.kv.pin_prompt(request.prompt_ids))
        if trace is not None and prof is not None:
            t_end = now_ns()
            trace.schedule_ns = t0 - t_start
            trace.sample_ns = t_update - t_sample
            trace.update_ns = t_emit - t_update
            trace.emit_ns = t_end - t_emit
            trace.total_ns = t_end - t_start
            trace.waiting = self.scheduler.num_waiting
            trace.running = self.scheduler.num_running
            prof.step(trace)
        self._progress_ns = time.monotonic_ns()
        return True

    def _save(self, saves: list[BlockCopy], trace: StepTrace | None) -> None:
        """Copy the step's completed prompt blocks into the store and publish them (or drop them if that fails:
        a block is visible to lookups only once written)."""
        t = now_ns()
        try:
            if not self.runner.paged_kv:  # a paged runner wrote them in place: publishing is all
                self.runner.execute(SchedulerOutput(saves=saves))
        except Exception as exc:
            self.scheduler.release_saves(saves, written=False)
            if self.profiler is not None:
                self.profiler.request({"id": "-", "save_error": repr(exc)})
        else:
            self.scheduler.release_saves(saves, written=True)
        if trace is not None:
            trace.saves, trace.save_ns = len(saves), now_ns() - t

    def _sample(self, request_id: str, row: np.ndarray, drafts: tuple[int, ...] = ()) -> list[int]:
        """The request's next token, or for a decode with drafts the verification's tokens (1 to k+1)."""
        p = self.scheduler.requests[request_id].params
        rng = self._rngs.get(request_id)
        if drafts:
            return accept_drafts(row, drafts, p, rng)
        return [sample_token(row, p.temperature, p.top_p, p.top_k, rng)]

    def _drain(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
            calls, self._calls = self._calls, []
        for fn, fut in calls:
            try:
                fut.set_result(fn())
            except Exception as exc:  # the caller's to handle; the scheduler thread goes on
                fut.set_exception(exc)
        for request, _handle, kv_import in inbox:
            if kv_import is not None:  # visible to this request's admission
                self.kv.publish_import(kv_import)
            self.scheduler.add_request(request)
        for rid in cancels:
            self._cancel_now(rid)

    def _cancel_now(self, request_id: str) -> None:
        request = self.scheduler.abort(request_id, time.time_ns())
        if request is None:
            return
        with self._lock:
            if request.timings.first_scheduled_ns is None:
                self._num_queued -= 1
            self.stats.requests_cancelled += 1
        self._finish_handle(
            request_id, TokenEvent(None, len(request.output_ids), True, FinishReason.CANCELLED.value)
        )

    def _finish_handle(self, request_id: str, event: TokenEvent, error: str | None = None) -> None:
        self.kv.drop_export(request_id)  # it did not end normally (the normal end is taken in step())
        with self._lock:
            handle = self._handles.pop(request_id, None)
            self._rngs.pop(request_id, None)
            if event.finish_reason in (FinishReason.STOP.value, FinishReason.LENGTH.value):
                self.stats.requests_finished += 1
        if handle is not None:
            handle._push(event, error)
            if self.profiler is not None:
                t = handle.timings
                self.profiler.request(
                    {
                        "id": request_id,
                        "arrival": t.arrival_ns,
                        "scheduled": t.first_scheduled_ns,
                        "first_token": t.first_token_ns,
                        "finish": t.finish_ns,
                        "prompt": handle.num_prompt_tokens,
                        "cached": handle.num_cached_tokens,
                        "reason": event.finish_reason,
                    }
                )

    # ------------------------------------------------------------------ observability
    def metrics(self) -> dict[str, float]:
        """Prefix-cache, block, queue, step-time and throughput counters (see docs/runtime.md)."""
        with self._lock:
            return metrics_mod.snapshot(self.stats, self.scheduler, self.block_store, self._num_queued)
