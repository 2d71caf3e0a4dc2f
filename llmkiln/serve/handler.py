"""The serving core behind the Triton python-backend model: one CPU engine, many requests in flight.

model.py stays thin and delegates here. `ServeCore.handle` runs one request on the stub's asyncio loop:
parse -> engine.submit -> stream TokenEvents -> incremental detokenization -> stop strings -> responses
(one per non-empty text delta when streaming; one final response with the whole text otherwise). Every error
reaches the client as a Triton error on a FINAL response, so no request ever hangs.

Warmup: Triton runs the config's model_warmup samples through execute() before the model is READY (user
requests are refused until then), so the first `warmup_requests` requests are the warmup; the core logs how
long they took and publishes it as a metric. A failed warmup request fails the model load.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmkiln.serve.metrics import ServeMetrics
from llmkiln.serve.triton_io import (
    InvalidRequest,
    ParsedRequest,
    PerfFields,
    StopMatcher,
    parse_request,
    response_arrays,
)

CANCEL_CHECK_EVERY = 4  # tokens between request.is_cancelled() checks (each one is an IPC round trip)
ENGINE_METRICS_PERIOD_S = 1.0


def load_plugin(spec: str) -> tuple[Any, Callable[[Path], Any]]:
    """'package.module:attr' or '/path/to/file.py:attr' -> (module, attr).

    An engine plugin module may also define SamplingParams, RequestRejected and make_detokenizer(engine);
    otherwise the CPU runtime's are used.
    """
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise ValueError(f"engine_loader {spec!r}: expected 'module:callable' or '/path/file.py:callable'")
    if mod_name.endswith(".py"):
        s = importlib.util.spec_from_file_location(Path(mod_name).stem, mod_name)
        if s is None or s.loader is None:
            raise ValueError(f"engine_loader {spec!r}: cannot load {mod_name}")
        module = importlib.util.module_from_spec(s)
        sys.modules[s.name] = module  # dataclasses look their module up while the file executes
        s.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    return module, getattr(module, attr)


@dataclass
class EngineKit:
    """A started engine plus the request types that go with it."""

    engine: Any
    sampling_params: Callable[..., Any]
    rejected: tuple[type[BaseException], ...]
    make_detokenizer: Callable[[Any], Any]  # (request handle) -> push/flush detokenizer


def load_engine(
    engine_dir: Path, loader: str | None = None, overrides: dict[str, Any] | None = None
) -> EngineKit:
    """A started engine for `engine_dir`: the CPU runtime (with nested recipe overrides) unless a plugin is named."""
    if loader:
        module, factory = load_plugin(loader)
        engine = factory(engine_dir)
        make = module.make_detokenizer
        kit = EngineKit(engine, module.SamplingParams, (module.RequestRejected,), lambda h: make(engine, h))
    else:
        from llmkiln.runtime.detokenizer import IncrementalDetokenizer  # noqa: PLC0415
        from llmkiln.runtime.engine import LLMEngine  # noqa: PLC0415
        from llmkiln.runtime.request import RequestRejected, SamplingParams  # noqa: PLC0415

        engine = LLMEngine.from_engine_dir(engine_dir, overrides=overrides)

        def detok(handle: Any) -> IncrementalDetokenizer:
            # The prompt is context only: the first generated word keeps its leading space.
            return IncrementalDetokenizer(engine.tokenizer, prompt_ids=handle.prompt_ids)

        kit = EngineKit(engine, SamplingParams, (RequestRejected,), detok)
    engine.start()
    return kit


def _clock() -> str:
    """Local wall-clock time like Triton's log lines (HH:MM:SS.micro)."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"


class _FinalHook:
    """Wraps a response sender: runs `hook(error or None)` once, just before the FINAL response goes out."""

    def __init__(self, inner: Any, final_flag: int, hook: Callable[[str | None], None]) -> None:
        self.inner = inner
        self.final_flag = final_flag
        self.hook: Callable[[str | None], None] | None = hook
        self.failure: str | None = None

    def send(self, response: Any = None, flags: int = 0) -> None:
        if flags & self.final_flag and self.hook is not None:
            hook, self.hook = self.hook, None
            hook(self.failure)
        if response is None:
            self.inner.send(flags=flags)
        else:
            self.inner.send(response, flags=flags)


