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
- a `/v1/completions` prompt given as text is tokenized here with the engine's tokenizer, special tokens
  included (BOS), and forwarded as token ids: Dynamo 1.6.1's frontend tokenizes completion text without special
  tokens, so the same prompt would reach the engine without the BOS that `kiln serve` (Triton), transformers and
  vLLM give it — other tokens, other output, another prefix-cache key. Token-id prompts and chat requests (whose
  template writes the BOS) pass unchanged.
Measured cost of the hop: docs/serve.md ("The OpenAI front").

It runs an aiohttp server on its own event loop in a thread of the launcher process.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from llmkiln.serve.proxy_front import ProxyFront

if TYPE_CHECKING:
    from tokenizers import Tokenizer

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade"}
RETRY_AFTER_S = "1"
FIRST_EVENT_MAX_BYTES = 1 << 20
OVERLOADED = {429: 429, 529: 429, 503: 503}  # upstream status (or error event code) -> the client's status
SHUTTING_DOWN = "llmkiln: the server is shutting down; retry on another replica or after it restarts"


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


def completion_with_token_ids(body: bytes, tokenizer: Tokenizer) -> bytes:
    """A /v1/completions body whose text prompt (a string or a list of strings) is replaced by its token ids,
    special tokens included; any other body is returned as it is (Dynamo's frontend answers what is wrong)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body
    if not isinstance(data, dict):
        return body
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        data["prompt"] = tokenizer.encode(prompt).ids
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        data["prompt"] = [e.ids for e in tokenizer.encode_batch(prompt)]
    else:
        return body
    return json.dumps(data).encode()


def _error_event(event: bytes) -> tuple[int, str] | None:
    """(code, message) when an SSE event is Dynamo's error event with an overload/shutdown code."""
    for line in event.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            data = json.loads(line[5:].strip())
        except (ValueError, UnicodeDecodeError):
            return None
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), int) and err["code"] in OVERLOADED:
            return int(err["code"]), str(err.get("message") or "")
        return None
    return None


class OpenAIFront(ProxyFront):
    """Listens on host:port, forwards to http://upstream (Dynamo's frontend)."""

    thread_name = "llmkiln-openai-front"

    def __init__(self, host: str, port: int, upstream: str, tokenizer: Tokenizer | None = None) -> None:
        super().__init__(host, port, upstream)
        self.tokenizer = tokenizer  # the engine's: completion text prompts become token ids with BOS
        self.draining = False

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
        await self._listen(app, session)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.draining and (request.method == "POST" or request.path.rstrip("/").endswith("/health")):
            return _error(503, SHUTTING_DOWN, "unavailable")
        body = await request.read()
        if (
            self.tokenizer is not None
            and request.method == "POST"
            and request.path.rstrip("/").endswith("/completions")
        ):
            if not request.path.rstrip("/").endswith("/chat/completions"):
                body = completion_with_token_ids(body, self.tokenizer)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        url = f"http://{self.upstream}{request.path_qs}"
        try:
            async with self._session.request(request.method, url, headers=headers, data=body) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
                if up.status in OVERLOADED:
                    payload = await up.read()
                    return self._overloaded(up.status, payload)
                if up.status == 200 and request.method == "POST" and _wants_stream(body):
                    return await self._stream(request, up, out_headers)
                payload = await up.read()
                return web.Response(body=payload, status=up.status, headers=out_headers)
        except aiohttp.ClientError as exc:
            return _error(503, f"the OpenAI frontend is not reachable ({type(exc).__name__})", "unavailable")

    @staticmethod
    def _overloaded(status: int, payload: bytes) -> web.Response:
        message = "the server is overloaded: retry later"
        try:
            data = json.loads(payload)
            inner = data.get("error", data) if isinstance(data, dict) else {}
            if isinstance(inner, dict) and inner.get("message"):
                message = str(inner["message"])
        except (ValueError, UnicodeDecodeError):
            pass
        code = OVERLOADED[status]
        return _error(code, message, "rate_limit_error" if code == 429 else "unavailable")

    async def _stream(
        self, request: web.Request, up: aiohttp.ClientResponse, headers: dict[str, Any]
    ) -> web.StreamResponse:
        first = b""
        async for chunk in up.content.iter_any():
            first += chunk
            if b"\n\n" in first or len(first) > FIRST_EVENT_MAX_BYTES:
                break
        event = first.split(b"\n\n", 1)[0]
        rejected = _error_event(event)
        if rejected is not None:
            code, message = rejected
            status = OVERLOADED[code]
            return _error(status, message or "the server is overloaded: retry later",
                          "rate_limit_error" if status == 429 else "unavailable")  # fmt: skip
        resp = web.StreamResponse(status=200, headers=headers)
        await resp.prepare(request)
        if first:
            await resp.write(first)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
