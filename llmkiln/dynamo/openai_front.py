"""llmkiln's OpenAI front: the public HTTP endpoint of `kiln serve --dynamo`, in front of Dynamo's frontend on a
loopback port of its own.

Every request passes to Dynamo's frontend unchanged, except:
- overload and shutdown get their HTTP status and `Retry-After`, streaming or not. Dynamo 1.6.1's frontend
  answers a worker's rejection (`HttpError(429)`, raised by the worker when its queue is full) with 429 but no
  Retry-After, and inside a streamed response — whose `200` it has sent before the worker answered — as an
  error event (`data: {"error": {..., "code": 429}}`); its own busy check answers 529. The front reads a stream's
  first event before it answers: an error event that comes before any token becomes the response's status (429
  for 429/529, 503 for 503) with `Retry-After: 1`; anything else is relayed as it arrives (the first event is
  the first token, so TTFT does not move).
- while the launch drains (SIGTERM), new requests get 503 + `Retry-After` at once; streams in flight go on.
- a client that disconnects cancels its request upstream, streaming or not.
- a generation that fails upstream (500) before the client got anything is sent again for up to RETRY_FAILED_S
  after that first failure (a dead worker's requests, until the launcher took it out of discovery); then the
  upstream's answer stands.
  While every worker serving the launch's model (`models`) is gone — the only decode worker of a prefill/decode
  launch killed, or the only worker of an aggregated one — the frontend forgets the model and answers 404 "model
  not found"; for the launch's own model that is a 503 + Retry-After (its workers are being restarted), sent
  again the same way.
  In a prefill/decode launch the frontend's own "no worker" 503 (NO_WORKER_MESSAGE) is sent again the same way
  (the launcher covers a missing prefill tier within a second), and while the launcher hands a tier over
  (`hold_unavailable`: the prefill stand-in arriving or leaving) every 503 and 500 is, until that hold ends: the
  gap costs those requests a little time, not an error.
- only the OpenAI API and the probes are public (`PUBLIC`: /v1/completions, /v1/chat/completions, /v1/models,
  /health, /live, /metrics); Dynamo's frontend also serves a writable `/busy_threshold`, `/docs` and
  `/openapi.json`, which get 404 here.
- a request body is checked before it goes on (400 naming the field): strict UTF-8 JSON, no lone surrogate
  (Dynamo's frontend answered `"\ud800"` with 500), no Content-Encoding (415: send it uncompressed); fields the
  engine does not serve are refused, not ignored: `n` or `best_of` above 1, `logprobs` / `top_logprobs`.
- a `/v1/completions` prompt given as text is tokenized here — in a worker thread, never on the event loop, and
  only if it can fit limits.max_input_len (`max_prompt_bytes`; a larger one is a 400 at once) — with the engine's
  tokenizer, special tokens included (BOS), and forwarded as token ids: Dynamo 1.6.1's frontend tokenizes completion text without special
  tokens, so the same prompt would reach the engine without the BOS that `kiln serve` (Triton), transformers and
  vLLM give it — other tokens, other output, another prefix-cache key. Token-id prompts and chat requests (whose
  template writes the BOS) pass unchanged.
Measured cost of the hop: docs/serve.md ("The OpenAI front").

It runs an aiohttp server on its own event loop in a thread of the launcher process.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from llmkiln.serve.http_checks import parse_json_object
from llmkiln.serve.proxy_front import ProxyFront

if TYPE_CHECKING:
    from tokenizers import Tokenizer

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
RETRY_AFTER_S = "1"
FIRST_EVENT_MAX_BYTES = 1 << 20
OVERLOADED = {429: 429, 529: 429, 503: 503}  # upstream status (or error event code) -> the client's status
SHUTTING_DOWN = "llmkiln: the server is shutting down; retry on another replica or after it restarts"
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# A generation that failed upstream (500) before the client got anything is sent again for up to this long: a worker
# that died (its requests answered 500 until the launcher took it out of discovery, within a supervision period)
# must not cost a client its request; after that the upstream's answer stands (503 + Retry-After while a tier has
# no worker, the 500 itself for any other failure).
RETRY_FAILED_S = 3.0
RETRY_PAUSE_S = 0.25
# Dynamo 1.6.1's frontend's message when no worker of a tier can take a request (a worker's own 503s, such as
# llmkiln's queue-full rejections, say why)
NO_WORKER_MESSAGE = "Service temporarily unavailable"
PUBLIC = {
    COMPLETIONS: "POST",
    CHAT: "POST",
    "/v1/models": "GET",
    "/health": "GET",
    "/live": "GET",
    "/metrics": "GET",
}
BODY_FIELDS = (
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "stream",
)


def _error(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}},
        status=status,
        headers={"Retry-After": RETRY_AFTER_S},
    )


def _wants_stream(body: bytes) -> bool:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and data.get("stream") is True


def unserved_field(path: str, data: dict[str, Any]) -> str | None:
    """What the engine does not serve in this body (a 400's message), or None. One choice per request, no
    log-probabilities: refused rather than silently answered without."""
    for name in ("n", "best_of"):
        value = data.get(name)
        if value is not None and value != 1:
            return (
                f"llmkiln: field '{name}' must be 1 (each request gets one choice); send separate requests for "
                "more choices"
            )
    if path == CHAT:
        if data.get("logprobs") not in (None, False) or data.get("top_logprobs") is not None:
            return "llmkiln: fields 'logprobs' / 'top_logprobs' are not served by this engine; remove them"
    elif data.get("logprobs") is not None:
        return "llmkiln: field 'logprobs' is not served by this engine; remove it"
    return None


def completion_text(data: dict[str, Any]) -> list[str] | None:
    """The text prompt(s) of a /v1/completions body to tokenize here (None: token ids, or not ours to judge)."""
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return None


def with_token_ids(data: dict[str, Any], ids: list[list[int]]) -> bytes:
    """The body with its text prompt(s) replaced by their token ids (a string prompt by one list)."""
    data = dict(data)
    data["prompt"] = ids[0] if isinstance(data.get("prompt"), str) else ids
    return json.dumps(data).encode()


def _error_event(event: bytes, codes: Collection[int] = tuple(OVERLOADED)) -> tuple[int, str] | None:
    """(code, message) when an SSE event is Dynamo's error event with one of `codes` (default: overload or
    shutdown)."""
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            data = json.loads(line[5:].strip())
        except (ValueError, UnicodeDecodeError):
            return None
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), int) and err["code"] in codes:
            return int(err["code"]), str(err.get("message") or "")
        return None
    return None


def _message(payload: bytes) -> str | None:
    """The error message of an upstream JSON error body ({"error": {"message"}} or {"message"}), or None."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    inner = data.get("error", data) if isinstance(data, dict) else {}
    return str(inner["message"]) if isinstance(inner, dict) and inner.get("message") else None


