"""llmkiln's gRPC front: the public gRPC endpoint of `kiln serve`, in front of Triton's gRPC on a loopback port.

Why it exists: Triton 2.51's gRPC frontend crashes (SIGSEGV in `ModelStreamInferHandler::Process`, heap
corruption, `GRPC_CALL_ERROR_TOO_MANY_OPERATIONS` assertions) when stream contexts are cancelled while requests are
in flight — a client's `stop_stream(cancel_requests=True)`, or a client closing its channel mid-stream. A 20-line
python model reproduces it (`scripts/triton_probes.py cancel-storm`); upstream fixed such races after 2.51
(triton-inference-server/server #7840 in 2.53, #8078 in 2.57). So Triton must never see a cancelled stream: the
front relays every stream to its own upstream stream, and when the client goes away (cancel or closed channel) it
does not cancel upstream. Instead it sends, on the same upstream stream, a cancel message for each request still in
flight (a request carrying the parameters `llmkiln_cancel` = the request's upstream id and `llmkiln_cancel_key`,
a per-server secret the model checks: llmkiln.serve.handler), half-closes it and reads it to its end, so Triton
sees an ordinary end of stream. The model cancels those requests in the runtime within a step.

Request ids are made unique per server on the way up (`g<stream>-<n>`, so a cancel names exactly one request) and
restored on the way back. Client-sent `llmkiln_cancel*` parameters are dropped. Every other method of
GRPCInferenceService is relayed unchanged as bytes (metadata included, so the restricted admin APIs keep their
key header); a unary call the client abandons is still completed upstream, never cancelled.

It runs a grpc.aio server on its own event loop in a thread of the launcher process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from llmkiln.serve.loop_thread import LoopThread
from llmkiln.serve.response_stream import CANCEL_KEY_ENV, CANCEL_KEY_PARAM, CANCEL_PARAM

SERVICE_NAME = "inference.GRPCInferenceService"
SERVICE = f"/{SERVICE_NAME}/"
STREAM_METHOD = SERVICE + "ModelStreamInfer"
__all__ = ["CANCEL_KEY_ENV", "GrpcFront", "cancel_message"]
CANCEL_SUFFIX = "-cancel"
FINAL_PARAM = "triton_final_response"
SETTLE_S = 2.0  # at stop: how long responses still on their way get to reach their clients
DRAIN_TIMEOUT_S = 300.0  # a stream whose client left is read to its end at most this long, then cancelled
_CANCEL_ALL = object()  # writer command: cancel what is in flight, then half-close
_log = logging.getLogger(__name__)


def _channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def _forwarded_metadata(context: Any) -> list[tuple[str, Any]]:
    md = context.invocation_metadata() or ()
    return [(k, v) for k, v in md if not k.startswith((":", "grpc-")) and k != "user-agent"]


def cancel_message(upstream_id: str, model: str, version: str, key: str) -> bytes:
    """The in-band cancel for one request: the model's required inputs (empty prompt, 1 token) + parameters."""
    req = service_pb2.ModelInferRequest(
        model_name=model, model_version=version, id=upstream_id + CANCEL_SUFFIX
    )
    text = req.inputs.add(name="text_input", datatype="BYTES", shape=[1, 1])
    text.contents.bytes_contents.append(b"")
    n = req.inputs.add(name="max_tokens", datatype="INT32", shape=[1, 1])
    n.contents.int_contents.append(1)
    req.parameters[CANCEL_PARAM].string_param = upstream_id
    req.parameters[CANCEL_KEY_PARAM].string_param = key
    return req.SerializeToString()


