"""llmkiln's OpenAI front before Dynamo's frontend: overload is 429 + Retry-After and shutdown 503 + Retry-After,
streaming or not; only the OpenAI API and the probes are public; bad bodies and fields the engine does not serve
are 400s naming the field, a compressed body 415, before anything reaches the upstream; a text prompt too long to
fit is refused without tokenizing and others are tokenized off the event loop; nothing else changes (a fake
upstream here; the real launch in test_overload.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import requests
from aiohttp import web

from llmkiln.dynamo.openai_front import NO_WORKER_MESSAGE, OpenAIFront
from llmkiln.serve.server import free_ports


class Upstream:
    """A stand-in for Dynamo's frontend: answers by the prompt."""

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self.seen: list[str] = []  # the paths that reached it
        self.cancelled: list[str] = []  # prompts whose request was dropped before it was answered
        self.tries: dict[str, int] = {}  # prompt -> requests seen
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, handler_cancellation=True)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.path)
        if request.method == "GET":
            return web.json_response({"data": [{"id": "llmkiln"}]})
        body = await request.json()
        prompt, stream = body["prompt"], body.get("stream", False)
        key = str(prompt)  # text, or token ids from a front with a tokenizer
        self.tries[key] = self.tries.get(key, 0) + 1
        if (key.startswith("flaky") and self.tries[key] <= 2) or key == "broken":  # a dead worker's 500s
            if not stream:
                return web.json_response(
                    {"message": "Failed to generate completions", "code": 500}, status=500
                )
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            err = {"error": {"message": "Failed to generate completions", "code": 500}}
            await resp.write(f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp
        if body.get("model") != "llmkiln" or (key.startswith("gone") and self.tries[key] <= 2):
            # Dynamo's frontend once the last worker serving a model is gone (or for a model never served)
            return web.json_response(
                {"message": f"Model not found: {body.get('model')}", "code": 404}, status=404
            )
        if key.startswith("noworker") and self.tries[key] <= 2:  # a tier without workers, for a moment
            return web.json_response({"message": NO_WORKER_MESSAGE, "code": 503}, status=503)
        if prompt == "slow":  # a long non-streaming generation
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.append(prompt)
                raise
            return web.json_response({"choices": [{"text": "done"}]})
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
def upstream() -> Upstream:
    return Upstream()


@pytest.fixture(scope="module")
def front(upstream: Upstream):
    f = OpenAIFront("127.0.0.1", free_ports(1)[0], f"127.0.0.1:{upstream.port}")
    f.start()
    yield f
    f.stop()


def _post(front: OpenAIFront, prompt: str, stream: bool, model: str = "llmkiln") -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{front.port}/v1/completions",
        json={"model": model, "prompt": prompt, "stream": stream},
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
    """What the front forwards for a /v1/completions body (its own check-and-tokenize step, no server)."""
    from aiohttp import web
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(stories_engine / "tokenizer.json"))
    f = OpenAIFront("127.0.0.1", 0, "127.0.0.1:1", tok)

    def forwarded(body: bytes) -> bytes | web.Response:
        return asyncio.run(f._checked_body("/v1/completions", body))

    one = json.loads(forwarded(b'{"model": "m", "prompt": "Once upon a time"}'))
    assert one["prompt"] == tok.encode("Once upon a time").ids and one["prompt"][0] == 1
    two = json.loads(forwarded(b'{"prompt": ["A cat", "A dog"], "max_tokens": 3}'))
    assert two["prompt"] == [tok.encode("A cat").ids, tok.encode("A dog").ids] and two["max_tokens"] == 3
    for unchanged in (b'{"prompt": [1, 2, 3]}', b'{"messages": []}'):
        assert forwarded(unchanged) == unchanged
    for refused in (b"not json", b"[1]"):  # answered here, never forwarded
        answer = forwarded(refused)
        assert isinstance(answer, web.Response) and answer.status == 400