def _model(body: bytes) -> str | None:
    """The request body's "model" (a checked JSON object by now), or None."""
    try:
        model = json.loads(body).get("model")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return model if isinstance(model, str) else None


@dataclass(frozen=True)
class _Failed:
    """An upstream failure nothing of which reached the client yet (`response`: what to answer if it persists)."""

    response: web.Response


class OpenAIFront(ProxyFront):
    """Listens on host:port, forwards to http://upstream (Dynamo's frontend)."""

    thread_name = "llmkiln-openai-front"

    def __init__(
        self,
        host: str,
        port: int,
        upstream: str,
        tokenizer: Tokenizer | None = None,
        max_prompt_bytes: int | None = None,
        retry_no_worker: bool = False,
        models: Collection[str] = (),
    ) -> None:
        super().__init__(host, port, upstream)
        self.tokenizer = tokenizer  # the engine's: completion text prompts become token ids with BOS
        self.max_prompt_bytes = max_prompt_bytes  # a text prompt above it cannot fit limits.max_input_len
        self.draining = False
        self._hold_until = 0.0  # time.monotonic() until which an upstream 503 is retried (hold_unavailable)
        # prefill/decode launches: a tier without workers is covered within a second (the prefill stand-in), so the
        # frontend's "no worker" 503 is retried like a failed generation
        self.retry_no_worker = retry_no_worker
        # the launch's served model names: an upstream 404 for one of them means its workers are restarting
        self.models = frozenset(models)

    def hold_unavailable(self, seconds: float) -> None:
        """For the next `seconds`, retry requests the upstream answers 503 (a tier is coming back) instead of
        passing the 503 on. Thread-safe (one float)."""
        self._hold_until = time.monotonic() + seconds

    @property
    def holding(self) -> bool:
        return time.monotonic() < self._hold_until

    def _retried(self, response: web.Response, message: str | None) -> web.Response | _Failed:
        """An upstream 503: sent again while holding, or when it is the frontend's own "no worker" answer and
        this launch covers a missing tier; otherwise passed on."""
        if self.holding or (self.retry_no_worker and message == NO_WORKER_MESSAGE):
            return _Failed(response)
        return response

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # One connection per request: on a reused loopback connection Dynamo's first SSE event waited ~40 ms
        # (Nagle on its side against delayed ACKs on ours; measured: TTFT +40 ms through the front, +0.5 ms
        # with fresh connections — docs/serve.md, "The OpenAI front").
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        # handler_cancellation: a client that leaves cancels its handler, which closes the upstream request, so
        # Dynamo's frontend drops it and the worker cancels it (aiohttp leaves non-streaming handlers running by
        # default: 30 of 30 abandoned 480-token requests ran to the end)
        await self._listen(app, session, handler_cancellation=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if PUBLIC.get(path) != request.method:
            if path in PUBLIC:
                return _error(405, f"llmkiln: {path} takes {PUBLIC[path]}", "invalid_request_error")
            served = ", ".join(sorted(PUBLIC))
            return _error(404, f"llmkiln: no such endpoint {path}; served: {served}", "invalid_request_error")
        if self.draining and (request.method == "POST" or path == "/health"):
            return _error(503, SHUTTING_DOWN, "unavailable")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            return _error(
                415,
                "llmkiln: send the request body uncompressed (no Content-Encoding)",
                "invalid_request_error",
            )
        body = await request.read()
        if request.method == "POST":
            checked = await self._checked_body(path, body)
            if isinstance(checked, web.Response):
                return checked
            body = checked
        # RETRY_FAILED_S after the first failure (a request may wait on a hung worker before it fails)
        deadline: float | None = None
        unavailable: web.Response | None = None  # a 503 met on the way: the answer that says "retry later"
        while True:
            answer = await self._forward(request, body)
            if not isinstance(answer, _Failed):
                return answer
            if answer.response.status == 503:
                unavailable = answer.response
            now = time.monotonic()
            deadline = now + RETRY_FAILED_S if deadline is None else deadline
            if request.method != "POST" or now + RETRY_PAUSE_S > max(deadline, self._hold_until):
                # still failing: the upstream's own answer, or its 503 + Retry-After when a tier was missing
                return unavailable or answer.response
            await asyncio.sleep(RETRY_PAUSE_S)

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse | _Failed:
        """One try upstream; _Failed when it failed before the client got anything (retried by _handle)."""
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = f"http://{self.upstream}{request.path_qs}"
        try:
            async with self._session.request(request.method, url, headers=headers, data=body) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
                if up.status in OVERLOADED:
                    payload = await up.read()
                    overloaded = self._overloaded(up.status, payload)
                    if OVERLOADED[up.status] != 503:
                        return overloaded
                    return self._retried(overloaded, _message(payload))
                if up.status == 200 and request.method == "POST" and _wants_stream(body):
                    return await self._stream(request, up, out_headers)
                payload = await up.read()
                if up.status == 404 and request.method == "POST":
                    model = _model(body)
                    if model in self.models:  # all its workers gone: they are being restarted
                        return _Failed(_error(503, f"llmkiln: no worker serves {model} right now (one is "
                                                   "restarting): retry", "unavailable"))  # fmt: skip
                response = web.Response(body=payload, status=up.status, headers=out_headers)
                return _Failed(response) if up.status == 500 else response
        except aiohttp.ClientError as exc:
            return _error(503, f"the OpenAI frontend is not reachable ({type(exc).__name__})", "unavailable")

    async def _checked_body(self, path: str, body: bytes) -> bytes | web.Response:
        """The body to forward, or the 400 that answers it (see the module docstring)."""
        data, problem = parse_json_object(
            body, BODY_FIELDS, 'a JSON object, e.g. {"model": ..., "prompt": ...}'
        )
        if data is None:
            return _error(400, f"llmkiln: {problem}", "invalid_request_error")
        unserved = unserved_field(path, data)
        if unserved is not None:
            return _error(400, unserved, "invalid_request_error")
        texts = completion_text(data) if path == COMPLETIONS and self.tokenizer is not None else None
        if texts is None or self.tokenizer is None:
            return body
        bound = self.max_prompt_bytes
        if bound is not None and any(len(t) > bound and len(t.encode("utf-8")) > bound for t in texts):
            return _error(
                400,
                "llmkiln: the prompt is far longer than the engine's limits.max_input_len: shorten it",
                "invalid_request_error",
            )
        # the tokenizer releases the GIL in encode_batch: other requests go on meanwhile
        encoded = await asyncio.to_thread(self.tokenizer.encode_batch, texts)
        return with_token_ids(data, [e.ids for e in encoded])

    @staticmethod
    def _overloaded(status: int, payload: bytes) -> web.Response:
        message = _message(payload) or "the server is overloaded: retry later"
        code = OVERLOADED[status]
        return _error(code, message, "rate_limit_error" if code == 429 else "unavailable")

    async def _stream(
        self, request: web.Request, up: aiohttp.ClientResponse, headers: dict[str, Any]
    ) -> web.StreamResponse | _Failed:
        first = b""
        async for chunk in up.content.iter_any():
            first += chunk
            if b"\n\n" in first or len(first) > FIRST_EVENT_MAX_BYTES:
                break
        event = first.split(b"\n\n", 1)[0]
        if _error_event(event, {500}) is not None:  # failed before any token (a worker gone): retried
            return _Failed(
                _error(500, "llmkiln: the request failed upstream before any token", "internal_error")
            )
        rejected = _error_event(event)
        if rejected is not None:
            code, message = rejected
            status = OVERLOADED[code]
            response = _error(status, message or "the server is overloaded: retry later",
                              "rate_limit_error" if status == 429 else "unavailable")  # fmt: skip
            return self._retried(response, message) if status == 503 else response
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        if first:
            await resp.write(first)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