class _Relay:
    """One client stream and its upstream stream."""

    def __init__(self, front: GrpcFront, number: int, upstream: Any) -> None:
        self.front = front
        self.prefix = f"g{number}-"
        self.up = upstream
        self.inflight: dict[str, str] = {}  # upstream id -> the client's id
        self.models: dict[str, tuple[str, str]] = {}  # upstream id -> (model, version), for its cancel
        self.to_up: asyncio.Queue[Any] = asyncio.Queue()
        self.to_client: asyncio.Queue[Any] = asyncio.Queue()
        self.client_gone = False
        self.half_closed = False  # the writer took the client's half-close

    async def read_client(self, requests: AsyncIterator[bytes]) -> None:
        n = 0
        async for raw in requests:
            req = service_pb2.ModelInferRequest.FromString(raw)
            for p in (CANCEL_PARAM, CANCEL_KEY_PARAM):
                if p in req.parameters:
                    del req.parameters[p]
            uid = f"{self.prefix}{n}"
            n += 1
            self.inflight[uid] = req.id
            self.models[uid] = (req.model_name, req.model_version)
            req.id = uid
            await self.to_up.put(req.SerializeToString())
        # The client half-closed, or it cancelled or disconnected (the request stream ends first then, and the
        # handler is cancelled a moment later): either way the front half-closes; wind_down() then sends the
        # cancels on a stream of their own.
        await self.to_up.put(None)

    async def write_up(self) -> None:
        """The only task that writes upstream (never cancelled: a cancelled write would cancel the call)."""
        try:
            await self._write_up()
        except Exception as exc:  # the upstream call ended (Triton refused the stream, or went away)
            _log.debug("gRPC front: writing stream %s upstream ended: %s", self.prefix, exc)

    async def _write_up(self) -> None:
        while True:
            item = await self.to_up.get()
            if item is None:
                self.half_closed = True
                await self.up.done_writing()
                return
            if item is _CANCEL_ALL:
                for message in self.cancels():
                    await self.up.write(message)
                await self.up.done_writing()
                return
            await self.up.write(item)

    async def read_up(self) -> None:
        self.front.upstream_streams += 1
        try:
            async for raw in self.up:
                resp = service_pb2.ModelStreamInferResponse.FromString(raw)
                uid = resp.infer_response.id
                if uid.endswith(CANCEL_SUFFIX):
                    continue  # the model's answer to a cancel message
                client_id = self.inflight.get(uid)
                if client_id is None:
                    continue
                params = resp.infer_response.parameters
                if resp.error_message or (FINAL_PARAM in params and params[FINAL_PARAM].bool_param):
                    self.inflight.pop(uid, None)
                    self.models.pop(uid, None)
                if not self.client_gone:
                    resp.infer_response.id = client_id
                    await self.to_client.put(resp.SerializeToString())
            await self.to_client.put(None)
        except grpc.aio.AioRpcError as exc:
            await self.to_client.put(exc)
        finally:
            self.front.upstream_streams -= 1

    def cancels(self) -> list[bytes]:
        out = []
        for uid in list(self.inflight):
            model, version = self.models.get(uid, ("", ""))
            out.append(cancel_message(uid, model, version, self.front.cancel_key))
        return out

    async def wind_down(self, tasks: list[asyncio.Task[None]]) -> None:
        try:
            await asyncio.wait_for(self._wind_down(tasks), DRAIN_TIMEOUT_S)
        except Exception as exc:  # a stuck or failed stream: only now is Triton's call cancelled
            _log.warning("gRPC front: ending stream %s failed (%r); cancelling it", self.prefix, exc)
            self.up.cancel()
        tasks[1].cancel()

    async def _wind_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """The client left: cancel its requests in-band, half-close, read upstream to its end."""
        reader, writer, up_reader = tasks
        _log.debug(
            "gRPC front: client of stream %s gone, %d request(s) in flight", self.prefix, len(self.inflight)
        )
        reader.cancel()
        self.client_gone = True
        if not self.half_closed:
            await self.to_up.put(_CANCEL_ALL)  # after what is queued; the writer may reach a half-close first
        await writer
        if self.half_closed:  # half-closed before the cancels: they go on a stream of their own
            await self.front.send_cancels(self.cancels())
        await up_reader


