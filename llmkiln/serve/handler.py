"""The Triton front door: a protocol adapter on the engine host (llmkiln.host), many requests in flight.

model.py stays thin and delegates here. `ServeCore.from_args` opens the engine host (check the engine folder,
load, start) and runs the recipe's warmup inside initialize(), so the model is READY only once it is warm.
`ServeCore.handle` runs one request on the stub's asyncio loop: parse -> engine.submit -> stream TokenEvents ->
incremental detokenization -> stop strings -> responses (one per non-empty text delta when streaming; one final
response with the whole text otherwise). Every error reaches the client as a Triton error on a FINAL response,
so no request ever hangs.

Size limits (recipe `serve.max_prompt_bytes`, `max_stop_words`, `max_stop_word_bytes`) are checked on the raw
tensors before any decoding, and the prompt is tokenized in a worker thread (tokenizers' encode_batch releases the
GIL), so one huge request never stalls the event loop the other requests stream on.

Draining (graceful shutdown): `kiln serve` writes the `drain_file` named in config.pbtxt before it stops
tritonserver. From then on the host refuses new requests (UNAVAILABLE at once); requests in flight finish, and
those still running at the deadline written in the file end with a final error. `llmkiln_requests_active`
reaches 0 and the launcher stops tritonserver with nothing in flight.

Metrics: the host's (llmkiln.host.metrics), published through pb_utils every second (llmkiln.serve.metrics).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmkiln.host.engine_host import SHUTTING_DOWN, EngineHost
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_connector import ConnectorPlan
from llmkiln.host.request_life import Refused, RequestLife
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import Warmup
from llmkiln.runtime.detokenizer import IncrementalDetokenizer
from llmkiln.runtime.profile import ServeStamps
from llmkiln.runtime.protocol import ServingHandle
from llmkiln.runtime.request import FinishReason, QueueFull, RequestRejected, SamplingParams
from llmkiln.serve.heartbeat import Heartbeat
from llmkiln.serve.http_checks import prompt_byte_bound
from llmkiln.serve.metrics import TritonMetrics
from llmkiln.serve.repository import role_options
from llmkiln.serve.response_stream import CancelBook, InvalidCancel, ResponseStream, cancel_target
from llmkiln.serve.triton_io import (
    InvalidRequest,
    ParsedRequest,
    PerfFields,
    RequestLimits,
    StopMatcher,
    parse_request,
    response_arrays,
)
from llmkiln.serve.triton_pb import ResponseSender, TritonPb, TritonRequest

CANCEL_CHECK_EVERY = 4  # tokens between request.is_cancelled() checks (each one is an IPC round trip)
ENGINE_METRICS_PERIOD_S = 1.0
DRAIN_POLL_S = 0.05
# Triton 2.51's python stub schedules an async execute() on its event loop, then adds a done-callback and records
# the future in a set; a future already done by then (a request refused at once: draining, too long) runs that
# callback first, which cannot remove what is not recorded yet: "Cannot remove future from background; KeyError"
# in the log (6 in 434 refusals of a drain under load), and the finished future kept for good. An execute() that
# finished sooner than this after it started sleeps the rest, so the stub's thread records it first; the
# responses are sent already, nobody waits for it (a decoupled model's execute() runs in the background: the stub
# takes the next requests meanwhile). tests/serve/test_reliability.py: 960 refusals into a drain on the OpenVINO
# engine logged the KeyError in 1 of 3 runs without the floor, 0 of 4 with 20 ms; 50 ms leaves a loaded machine room.
EXECUTE_FLOOR_S = 0.05


@dataclass(frozen=True)
class ServeSettings:
    """The model's parameters from config.pbtxt (written by llmkiln.serve.repository)."""

    model_name: str
    engine_dir: Path
    warmup: Warmup | None = None  # None: the engine recipe's warmup section
    exclude_input_in_output: bool = False
    drain_file: Path | None = None
    heartbeat_file: Path | None = None  # written every second for the launcher's liveness check
    limits: RequestLimits = RequestLimits()
    # how the engine host opens: recipe overrides (parameter engine_overrides), the role and its KV transfer
    # options (parameters role, kv_transfer)
    host: HostOptions = HostOptions()

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> ServeSettings:
        """From the python backend's initialize() args (model_config JSON with our parameters)."""
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        overrides = params.get("engine_overrides")
        drain = params.get("drain_file")
        beat = params.get("heartbeat_file")
        warmup = params.get("warmup")
        host = role_options(params)
        return cls(
            model_name=cfg.get("name", "llmkiln"),
            engine_dir=Path(params["engine_dir"]),
            warmup=Warmup.model_validate_json(warmup) if warmup else None,
            exclude_input_in_output=params.get("exclude_input_in_output", "false").lower() == "true",
            drain_file=Path(drain) if drain else None,
            heartbeat_file=Path(beat) if beat else None,
            host=dataclasses.replace(host, overrides=json.loads(overrides) if overrides else None),
        )


