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

Also (issue 21, findings 7 and 8):
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
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from typing import Any

import aiohttp
from aiohttp import web

from llmkiln.serve.http_checks import first, parse_generate_body

GENERATE_PATH = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/(generate|generate_stream)$")
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
RETRY_AFTER_S = "1"
QUEUE_FULL = b"queue full"  # the runtime's QueueFull message (llmkiln.runtime.engine.submit)
SHUTTING_DOWN = b"the server is shutting down"  # llmkiln.serve.handler.SHUTTING_DOWN
BODY_SLACK = 64 * 1024  # JSON overhead allowed on top of the largest prompt
IDENTITY = ("", "identity")
LOG = logging.getLogger(__name__)


class HttpFront:
    """Listens on host:port, forwards to http://upstream (Triton's HTTP endpoint)."""

    def __init__(self, host: str, port: int, upstream: str, max_body_bytes: int) -> None:
        self.host, self.port, self.upstream = host, port, upstream
        self.max_body_bytes = max_body_bytes + BODY_SLACK
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        """Bind and serve in a background thread; raises the bind error (e.g. the port is taken)."""
        self._thread = threading.Thread(target=self._run, name="llmkiln-http-front", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(self._cleanup())
        loop.close()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, auto_decompress=False, handler_cancellation=True
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def stop(self) -> None:
        """Stop listening and close the connections to Triton (idempotent)."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
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
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if data is not None and m is not None and m.group(1) == "generate":
            return await self._generate_once(request, data, headers)
        url = f"http://{self.upstream}{request.path_qs}"
        try:
            async with self._session.request(request.method, url, headers=headers, data=body) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
                if m is not None and m.group(1) == "generate_stream" and up.status == 200:
                    return await self._stream(request, up, out_headers)
                payload = await up.read()
                return web.Response(body=payload, status=self._status(up.status, payload, out_headers),
                                    headers=out_headers)  # fmt: skip
        except aiohttp.ClientError as exc:
            return self._unreachable(exc)

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
        except aiohttp.ClientError as exc:
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
