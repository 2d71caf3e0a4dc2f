"""The Dynamo front door: a protocol adapter on the engine host (llmkiln.host), behind Dynamo's frontend.

    python -m llmkiln.dynamo.worker --engine engines/NAME [--threads 1] [--overrides JSON] [--no-kv-events]
                                    [--role aggregated|prefill|decode] [--kv-export-timeout 30]
                                    [--max-local-prefill-tokens 128] [--compute-priority normal|idle] [--no-spin]

The command line is `WorkerOptions` (llmkiln.dynamo.worker_options: written by the launcher and the
deployment, parsed back here). `kiln serve ENGINE --dynamo` starts these (llmkiln.dynamo.launcher) with the environment of its launch
(llmkiln.dynamo.cluster: file discovery, loopback addresses). Life of a worker, driven by Dynamo's Rust
`Worker` (dynamo.common.backend): `from_args` → `start` (the engine host checks the folder against its
manifest, loads it with the worker's intra-op thread cap and runs the recipe's warmup — prefixes, then prompts —
then the registration is returned: context length, KV block size, block count) →
`generate` per request → on SIGTERM: unregister, grace period (the router stops sending here), `cleanup`, which
drains: it ends as soon as `is_quiescent` (nothing in flight) instead of waiting out a fixed budget. The
frontend tokenizes and applies the chat template (from the engine folder's tokenizer_config.json), so
`generate` receives token ids and yields token ids.

Roles (llmkiln.host.roles): `--role prefill` / `decode` register with Dynamo's disaggregation mode prefill /
decode (WorkerConfig.disaggregation_mode; prefill workers in their own component, `prefill`). The frontend sends
a prompt to a KV-routed prefill worker with max_tokens 1; that worker runs it, pins the prompt's blocks and puts
the KV handle of its host (llmkiln.host.kv_transfer: NIXL agent name and metadata, block ids; never KV values)
in its last chunk's `disaggregated_params`. The frontend then sends the request to a decode worker with that
`prefill_result`: it pulls the blocks into its prefix store (NIXL READ; the prefill worker releases them on the
READ's notification), submits the request with them (reported as cached tokens), and decodes. A failed pull
is counted (llmkiln_kv_transfer_fallbacks_total) and the decode worker prefills the prompt itself.
Short prompts skip the prefill tier's engine: when a prompt's uncached part is at most --max-local-prefill-tokens
(KvTransfer.local_handoff), the prefill worker answers at once — no token, no engine call, no KV — with a
"prefill locally" hand-off, and the decode worker prefills the prompt itself (counted apart from fallbacks:
llmkiln_kv_transfer_local_handoffs_total / _local_prefills_total); a decode worker given the same limit caps its
prefill runs to it, so short prompts arriving together do not stall its decodes for a whole 512-token run.

Faults: a request the runtime rejects is an InvalidArgument (the client sees a 4xx); a request that fails in the
runtime ends with an error. When the engine's scheduler thread dies the engine is unhealthy: every request in
flight fails at once, /health on the worker's status port turns unhealthy (health_check_payload canaries fail)
and the worker stops itself, which unregisters it, so the router sends nothing more to it.

This module imports `dynamo`, as do the prefill stand-in and llmkiln.dynamo.registration, which both share;
nothing else in llmkiln imports it (the launcher only starts processes).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import signal
import time
from collections.abc import AsyncGenerator
from typing import Any

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, GenerateChunk, GenerateRequest, LlmRegistration, WorkerConfig
from dynamo.common.backend import LLMEngine as DynamoEngine
from dynamo.common.backend.disagg import enforce_prefill_max_tokens, extract_prefill_result
from dynamo.common.backend.health_check import build_health_check_payload, is_probe
from dynamo.common.backend.publisher import KvEventSource, PushSource
from dynamo.common.backend.run import run
from dynamo.common.constants import DisaggregationMode
from dynamo.llm.exceptions import EngineShutdown, HttpError, InvalidArgument, Unknown

from llmkiln.dynamo.kv_events import KvEventBridge
from llmkiln.dynamo.registration import record_instance, worker_config
from llmkiln.dynamo.worker_options import WorkerOptions
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import KilnError
from llmkiln.host.engine_host import EngineHost
from llmkiln.host.kv_connector import ConnectorPlan
from llmkiln.host.request_life import Refused, RequestLife
from llmkiln.host.roles import WorkerRole
from llmkiln.runtime.engine import EngineClosed
from llmkiln.runtime.profile import ServeStamps
from llmkiln.runtime.protocol import ServingHandle
from llmkiln.runtime.request import FinishReason, QueueFull, RequestRejected, SamplingParams

log = logging.getLogger("llmkiln.dynamo.worker")

DISAGGREGATION_MODES: dict[WorkerRole, DisaggregationMode] = {
    WorkerRole.AGGREGATED: DisaggregationMode.AGGREGATED,
    WorkerRole.PREFILL: DisaggregationMode.PREFILL,
    WorkerRole.DECODE: DisaggregationMode.DECODE,
}
HEALTH_POLL_S = 0.2
DRAIN_POLL_S = 0.05


class KilnWorker(DynamoEngine):
    """Dynamo engine contract over llmkiln's LLMEngine (see the module docstring)."""

    def __init__(self, args: WorkerOptions) -> None:
        self.args = args
        self.folder = resolve_engine(args.engine).require()
        self.host: EngineHost | None = None
        self.bridge = KvEventBridge()
        self._handles: dict[str, ServingHandle] = {}
        self._watch: asyncio.Task[None] | None = None

    def engine_overrides(self) -> dict[str, Any]:
        """The recipe overrides this worker's engine runs with: the command line's, with the role's own
        (HostOptions.engine_overrides: a decode worker's local-prefill cap)."""
        recipe = self.folder.recipe()
        return self.args.host_options(self.args.engine_overrides(recipe.backend)).engine_overrides(recipe)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[KilnWorker, WorkerConfig]:
        args = WorkerOptions.from_argv(argv)
        worker = cls(args)
        recipe = worker.folder.recipe(worker.engine_overrides())
        mode = DISAGGREGATION_MODES[args.role]
        return worker, worker_config(args, worker.folder.path, recipe.serve.model_name, mode)

    async def start(self, worker_id: int) -> EngineConfig:
        """Load and warm the engine; registration (and so the first request) only follows once this returns."""
        record_instance(worker_id)
        if self.folder.hf_config_file() is None:
            raise KilnError(
                f"{self.folder.path}: no config.json; engines built before Dynamo support lack it: rebuild with "
                "`kiln build --force`"
            )
        options = self.args.host_options(self.engine_overrides())
        host = await asyncio.to_thread(EngineHost.open, self.folder, options, log)
        self.host = host
        engine = host.engine
        if engine.block_store is not None and self.args.kv_events:
            engine.block_store.add_listener(self.bridge)  # before the warmup: its prefixes are routable
        if self.args.warmup:
            await asyncio.to_thread(host.warmup)
        self._watch = asyncio.get_running_loop().create_task(self._watch_health())
        recipe = engine.config
        kv = recipe.kv_cache
        log.info(
            "engine %s ready (intra-op threads %s, warmup %.2f s)",
            self.folder.path,
            recipe.scheduler.intra_op_threads or "default",
            host.warmup_result.seconds if host.warmup_result else 0.0,
        )
        return EngineConfig(
            model=str(self.folder.path),
            served_model_name=None,
            llm=LlmRegistration(
                context_length=recipe.limits.max_seq_len,
                kv_cache_block_size=kv.tokens_per_block,
                total_kv_blocks=max(1, engine.block_store.num_blocks if engine.block_store else 1),
                max_num_seqs=recipe.scheduler.max_batch_size,
                max_num_batched_tokens=recipe.scheduler.max_num_tokens,
            ),
        )

    async def _watch_health(self) -> None:
        """When the engine turns unhealthy, stop this worker: it unregisters, so no request is routed here."""
        while self.host is not None and self.host.health().healthy:
            await asyncio.sleep(HEALTH_POLL_S)
        if self.host is not None:
            log.error("engine failed (%s): stopping this worker", self.host.health().reason)
            os.kill(os.getpid(), signal.SIGTERM)

    async def kv_event_sources(self) -> list[KvEventSource]:
        if not self.args.kv_events or self.host is None or self.host.engine.block_store is None:
            return []
        return [PushSource(on_ready=self.bridge.start, dp_rank=0)]

    async def health_check_payload(self) -> dict[str, Any] | None:
        assert self.host is not None
        bos = self.folder.genai_config().bos_token_id
        return build_health_check_payload(bos_token_id=1 if bos is None else bos)

    async def register_prometheus(self, metrics: Any) -> None:
        """The host's metrics (llmkiln.host.metrics: the same names as the Triton model's) on the worker's status
        port /metrics, next to Dynamo's own dynamo_component_* series."""
        metrics.register_prometheus_expfmt_callback(self._exposition)

    def _exposition(self) -> str:
        if self.host is None:
            return ""
        return self.host.exposition({"model": self.folder.path.name, "worker": str(os.getpid())})

    async def is_quiescent(self) -> bool:
        """Nothing queued or running: a drain may end now instead of waiting out its budget."""
        return self.host is None or self.host.is_quiescent

    async def abort(self, context: Context) -> None:
        handle = self._handles.get(context.id())
        if handle is not None:
            handle.cancel()

    async def cleanup(self) -> None:
        """The drain of an aggregated worker: after the grace period (it is unregistered, nothing new comes),
        let the requests in flight finish, ending as soon as `is_quiescent` (at most --drain-timeout), then
        stop the engine (what is still running is cancelled). Safe to call twice and after a failed start."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self.host is not None:
            self.host.begin_drain()
        deadline = time.monotonic() + self.args.drain_timeout_s
        while not await self.is_quiescent() and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        host, self.host = self.host, None
        if host is not None:
            left = host.engine.num_in_flight
            await asyncio.to_thread(host.shutdown, 0.0)
            log.info("engine stopped (%d request(s) cancelled at shutdown)", left)
        self.bridge.close()

    # ------------------------------------------------------------------ requests
    async def generate(
        self, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateChunk, None]:
        host = self.host
        if host is None:
            raise EngineShutdown("the worker is not running")
        try:
            with host.serving() as life:
                async for chunk in self._serve(host, life, request, context):
                    yield chunk
        except Refused as exc:  # draining: the front answers 503 + Retry-After
            raise HttpError(503, str(exc)) from None

    async def _serve(
        self, host: EngineHost, life: RequestLife, request: GenerateRequest, context: Context
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Dynamo's request ↔ the host's request life and KV connector: translation only."""
        received_ns = time.time_ns()  # the step profile's serve record (with $LLMKILN_PROFILE)
        engine = host.engine
        role = self.args.role
        probe = is_probe(request)
        if role is WorkerRole.PREFILL and not probe:
            enforce_prefill_max_tokens(request)
        token_ids = [int(t) for t in request["token_ids"]]
        try:
            params = sampling_params(request, len(token_ids), engine.config.limits.max_seq_len)
        except InvalidArgument:
            life.rejected()
            raise
        rid = context.id()
        received = None
        if role is WorkerRole.DECODE and not probe:
            prefill = extract_prefill_result(request) or {}
            received = prefill.get("disaggregated_params") if isinstance(prefill, dict) else None
        plan = ConnectorPlan() if probe else await host.connector.before(token_ids, received)
        if (
            plan.answer is not None
        ):  # a short prompt: the decode worker prefills it, this engine is not involved
            yield {
                "token_ids": [],
                "index": 0,
                "finish_reason": "length",
                "completion_usage": usage(len(token_ids), 0, 0),
                "disaggregated_params": plan.answer.to_json(),
            }
            return
        try:
            handle = life.submit(token_ids, params, request_id=rid, handoff=plan.handoff)
        except QueueFull as exc:  # overload: 429 (+ Retry-After from the front); the frontend may migrate it
            raise HttpError(429, str(exc)) from None
        except RequestRejected as exc:
            raise InvalidArgument(str(exc)) from None
        except EngineClosed as exc:
            raise EngineShutdown(str(exc)) from None
        self._handles[rid] = handle
        stamps = ServeStamps(received_ns, time.time_ns())
        n_out = 0
        ended = False
        try:
            async for event in handle.aiter():
                stamps.seen()
                if not event.finished:
                    assert event.token_id is not None  # only a final event may carry no token
                    n_out += 1
                    yield {"token_ids": [event.token_id], "index": 0}
                    stamps.sent()
                    continue
                ended = True
                life.ended(handle)
                if event.finish_reason == FinishReason.ERROR.value:
                    failed = EngineShutdown if not engine.healthy else Unknown
                    raise failed(f"llmkiln engine: {handle.error}")
                ids: list[int] = [] if event.token_id is None else [event.token_id]
                n_out += len(ids)
                last: GenerateChunk = {
                    "token_ids": ids,
                    "index": 0,
                    "finish_reason": event.finish_reason or "stop",
                    "completion_usage": usage(len(token_ids), n_out, handle.num_cached_tokens),
                }
                handoff = await host.connector.after(handle, plan)
                if handoff is not None:
                    last["disaggregated_params"] = handoff
                yield last
                return
        finally:
            self._handles.pop(rid, None)
            if not ended:  # closed before its last event (Dynamo's abort: the client left)
                handle.cancel()
                life.cancelled()
            if engine.profiler is not None:
                engine.profiler.serve(stamps.record(rid, n_out))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI usage, with the prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def sampling_params(request: GenerateRequest, prompt_len: int, max_seq_len: int) -> SamplingParams:
    """Dynamo's preprocessed request → SamplingParams (the runtime's validator; InvalidArgument on bad values).

    max_tokens defaults to what is left of the context. The model's end-of-sequence ids arrive as
    stop_token_ids_hidden: the runtime stops on them by itself (its genai_config), so they are ignored here
    unless ignore_eos asks to generate through them.
    """
    so = request.get("sampling_options") or {}
    sc = request.get("stop_conditions") or {}
    max_tokens = sc.get("max_tokens")
    if max_tokens is None:
        max_tokens = max(1, max_seq_len - prompt_len)
    stop = tuple(int(t) for t in (sc.get("stop_token_ids") or ()))
    temperature = so.get("temperature")
    top_p = so.get("top_p")
    top_k = so.get("top_k")
    try:
        return SamplingParams(
            max_tokens=int(max_tokens),
            temperature=0.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            top_k=0 if top_k is None or int(top_k) < 0 else int(top_k),
            seed=so.get("seed"),
            stop_token_ids=stop,
            ignore_eos=bool(sc.get("ignore_eos") or False),
        )
    except RequestRejected as exc:
        raise InvalidArgument(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    # a crash in native code (SIGSEGV, SIGFPE, SIGABRT, SIGBUS) prints every thread's Python stack to the log
    # before the process dies: what it was doing, beside the last line the host logged
    faulthandler.enable(all_threads=True)
    run(KilnWorker, argv)


if __name__ == "__main__":
    main()
