"""llmkiln's HTTP front: the public HTTP endpoint of `kiln serve`, in front of Triton's HTTP on a loopback port.

Every request is passed to Triton unchanged (health, metadata, KServe infer, the restricted admin APIs with their
key header), except that a generate request's JSON body is checked first (llmkiln.serve.http_checks: types and
wire-type ranges, `stream: true` on /generate) and answered 400 when Triton would mangle it, and a body larger
than the limit gets 413. Retryable answers get their status and a `Retry-After` header: Triton 2.51 maps error
codes to HTTP in `HttpCodeFromError` (src/http_server.cc at v2.51.0: UNAVAILABLE 503, INTERNAL 500, NOT_FOUND 404,
UNSUPPORTED 501, the rest 400), but on the generate endpoints a model's error reaches the client as 400 whatever its
code (measured for every code; `GenerateRequestClass::InferResponseComplete` calls `AddErrorJson(err)`, which
deletes the error, before `HttpCodeFromError(err)`), and a model cannot set response headers. So the front
recognises the model's own messages: "queue full" becomes 429 Too Many Requests, "shutting down" 503, both with
`Retry-After: 1`.

Also:
- a generate request with a `Content-Encoding` other than identity is refused with 415 (aiohttp would have tried
  to inflate it and logged a traceback; the body is read as sent: `auto_decompress=False`); other paths pass it
  to Triton, which inflates gzip/deflate itself;
- a client that goes away is noticed (`handler_cancellation`): its request to Triton is closed. Triton 2.51 does
  not cancel a non-streaming /generate request when its connection closes (measured: 3 of 3 ran to completion),
  only a stream whose next event cannot be written; so a non-streaming /generate is sent to Triton as
  /generate_stream with `stream: true`, and the front joins the events into the one response /generate gives:
  the same fields, `text_output` = the prompt (unless `exclude_input_in_output`) + every piece, and an error
  event answered as the error /generate would have been (400, or 429/503 by its message).
- nothing reaches aiohttp's own 500 handler: an unexpected exception is one log line and a JSON 500.

It runs an aiohttp server on its own event loop in a thread of the launcher process.

Shutdown: the front outlives tritonserver, so an HTTP client never meets a closed port or a reset while the
server stops. `draining()` (the drain began): readiness answers 503, everything else still reaches Triton,
whose model refuses new work with "shutting down" (503). `refuse_all()` (tritonserver is being stopped):
every request is answered 503 + `Retry-After` + `Connection: close` by the front itself, and its pooled
keep-alive connections to Triton are closed (Triton 2.51 would otherwise wait its whole exit timeout for them).
`stop()` closes the port once tritonserver is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

import aiohttp
from aiohttp import web

from llmkiln.serve.http_checks import first, parse_generate_body
from llmkiln.serve.proxy_front import ProxyFront

GENERATE_PATH = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/(generate|generate_stream)$")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
RETRY_AFTER_S = "1"
QUEUE_FULL = b"queue full"  # the runtime's QueueFull message (llmkiln.runtime.engine.submit)
SHUTTING_DOWN = b"the server is shutting down"  # llmkiln.serve.handler.SHUTTING_DOWN
STOPPING_MESSAGE = "llmkiln: the server is shutting down; retry on another replica or after it restarts"
READY_PATH = re.compile(r"^/v2/(?:health/ready|models/[^/]+(?:/versions/[^/]+)?/ready)$")
HEALTH_PATH = re.compile(r"^/v2/(?:health/(?:ready|live)|models/[^/]+(?:/versions/[^/]+)?/ready)$")
# a health probe Triton does not answer within this long is answered 503 here (a stopped or hung tritonserver
# accepts the connection and never replies: the probe would hang as long as the client lets it)
HEALTH_TIMEOUT_S = 2.0
OPEN, DRAINING, REFUSING = "open", "draining", "refusing"
BODY_SLACK = 64 * 1024  # JSON overhead allowed on top of the largest prompt
IDENTITY = ("", "identity")
LOG = logging.getLogger(__name__)


class HttpFront(ProxyFront):
    """Listens on host:port, forwards to http://upstream (Triton's HTTP endpoint)."""

    thread_name = "llmkiln-http-front"

    def __init__(self, host: str, port: int, upstream: str, max_body_bytes: int) -> None:
        super().__init__(host, port, upstream)
        self.max_body_bytes = max_body_bytes + BODY_SLACK
        self.mode = OPEN

    async def _serve(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        await self._listen(app, session, auto_decompress=False, handler_cancellation=True)

    def draining(self) -> None:
        """The drain began: readiness answers 503 (load balancers stop sending); requests still reach Triton."""
        if self.mode == OPEN:
            self.mode = DRAINING

    def refuse_all(self, timeout_s: float = 5.0) -> None:
        """tritonserver is being stopped: answer every request 503 here and close the connections to Triton."""
        self.mode = REFUSING
        loop, session = self._loop, self._session
        if loop is not None and loop.is_running() and session is not None:
            fut = asyncio.run_coroutine_threadsafe(session.close(), loop)
            with contextlib.suppress(Exception):
                fut.result(timeout_s)

    @staticmethod
    def _stopping() -> web.Response:
        return web.json_response(
            {"error": STOPPING_MESSAGE},
            status=503,
            headers={"Retry-After": RETRY_AFTER_S, "Connection": "close"},
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.mode == REFUSING or (self.mode == DRAINING and READY_PATH.match(request.path)):
            return self._stopping()
        try:
            return await self._forward(request)
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client went away: aiohttp closes its side, ours closed Triton's (finding 8)
        except Exception as exc:  # never aiohttp's traceback page; one line in the log
            LOG.error("llmkiln http front: %s %s failed: %s: %s", request.method, request.path,
                      type(exc).__name__, exc)  # fmt: skip
            return web.json_response(
                {"error": f"the HTTP front failed on this request ({type(exc).__name__})"}, status=500
            )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        m = GENERATE_PATH.match(request.path)
        generate = m is not None and request.method == "POST"
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if generate and encoding not in IDENTITY:
            return web.json_response(
                {"error": "the generate endpoints take an uncompressed JSON body (no Content-Encoding)"},
                status=415,
                headers={"Accept-Encoding": "identity"},
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(
                {"error": f"the request body is larger than {self.max_body_bytes} bytes"}, status=413
            )
        except aiohttp.web_protocol.RequestPayloadError as exc:
            return web.json_response({"error": f"the request body could not be read ({exc})"}, status=400)
        data: dict[str, Any] | None = None
        if generate:
            assert m is not None
            data, problem = parse_generate_body(body, streaming=m.group(1) == "generate_stream")
            if problem is not None:
                return web.json_response({"error": problem}, status=400)
        if self.mode == REFUSING:  # tritonserver began stopping while the body was read
            return self._stopping()
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if data is not None and m is not None and m.group(1) == "generate":
            return await self._generate_once(request, data, headers)
        url = f"http://{self.upstream}{request.path_qs}"
        probe = HEALTH_PATH.match(request.path) is not None
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S) if probe else None
        try:
            async with self._session.request(
                request.method, url, headers=headers, data=body, timeout=timeout
            ) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
                if m is not None and m.group(1) == "generate_stream" and up.status == 200:
                    return await self._stream(request, up, out_headers)
                payload = await up.read()
                return web.Response(body=payload, status=self._status(up.status, payload, out_headers),
                                    headers=out_headers)  # fmt: skip
        except (aiohttp.ClientError, RuntimeError) as exc:  # RuntimeError: the session was closed (stopping)
            return self._unreachable(exc)
        except TimeoutError:  # only health probes have a timeout
            return web.json_response(
                {
                    "error": f"the inference server did not answer its health probe within {HEALTH_TIMEOUT_S:.0f} s"
                },
                status=503,
                headers={"Retry-After": RETRY_AFTER_S},
            )

    @staticmethod
    def _unreachable(exc: Exception) -> web.Response:
        return web.json_response(
            {"error": f"the inference server is not reachable ({type(exc).__name__})"},
            status=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )

    async def _generate_once(
        self, request: web.Request, data: dict[str, Any], headers: dict[str, str]
    ) -> web.Response:
        """/generate through Triton's /generate_stream (see the module text): a client that disconnects closes
        the stream, Triton cancels the request at its next event, the model frees its slot."""
        path = request.path[: -len("generate")] + "generate_stream"
        url = f"http://{self.upstream}{path}{'?' + request.query_string if request.query_string else ''}"
        body = json.dumps({**data, "stream": True}, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {k: v for k, v in headers.items() if k.lower() not in ("content-type", "accept")}
        headers["Content-Type"] = "application/json"
        assert self._session is not None
        try:
            async with self._session.request("POST", url, headers=headers, data=body) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
                if "text/event-stream" not in up.headers.get("Content-Type", ""):
                    payload = await up.read()  # Triton's own answer (unknown model, not ready, ...)
                    return web.Response(body=payload, status=self._status(up.status, payload, out_headers),
                                        headers=out_headers)  # fmt: skip
                events = [
                    json.loads(line[5:])
                    for line in (await up.read()).split(b"\n")
                    if line.startswith(b"data:")
                ]
        except (aiohttp.ClientError, RuntimeError) as exc:  # RuntimeError: the session was closed (stopping)
            return self._unreachable(exc)
        out_headers = {"Content-Type": "application/json"}
        error = next((e["error"] for e in events if isinstance(e, dict) and "error" in e), None)
        if error is not None or not events:
            payload = json.dumps(
                {"error": error or "the model sent no response"}, ensure_ascii=False, separators=(",", ":")
            ).encode()
            status = up.status if up.status != 200 else 400  # what /generate answers for a model error
            return web.Response(
                body=payload, status=self._status(status, payload, out_headers), headers=out_headers
            )
        prefix = (
            ""
            if first(data.get("exclude_input_in_output")) is True
            else str(first(data.get("text_input", "")))
        )
        merged = dict(events[-1])
        merged["text_output"] = prefix + "".join(str(e.get("text_output", "")) for e in events)
        return web.Response(
            body=json.dumps(merged, ensure_ascii=False, separators=(",", ":")).encode(),
            status=200,
            headers=out_headers,
        )

    @staticmethod
    def _status(status: int, payload: bytes, headers: dict[str, Any]) -> int:
        """Retryable model errors get their real status: measured on Triton 2.51, the generate endpoints answer
        every model error with 400 whatever its code (InferResponseComplete reads the code after AddErrorJson
        has deleted the error), so the model's own messages are recognised here."""
        if status in (400, 503) and QUEUE_FULL in payload:
            headers["Retry-After"] = RETRY_AFTER_S
            return 429
        if status in (400, 503) and SHUTTING_DOWN in payload:
            headers["Retry-After"] = RETRY_AFTER_S
            return 503
        return status

    async def _stream(
        self, request: web.Request, up: aiohttp.ClientResponse, headers: dict[str, Any]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=up.status, headers=headers)
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)  # a gone client raises here: the stream to Triton is closed with it
        await resp.write_eof()
        return resp
