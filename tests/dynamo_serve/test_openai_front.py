"""llmkiln's OpenAI front before Dynamo's frontend: overload is 429 + Retry-After and shutdown 503 + Retry-After,
streaming or not; nothing else changes (a fake upstream here; the real launch in test_overload.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import requests
from aiohttp import web

from llmkiln.dynamo.openai_front import OpenAIFront
from llmkiln.serve.server import free_ports


class Upstream:
    """A stand-in for Dynamo's frontend: answers by the prompt."""

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.json_response({"data": [{"id": "llmkiln"}]})
        body = await request.json()
        prompt, stream = body["prompt"], body.get("stream", False)
        if prompt == "busy":  # Dynamo's own busy check
            return web.json_response({"message": "Service temporarily overloaded", "code": 529}, status=529)
        if not stream:
            if prompt == "full":
                return web.json_response({"message": "Too Many Requests", "code": 429}, status=429)
            return web.json_response({"choices": [{"text": "ok"}]})
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if prompt == "full":  # a worker's HttpError(429) inside the committed stream
            err = {"error": {"message": "llmkiln: queue full", "type": "rate_limit_error", "code": 429}}
            await resp.write(f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
        else:
            for t in ("a", "b", "c"):
                await resp.write(f"data: {json.dumps({'choices': [{'text': t}]})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture(scope="module")
def front():
    up = Upstream()
    f = OpenAIFront("127.0.0.1", free_ports(1)[0], f"127.0.0.1:{up.port}")
    f.start()
    yield f
    f.stop()


def _post(front: OpenAIFront, prompt: str, stream: bool) -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{front.port}/v1/completions",
        json={"model": "llmkiln", "prompt": prompt, "stream": stream},
        timeout=10,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_overload_is_429_with_retry_after(front: OpenAIFront, stream: bool):
    for prompt in ("full", "busy"):
        r = _post(front, prompt, stream)
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", (prompt, r.status_code, r.text)
        assert r.json()["error"]["type"] == "rate_limit_error"


def test_streams_and_answers_pass_through_unchanged(front: OpenAIFront):
    r = _post(front, "hello", True)
    assert r.status_code == 200 and r.text.count("data: ") == 4 and r.text.endswith("data: [DONE]\n\n")
    r = _post(front, "hello", False)
    assert r.status_code == 200 and r.json() == {"choices": [{"text": "ok"}]}
    assert (
        requests.get(f"http://127.0.0.1:{front.port}/v1/models", timeout=10).json()["data"][0]["id"]
        == "llmkiln"
    )


def test_draining_refuses_new_requests_with_503(front: OpenAIFront):
    front.draining = True
    try:
        for stream in (False, True):
            r = _post(front, "hello", stream)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert "shutting down" in r.json()["error"]["message"]
        assert requests.get(f"http://127.0.0.1:{front.port}/v1/models", timeout=10).status_code == 200
    finally:
        front.draining = False


def test_completion_text_becomes_token_ids_with_bos(stories_engine):
    from tokenizers import Tokenizer

    from llmkiln.dynamo.openai_front import completion_with_token_ids

    tok = Tokenizer.from_file(str(stories_engine / "tokenizer.json"))
    one = json.loads(completion_with_token_ids(b'{"model": "m", "prompt": "Once upon a time"}', tok))
    assert one["prompt"] == tok.encode("Once upon a time").ids and one["prompt"][0] == 1
    two = json.loads(completion_with_token_ids(b'{"prompt": ["A cat", "A dog"], "max_tokens": 3}', tok))
    assert two["prompt"] == [tok.encode("A cat").ids, tok.encode("A dog").ids] and two["max_tokens"] == 3
    for unchanged in (b'{"prompt": [1, 2, 3]}', b'{"messages": []}', b"not json", b"[1]"):
        assert completion_with_token_ids(unchanged, tok) == unchanged