class ServeCore:
    """Hosts one engine inside the python backend; `pb` is triton_python_backend_utils."""

    def __init__(
        self,
        pb: Any,
        kit: EngineKit,
        *,
        model_name: str = "llmkiln",
        warmup_requests: int = 0,
        exclude_input_default: bool = False,
        tokens_per_block: int = 16,
    ) -> None:
        self.pb = pb
        self.engine = kit.engine
        self.model_name = model_name
        self.exclude_input_default = exclude_input_default
        self.tokens_per_block = max(tokens_per_block, 1)
        self.make_detokenizer = kit.make_detokenizer
        self.sampling_params = kit.sampling_params
        self.rejected_types = kit.rejected
        self.metrics = ServeMetrics(pb, model_name)
        self.warmup_left = warmup_requests
        self.warmup_total = warmup_requests
        self.warmup_finished = 0
        self.warmup_started: float | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_args(cls, args: dict[str, Any], pb: Any) -> ServeCore:
        """Build from the python backend's initialize() args (model_config JSON with our parameters)."""
        cfg = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        engine_dir = Path(params["engine_dir"])
        t0 = time.perf_counter()
        overrides = json.loads(params["engine_overrides"]) if params.get("engine_overrides") else None
        kit = load_engine(engine_dir, params.get("engine_loader") or None, overrides)
        pb.Logger.log_info(f"llmkiln: engine {engine_dir} loaded in {time.perf_counter() - t0:.2f} s")
        return cls(
            pb,
            kit,
            model_name=cfg.get("name", "llmkiln"),
            warmup_requests=int(params.get("warmup_requests", "0") or 0),
            exclude_input_default=params.get("exclude_input_in_output", "false").lower() == "true",
            tokens_per_block=int(params.get("tokens_per_block", "16") or 16),
        )

    # -- execute -------------------------------------------------------------------------------------------

    async def execute(self, requests: list[Any]) -> None:
        if self._refresher is None:
            self._loop = asyncio.get_running_loop()
            self._refresher = self._loop.create_task(self._refresh_engine_metrics())
        await asyncio.gather(*(self.handle(r) for r in requests))

    async def _refresh_engine_metrics(self) -> None:
        while True:
            try:
                self.metrics.observe_engine(self.engine.metrics())
            except Exception as exc:  # noqa: BLE001  (metrics must never break serving)
                self.pb.Logger.log_warn(f"llmkiln: engine metrics failed: {exc}")
                return
            await asyncio.sleep(ENGINE_METRICS_PERIOD_S)

    def _error(self, sender: Any, message: str, unavailable: bool = False) -> None:
        err_cls = self.pb.TritonError
        code = getattr(err_cls, "UNAVAILABLE" if unavailable else "INVALID_ARG", None)
        err = err_cls(message, code) if code is not None else err_cls(message)
        if isinstance(sender, _FinalHook):
            sender.failure = message
        sender.send(self.pb.InferenceResponse(error=err), flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send(self, sender: Any, text: str, final: bool, perf: PerfFields | None = None) -> None:
        tensors = [self.pb.Tensor(name, arr) for name, arr in response_arrays(text, perf).items()]
        flags = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        sender.send(self.pb.InferenceResponse(output_tensors=tensors), flags=flags)

    async def handle(self, request: Any) -> None:
        """Serve one request to completion; never raises."""
        sender = request.get_response_sender()
        if self.warmup_left > 0:
            self.warmup_left -= 1
            if self.warmup_started is None:
                self.warmup_started = time.perf_counter()
            # Account for a warmup request before its FINAL response: Triton may report READY right after it.
            sender = _FinalHook(sender, self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL, self._warmup_done_one)
        try:
            await self._run(request, sender)
        except Exception as exc:  # noqa: BLE001  (anything unexpected still ends the stream)
            self.pb.Logger.log_error(f"llmkiln: request failed: {type(exc).__name__}: {exc}")
            self._error(sender, f"llmkiln: internal error: {type(exc).__name__}: {exc}")

    def _warmup_done_one(self, failure: str | None) -> None:
        self.warmup_finished += 1
        self.metrics.warmup_requests.increment(1)
        if failure is not None:
            self.pb.Logger.log_error(
                f"llmkiln: a warmup request failed, the model stays not ready: {failure}"
            )
        if self.warmup_finished == self.warmup_total and self.warmup_started is not None:
            took = time.perf_counter() - self.warmup_started
            self.metrics.warmup_seconds.set(took)
            # Stamped here (before the last FINAL response) because the stub ships log lines asynchronously.
            self.pb.Logger.log_info(
                f"llmkiln: warmup done: {self.warmup_total} requests in {took:.3f} s (finished at {_clock()})"
            )

    def _get_array(self, request: Any) -> Callable[[str], Any]:
        def get(name: str) -> Any:
            t = self.pb.get_input_tensor_by_name(request, name)
            return None if t is None else t.as_numpy()

        return get

    async def _run(self, request: Any, sender: Any) -> None:
        try:
            req = parse_request(self._get_array(request), self.exclude_input_default)
            params = self.sampling_params(**req.sampling_kwargs())
        except (InvalidRequest, ValueError, TypeError) as exc:
            self.metrics.rejected.increment(1)
            self._error(sender, f"llmkiln: bad request: {exc}")
            return
        try:
            handle = self.engine.submit(
                req.prompt, params, priority=req.priority, request_id=request.request_id() or None
            )
        except self.rejected_types as exc:
            self.metrics.rejected.increment(1)
            queue_full = "queue" in type(exc).__name__.lower() or "queue" in str(exc).lower()
            self._error(sender, f"llmkiln: request rejected: {exc}", unavailable=queue_full)
            return
        await self._stream(request, sender, req, handle)

    async def _stream(self, request: Any, sender: Any, req: ParsedRequest, handle: Any) -> None:
        detok = self.make_detokenizer(handle)
        stops = StopMatcher(req.stop_words)
        pieces: list[str] = []
        n_tokens = 0
        stopped = False
        async for ev in handle.aiter():
            if ev.finish_reason == "error":
                self._error(
                    sender, f"llmkiln: generation failed: {getattr(handle, 'error', None) or 'runtime error'}"
                )
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
            if req.stream and (text or final):
                self._send(sender, text, final=final and not req.return_perf_metrics)
            pieces.append(text)
            if final:
                break
            if n_tokens % CANCEL_CHECK_EVERY == 0 and request.is_cancelled():
                self.pb.Logger.log_verbose(
                    f"llmkiln: request {request.request_id()!r} cancelled by the client"
                )
                handle.cancel()
                sender.send(flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
        if stopped:
            handle.cancel()
        perf = self._perf(handle, n_tokens)
        self._observe(handle)
        if req.stream:
            if req.return_perf_metrics:
                self._send(sender, "", final=True, perf=perf)
            return
        text = "".join(pieces)
        if not req.exclude_input_in_output:
            text = req.prompt + text
        self._send(sender, text, final=True, perf=perf if req.return_perf_metrics else None)

    def _perf(self, handle: Any, n_tokens: int) -> PerfFields:
        t = handle.timings
        cached = int(getattr(handle, "num_cached_tokens", 0) or 0)
        return PerfFields(
            arrival_time_ns=int(t.arrival_ns or 0),
            first_scheduled_time_ns=int(t.first_scheduled_ns or 0),
            first_token_time_ns=int(t.first_token_ns or 0),
            last_token_time_ns=int(t.finish_ns or 0),
            kv_cache_reused_tokens=cached,
            kv_cache_reused_blocks=cached // self.tokens_per_block,
            num_input_tokens=int(getattr(handle, "num_prompt_tokens", 0) or 0),
            num_output_tokens=n_tokens,
        )

    def _observe(self, handle: Any) -> None:
        t = handle.timings
        ttft = (t.first_token_ns - t.arrival_ns) / 1e6 if t.first_token_ns and t.arrival_ns else None
        self.metrics.observe_request(
            int(getattr(handle, "num_prompt_tokens", 0) or 0),
            int(getattr(handle, "num_cached_tokens", 0) or 0),
            ttft,
        )

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._refresher is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._refresher.cancel)
        try:
            self.engine.shutdown(timeout_s)
        finally:
            self.metrics.close()