class StubLog:
    """The host's log lines through the stub's logger (they appear in tritonserver's log)."""

    def __init__(self, pb: TritonPb) -> None:
        self.logger = pb.Logger

    def info(self, msg: str) -> None:
        self.logger.log_info(msg)

    def warning(self, msg: str) -> None:
        self.logger.log_warn(msg)

    def error(self, msg: str) -> None:
        self.logger.log_error(msg)


class ServeCore:
    """Hosts one started engine inside the python backend; `pb` is triton_python_backend_utils."""

    def __init__(self, pb: TritonPb, host: EngineHost, settings: ServeSettings) -> None:
        self.pb = pb
        self.host = host
        self.engine = host.engine
        self.settings = settings
        self.model_name = settings.model_name
        self.exclude_input_default = settings.exclude_input_in_output
        self.tokens_per_block = self.engine.config.kv_cache.tokens_per_block
        self.metrics = host.metrics
        self.published = TritonMetrics(pb, settings.model_name)
        self.published.publish_info(host.metrics)
        recipe = self.engine.recipe
        if recipe is not None and settings.limits == RequestLimits():
            serve = recipe.serve
            self.limits = RequestLimits(
                serve.max_prompt_bytes, serve.max_stop_words, serve.max_stop_word_bytes
            )
        else:
            self.limits = settings.limits
        self.drain_file = settings.drain_file
        self.by_id: dict[str, ServingHandle] = {}  # running requests by request id (in-band cancels)
        self.early_cancels = CancelBook()
        self.max_prompt_bytes_for_tokens = self._prompt_byte_bound()
        self._refresher: asyncio.Task[None] | None = None
        self._drain_watch: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.heartbeat: Heartbeat | None = None

    @classmethod
    def from_args(cls, args: dict[str, Any], pb: TritonPb) -> ServeCore:
        """initialize() of the python-backend model: open the engine host, warm it; READY follows."""
        settings = ServeSettings.from_args(args)
        host = EngineHost.open(settings.engine_dir, settings.host, log=StubLog(pb))
        core = cls(pb, host, settings)
        core.warm()
        return core

    def warm(self) -> None:
        """The warmup (the repository's, else the recipe's), before initialize() returns; raises if it fails."""
        try:
            self.host.warmup(self.settings.warmup)
        except Exception:
            self.host.shutdown(0.0)
            raise
        finally:
            self.published.publish(self.host.refresh_metrics())
        if self.settings.heartbeat_file is not None:
            engine = self.engine
            self.heartbeat = Heartbeat(
                self.settings.heartbeat_file,
                lambda: self._loop,
                lambda: self.host.num_active,
                lambda: engine.stalled_for_s,
            ).start()

    # -- execute -------------------------------------------------------------------------------------------

    async def execute(self, requests: list[TritonRequest]) -> None:
        if self._refresher is None:
            self._loop = asyncio.get_running_loop()
            self._refresher = self._loop.create_task(self._refresh_engine_metrics())
            if self.drain_file is not None:
                self._drain_watch = self._loop.create_task(self._watch_drain(self.drain_file))
        started = time.monotonic()
        await asyncio.gather(*(self.handle(r) for r in requests))
        left = EXECUTE_FLOOR_S - (time.monotonic() - started)
        if left > 0:
            await asyncio.sleep(left)

    async def _watch_drain(self, drain_file: Path) -> None:
        """Poll the drain file: once it exists refuse new requests; past its deadline end the running ones."""
        deadline: float | None = None
        while True:
            if deadline is None and os.path.exists(drain_file):
                self.host.begin_drain()
                try:
                    deadline = float(drain_file.read_text().strip() or "0")
                except (OSError, ValueError):
                    deadline = 0.0
            if deadline is not None and time.time() >= deadline and not self.host.ending:
                self.host.end_overdue()  # their streams see CANCELLED and send the final error
            await asyncio.sleep(DRAIN_POLL_S)

    async def _refresh_engine_metrics(self) -> None:
        while True:
            try:
                self.published.publish(self.host.refresh_metrics())
            except Exception as exc:  # metrics must never break serving
                self.pb.Logger.log_warn(f"llmkiln: engine metrics failed: {exc}")
                return
            await asyncio.sleep(ENGINE_METRICS_PERIOD_S)

    def _prompt_byte_bound(self) -> int | None:
        """UTF-8 bytes beyond which a prompt surely exceeds limits.max_input_len tokens (None: no tokenizer)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            return None
        return prompt_byte_bound(tokenizer.get_vocab(), self.engine.config.limits.max_input_len)

    async def _encode(self, prompt: str) -> list[int] | str:
        """Token ids of the prompt, computed in a worker thread (encode_batch releases the GIL; plain encode
        does not); the text itself when the engine has no tokenizer (submit then refuses it)."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            return prompt
        encoded = await asyncio.to_thread(tokenizer.encode_batch, [prompt], add_special_tokens=True)
        return list(encoded[0].ids)

    def _error(self, sender: ResponseSender, message: str, unavailable: bool = False) -> None:
        err_cls = self.pb.TritonError
        code = getattr(err_cls, "UNAVAILABLE" if unavailable else "INVALID_ARG", None)
        err = err_cls(message, code) if code is not None else err_cls(message)
        sender.send(self.pb.InferenceResponse(error=err), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send(
        self,
        sender: ResponseSender,
        text: str,
        final: bool,
        perf: PerfFields | None = None,
        handoff: Mapping[str, object] | None = None,
    ) -> None:
        arrays = response_arrays(text, perf, handoff)
        tensors = [self.pb.Tensor(name, arr) for name, arr in arrays.items()]
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(self.pb.InferenceResponse(output_tensors=tensors), flags=flags)

    async def handle(self, request: TritonRequest) -> None:
        """Serve one request to completion; never raises."""
        received_ns = time.time_ns()
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = ResponseStream(request.get_response_sender(), final)  # one FINAL response, nothing after it
        try:
            target = cancel_target(request)
        except InvalidCancel as exc:
            self.metrics.add("rejected")
            self._error(sender, str(exc))
            return
        if target is not None:  # the gRPC front's in-band cancel (llmkiln.serve.grpc_front)
            self._cancel(target)
            sender.finish()
            return
        if self.drain_file is not None and not self.host.draining and os.path.exists(self.drain_file):
            self.host.begin_drain()
        try:
            with self.host.serving() as life:  # active from here (host.request_life)
                # at once, not at the next refresh: the drain stops tritonserver when this gauge reads 0
                self.published.publish(self.metrics)
                try:
                    await self._run(request, sender, received_ns, life)
                except Exception as exc:  # anything unexpected still ends the stream
                    life.failed()
                    self.pb.Logger.log_error(f"llmkiln: request failed: {type(exc).__name__}: {exc}")
                    self._error(sender, f"llmkiln: internal error: {type(exc).__name__}")
                finally:
                    sender.finish()  # every exit path ends the request with exactly one final response
                    if sender.dropped:
                        self.pb.Logger.log_warn(
                            f"llmkiln: {sender.dropped} response(s) after the final one dropped "
                            f"(request {request.request_id()!r})"
                        )
        except Refused as exc:
            self._error(sender, str(exc), unavailable=True)
            return
        self.published.publish(self.metrics)  # counters and TTFT at once; engine gauges every second

    def _cancel(self, request_id: str) -> None:
        """An in-band cancel: cancel the running request, or remember it for when it is submitted."""
        handle = self.by_id.get(request_id)
        if handle is None:
            self.early_cancels.add(request_id)
            return
        handle.cancel()
        self.metrics.add("cancelled")

    def _get_array(self, request: TritonRequest) -> Callable[[str], np.ndarray | None]:
        def get(name: str) -> np.ndarray | None:
            t = self.pb.get_input_tensor_by_name(request, name)
            return None if t is None else t.as_numpy()

        return get

    async def _run(
        self, request: TritonRequest, sender: ResponseSender, received_ns: int, life: RequestLife
    ) -> None:
        try:
            req = parse_request(self._get_array(request), self.exclude_input_default, self.limits)
            params = SamplingParams(**req.sampling_kwargs())
        except (InvalidRequest, RequestRejected) as exc:
            life.rejected()
            self._error(sender, f"llmkiln: bad request: {exc}")
            return
        bound = self.max_prompt_bytes_for_tokens
        if bound is not None and len(req.prompt) > bound:  # characters <= bytes: a cheap first look
            n_bytes = len(req.prompt.encode("utf-8"))
            if n_bytes > bound:
                life.rejected()
                self._error(
                    sender,
                    f"llmkiln: request rejected: the prompt ({n_bytes} bytes) is far longer than "
                    f"limits.max_input_len ({self.engine.config.limits.max_input_len} tokens): shorten the prompt",
                )
                return
        role = self.host.role
        if req.disaggregated_params is not None and role is not WorkerRole.DECODE:
            life.rejected()
            self._error(
                sender,
                f"llmkiln: bad request: input 'disaggregated_params' is the hand-off a decode-role model takes; "
                f"this model is {role.value} (send it to the decode model, or leave it out)",
            )
            return
        if (
            role is WorkerRole.PREFILL
        ):  # the prompt to its first token, and the hand-off (Dynamo's prefill rule)
            params = dataclasses.replace(params, max_tokens=1)
        submit_ns = time.time_ns()
        try:
            prompt = await self._encode(req.prompt)
            plan = ConnectorPlan()
            if isinstance(prompt, list):
                plan = await self.host.connector.before(prompt, _received(req.disaggregated_params))
            if (
                plan.answer is not None
            ):  # a short prompt: the decode model prefills it, this engine is not used
                text = "" if req.exclude_input_in_output else req.prompt
                self._send(sender, text, final=True, handoff=plan.answer.to_json())
                return
            handle = life.submit(
                prompt,
                params,
                priority=req.priority,
                request_id=request.request_id() or None,
                handoff=plan.handoff,
            )
        except RequestRejected as exc:  # counted by life.submit (a tokenizer refusal: here)
            life.rejected()
            self._error(sender, f"llmkiln: request rejected: {exc}", unavailable=isinstance(exc, QueueFull))
            return
        request_id = request.request_id()
        if request_id:
            self.by_id[request_id] = handle
            if self.early_cancels.take(request_id):  # its cancel came while it was being tokenized
                handle.cancel()
                life.cancelled()
        try:
            await self._stream(request, sender, req, handle, life, plan, ServeStamps(received_ns, submit_ns))
        finally:
            if request_id and self.by_id.get(request_id) is handle:
                del self.by_id[request_id]

    async def _stream(
        self,
        request: TritonRequest,
        sender: ResponseSender,
        req: ParsedRequest,
        handle: ServingHandle,
        life: RequestLife,
        plan: ConnectorPlan,
        stamps: ServeStamps,
    ) -> None:
        # The prompt is context only: the first generated word keeps its leading space.
        detok = IncrementalDetokenizer(self.engine, prompt_ids=handle.prompt_ids)
        stops = StopMatcher(req.stop_words)
        pieces: list[str] = []
        n_tokens = 0
        stopped = recorded = False
        handoff: Mapping[str, object] | None = None
        async for ev in handle.aiter():
            stamps.seen()
            if ev.finish_reason == FinishReason.ERROR:
                life.failed()
                self._error(sender, f"llmkiln: generation failed: {handle.error or 'runtime error'}")
                return
            if ev.finish_reason == FinishReason.CANCELLED and self.host.ending:
                life.failed()
                self._error(
                    sender, f"{SHUTTING_DOWN} (the request did not finish within the exit timeout)", True
                )
                return
            if ev.finish_reason == FinishReason.CANCELLED:  # an in-band cancel: the client has gone
                sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            delta = ""
            if ev.token_id is not None:
                n_tokens += 1
                delta = detok.push(ev.token_id)
            if ev.finished:
                delta += detok.flush()
            text, stopped = stops.feed(delta)
            if ev.finished and not stopped:
                text += stops.finish()
            final = ev.finished or stopped
            if (
                ev.finished and not stopped
            ):  # ended normally: the prefill role's hand-off for the decode model
                handoff = await self.host.connector.after(handle, plan)
            if req.stream and (text or final):
                stamps.sent()
                if final and not req.return_perf_metrics:
                    # before the final response: once the client has it, the server may be stopped
                    self._profile(handle, stamps, n_tokens)
                    recorded = True
                t_send = time.perf_counter_ns()
                last = final and not req.return_perf_metrics
                self._send(sender, text, final=last, handoff=handoff if last else None)
                stamps.send(time.perf_counter_ns() - t_send)
            pieces.append(text)
            if final:
                break
            if n_tokens % CANCEL_CHECK_EVERY == 0 and request.is_cancelled():
                self.pb.Logger.log_verbose(
                    f"llmkiln: request {request.request_id()!r} cancelled by the client"
                )
                handle.cancel()
                life.cancelled()
                sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
        if stopped:
            handle.cancel()
        perf = self._perf(handle, n_tokens)
        life.completed(handle)
        if not recorded:
            self._profile(handle, stamps, n_tokens)
        if req.stream:
            if req.return_perf_metrics:
                self._send(sender, "", final=True, perf=perf, handoff=handoff)
            return
        text = "".join(pieces)
        if not req.exclude_input_in_output:
            text = req.prompt + text
        self._send(sender, text, final=True, perf=perf if req.return_perf_metrics else None, handoff=handoff)

    def _profile(self, handle: ServingHandle, stamps: ServeStamps, n_tokens: int) -> None:
        """The request's serve record for the step profile (written before its final response is sent)."""
        if self.engine.profiler is not None:
            self.engine.profiler.serve(stamps.record(handle.request_id, n_tokens))

    def _perf(self, handle: ServingHandle, n_tokens: int) -> PerfFields:
        t = handle.timings
        cached = handle.num_cached_tokens
        return PerfFields(
            arrival_time_ns=int(t.arrival_ns or 0),
            first_scheduled_time_ns=int(t.first_scheduled_ns or 0),
            first_token_time_ns=int(t.first_token_ns or 0),
            last_token_time_ns=int(t.finish_ns or 0),
            kv_cache_reused_tokens=cached,
            kv_cache_reused_blocks=cached // self.tokens_per_block,
            num_input_tokens=handle.num_prompt_tokens,
            num_output_tokens=n_tokens,
        )

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._loop is not None and not self._loop.is_closed():
            for task in (self._refresher, self._drain_watch):
                if task is not None:
                    self._loop.call_soon_threadsafe(task.cancel)
        try:
            self.host.shutdown(timeout_s)
        finally:
            self.published.close()


def _received(text: str | None) -> object:
    """A decode-role request's hand-off: the prefill model's `disaggregated_params` JSON, parsed (None: none). Text
    that is not JSON goes on as it is: the connector counts it as a fallback and prefills the prompt here."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