class GrpcFront(LoopThread):
    """Listens on host:port, relays GRPCInferenceService to `upstream` (Triton's gRPC endpoint)."""

    thread_name = "llmkiln-grpc-front"

    def __init__(self, host: str, port: int, upstream: str, cancel_key: str, max_message_bytes: int) -> None:
        super().__init__()
        self.host, self.port, self.upstream = host, port, upstream
        self.cancel_key = cancel_key
        self.max_message_bytes = max_message_bytes
        self._server: Any = None
        self._channel: Any = None
        self._numbers = itertools.count()
        self._background: set[asyncio.Task[None]] = set()
        self.upstream_streams = 0  # relayed streams Triton still holds open (0 at rest)
        self._relays: set[_Relay] = set()

    async def _serve(self) -> None:
        options = _channel_options(self.max_message_bytes)
        self._channel = grpc.aio.insecure_channel(self.upstream, options=options)
        self._server = grpc.aio.server(options=[*options, ("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers([_routes(self)])
        if self._server.add_insecure_port(f"{self.host}:{self.port}") == 0:
            raise OSError(f"cannot listen on {self.host}:{self.port}")
        await self._server.start()

    async def _cleanup(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()

    async def _settle(self, timeout_s: float) -> None:
        """Wait until every response Triton has sent for a relayed request has reached its client."""
        deadline = time.monotonic() + timeout_s
        while any(r.inflight and not r.client_gone for r in self._relays) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _start_error(self, exc: BaseException) -> BaseException:
        return exc if isinstance(exc, OSError) else OSError(str(exc))

    def stop(self, settle_s: float = SETTLE_S) -> None:
        """Stop listening and close the connection to Triton (idempotent). Responses still on their way (the
        final errors of a drain's last requests) are relayed first, for at most `settle_s`."""
        if self._loop is not None and self._loop.is_running():
            with contextlib.suppress(Exception):  # stopping anyway
                asyncio.run_coroutine_threadsafe(self._settle(settle_s), self._loop).result(settle_s + 1)
        super().stop()

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def send_cancels(self, messages: list[bytes]) -> None:
        """In-band cancels on a short stream of their own (answered at once; ended by a half-close)."""
        if not messages:
            return
        call = self._channel.stream_stream(STREAM_METHOD)()
        for message in messages:
            await call.write(message)
        await call.done_writing()
        async for _ in call:
            pass

    # -- handlers ------------------------------------------------------------------------------------------

    async def unary(self, method: str, request: bytes, context: Any) -> bytes:
        call = self._channel.unary_unary(method)(
            request, metadata=_forwarded_metadata(context), timeout=context.time_remaining()
        )

        async def complete() -> Any:
            try:
                return await call
            except grpc.aio.AioRpcError as exc:
                return exc

        task = asyncio.ensure_future(complete())
        self._keep(task)
        result = await asyncio.shield(task)  # an abandoned call still completes upstream
        if isinstance(result, grpc.aio.AioRpcError):
            await context.abort(result.code(), result.details() or "")
        return bytes(result)

    async def stream(self, requests: AsyncIterator[bytes], context: Any) -> None:
        up = self._channel.stream_stream(STREAM_METHOD)(metadata=_forwarded_metadata(context))
        relay = _Relay(self, next(self._numbers), up)
        self._relays.add(relay)
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(relay.read_client(requests)),
            loop.create_task(relay.write_up()),
            loop.create_task(relay.read_up()),
        ]
        for task in tasks[1:]:
            self._keep(task)
        try:
            while True:
                item = await relay.to_client.get()
                if item is None:
                    return
                if isinstance(item, grpc.aio.AioRpcError):
                    await context.abort(item.code(), item.details() or "")
                await context.write(item)
        except asyncio.CancelledError:  # the client cancelled or closed its channel
            self._keep(loop.create_task(relay.wind_down(tasks)))
            raise
        except Exception:
            if not context.done():
                raise
            self._keep(loop.create_task(relay.wind_down(tasks)))
        finally:
            self._relays.discard(relay)
            if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception() is not None:
                _log.debug("gRPC front: reading a client stream failed: %s", tasks[0].exception())


def _routes(front: GrpcFront) -> Any:
    """Every method of GRPCInferenceService (from tritonclient's descriptor): the stream relayed, the rest as bytes."""
    methods = service_pb2.DESCRIPTOR.services_by_name[SERVICE_NAME.rpartition(".")[2]].methods
    handlers: dict[str, Any] = {}
    for m in methods:
        if SERVICE + m.name == STREAM_METHOD:
            handlers[m.name] = grpc.stream_stream_rpc_method_handler(front.stream)
        else:
            handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                functools.partial(front.unary, SERVICE + m.name)
            )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