def test_only_the_openai_api_and_the_probes_are_public(front: OpenAIFront, upstream: Upstream):
    base = f"http://127.0.0.1:{front.port}"
    before = len(upstream.seen)
    r = requests.post(
        f"{base}/busy_threshold", json={"model": "llmkiln", "active_decode_blocks_threshold": 0}, timeout=10
    )
    assert r.status_code == 404 and "/v1/completions" in r.json()["error"]["message"]
    for path in ("/docs", "/openapi.json", "/v1/embeddings"):
        assert requests.get(base + path, timeout=10).status_code == 404
    assert requests.get(f"{base}/v1/completions", timeout=10).status_code == 405
    assert len(upstream.seen) == before  # none of them reached Dynamo's frontend
    assert requests.get(f"{base}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", b'{"model": "llmkiln", "prompt": "\\ud800", "max_tokens": 2}', "Unicode"),
        ("/v1/completions", b'{"model": "llmkiln", "prompt": "a", "n": 2}', "'n'"),
        ("/v1/completions", b'{"model": "llmkiln", "prompt": "a", "best_of": 3}', "'best_of'"),
        ("/v1/completions", b'{"model": "llmkiln", "prompt": "a", "logprobs": 1}', "'logprobs'"),
        ("/v1/chat/completions", b'{"model": "llmkiln", "messages": [], "logprobs": true}', "'logprobs'"),
        (
            "/v1/chat/completions",
            b'{"model": "llmkiln", "messages": [], "top_logprobs": 2}',
            "'top_logprobs'",
        ),
        ("/v1/chat/completions", b'{"model": "llmkiln", "messages": [], "n": 2}', "'n'"),
        ("/v1/completions", b'{"prompt": "a", "prompt": "b"}', "'prompt' appears more than once"),
        ("/v1/completions", b'{"prompt": NaN}', "not valid JSON"),
        ("/v1/completions", b"\xff\xfe", "not UTF-8"),
        ("/v1/completions", b"[1, 2]", "JSON object"),
    ],
)
def test_bad_bodies_and_unserved_fields_are_400_naming_them(front, upstream, path, body, field):
    before = len(upstream.seen)
    r = requests.post(f"http://127.0.0.1:{front.port}{path}", data=body, timeout=10,
                      headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
    assert len(upstream.seen) == before


def test_a_compressed_body_is_415(front, upstream):
    import gzip

    r = requests.post(
        f"http://127.0.0.1:{front.port}/v1/completions",
        data=gzip.compress(b'{"model": "llmkiln", "prompt": "hello"}'),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=10,
    )
    assert r.status_code == 415 and "uncompressed" in r.json()["error"]["message"]
    ok = {"model": "llmkiln", "prompt": "hello", "n": 1, "logprobs": None}  # the defaults pass
    assert (
        requests.post(f"http://127.0.0.1:{front.port}/v1/completions", json=ok, timeout=10).status_code == 200
    )


def test_a_huge_prompt_is_refused_untokenized_and_others_keep_flowing(stories_engine, upstream):
    """Two clients send 8 MB text prompts while a third sends small ones: the huge ones get their 400 at once
    (the byte bound), the small ones are answered meanwhile; tokenizing runs off the event loop."""
    from concurrent.futures import ThreadPoolExecutor

    from tokenizers import Tokenizer

    from llmkiln.engine_dir import EngineDir
    from llmkiln.serve.http_checks import prompt_byte_bound

    folder = EngineDir(stories_engine)
    tok = Tokenizer.from_file(str(folder.tokenizer_file()))
    bound = prompt_byte_bound(tok.get_vocab(), folder.recipe().limits.max_input_len)
    f = OpenAIFront("127.0.0.1", free_ports(1)[0], f"127.0.0.1:{upstream.port}", tok, bound)
    f.start()
    try:
        url = f"http://127.0.0.1:{f.port}/v1/completions"
        huge = {"model": "llmkiln", "prompt": "Once upon a time " * (8 * 2**20 // 17)}
        small = {"model": "llmkiln", "prompt": "hello"}
        with ThreadPoolExecutor(4) as pool:
            big = [pool.submit(requests.post, url, json=huge, timeout=60) for _ in range(2)]
            smalls = [requests.post(url, json=small, timeout=10) for _ in range(5)]
            assert all(r.status_code == 200 for r in smalls)
            for fut in big:
                r = fut.result()
                assert r.status_code == 400 and "max_input_len" in r.json()["error"]["message"]
    finally:
        f.stop()


def test_a_client_leaving_a_non_streaming_request_cancels_it_upstream(front, upstream):
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(
            f"http://127.0.0.1:{front.port}/v1/completions",
            json={"model": "llmkiln", "prompt": "slow", "max_tokens": 480},
            timeout=0.5,
        )
    deadline = time.monotonic() + 10
    while "slow" not in upstream.cancelled:
        assert time.monotonic() < deadline, "the upstream request was not dropped"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_a_generation_failing_before_any_token_is_sent_again(front, upstream, stream):
    """A worker that died answers 500 (streaming: an error event before any token) until the launcher takes it
    out of discovery: the front sends the request again and the client gets the answer, not the 500."""
    prompt = f"flaky-{stream}"
    r = _post(front, prompt, stream)
    assert r.status_code == 200, r.text
    assert upstream.tries[prompt] == 3
    assert ("data: " in r.text) if stream else r.json() == {"choices": [{"text": "ok"}]}


def test_a_lasting_failure_is_the_upstreams_answer(front, upstream):
    before = upstream.tries.get("broken", 0)
    r = _post(front, "broken", False)
    assert r.status_code == 500 and upstream.tries["broken"] - before > 2  # tried again, then gave its answer


def test_the_launchs_model_gone_is_503_and_sent_again_other_models_404(upstream):
    """The frontend forgets a model whose last worker died (404 "model not found") until the restarted worker
    registers: for the launch's own model the front sends the request again (503 + Retry-After if it lasts); a
    model the launch does not serve stays a 404 at once. The frontend's "no worker" 503 is sent again only in a
    launch that covers a missing tier (prefill/decode)."""
    front = OpenAIFront(
        "127.0.0.1", free_ports(1)[0], f"127.0.0.1:{upstream.port}", models=("llmkiln",), retry_no_worker=True
    )
    front.start()
    try:
        for stream in (False, True):
            r = _post(front, f"gone-{stream}", stream)
            assert r.status_code == 200 and upstream.tries[f"gone-{stream}"] == 3, r.text
            r = _post(front, f"noworker-{stream}", stream)
            assert r.status_code == 200 and upstream.tries[f"noworker-{stream}"] == 3, r.text
        r = _post(front, "other-model", False, model="other")
        assert r.status_code == 404 and upstream.tries["other-model"] == 1
    finally:
        front.stop()


def test_without_a_covered_tier_no_worker_is_503_at_once(front, upstream):
    r = _post(front, "noworker-plain", False)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and upstream.tries["noworker-plain"] == 1
    assert r.json()["error"]["message"] == NO_WORKER_MESSAGE
    r = _post(front, "gone-plain", False)  # no served model given: the upstream's 404 stands
    assert r.status_code == 404 and upstream.tries["gone-plain"] == 1
