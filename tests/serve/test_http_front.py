"""The HTTP front before Triton's generate endpoints: types and ranges checked before Triton converts them,
stream on /generate refused, retryable answers with Retry-After, everything else passed through."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient

from llmkiln.serve.http_checks import check_generate_body
from llmkiln.serve.server import ADMIN_HEADER, ServerConfig, TritonServer, free_ports

from .client import grpc_inputs, metric, scrape
from .conftest import fake_repository


@pytest.mark.parametrize(
    "body, streaming, problem",
    [
        (b'{"text_input": "x", "max_tokens": 4294967301}', False, "'max_tokens' must be an integer in"),
        (b'{"text_input": "x", "max_tokens": "3"}', False, "'max_tokens' must be an integer"),
        (b'{"text_input": "x", "max_tokens": true}', False, "'max_tokens' must be an integer"),
        (b'{"text_input": 5, "max_tokens": 3}', False, "'text_input' must be a string"),
        (b'{"text_input": "x", "max_tokens": 3, "temperature": 1e39}', False, "fits FP32"),
        (b'{"text_input": "x", "max_tokens": 3, "random_seed": -1}', False, "'random_seed'"),
        (
            b'{"text_input": "x", "max_tokens": 3, "stop_words": ["a", 7]}',
            False,
            "'stop_words' must be a string",
        ),
        (b'{"text_input": "x", "max_tokens": [1, 2]}', False, "takes one value"),
        (b'{"text_input": "x", "max_tokens": 3, "stream": true}', False, "generate_stream"),
        (b"[1, 2]", False, "JSON object"),
        (b"{nope", False, "not valid JSON"),
    ],
)
def test_generate_bodies_triton_would_mangle_are_refused(body: bytes, streaming: bool, problem: str):
    got = check_generate_body(body, streaming)
    assert got is not None and problem in got
    assert "4294967301" not in got and "1e39" not in got  # never echoes the value


def test_good_generate_bodies_pass():
    assert (
        check_generate_body(b'{"text_input": "x", "max_tokens": 3, "stream": true}', streaming=True) is None
    )
    ok = b'{"text_input": "x", "max_tokens": [3], "stop_words": ["a", "b"], "top_p": 0.5, "custom": 1}'
    assert check_generate_body(ok, streaming=False) is None


@pytest.fixture(scope="module")
def front_server(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("front")
    fake_repository(tmp, drain_file=tmp / "drain")
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_s=5,
                       workdir=tmp / "work", drain_file=tmp / "drain", http_front=True, admin_key="k3y")  # fmt: skip
    server = TritonServer(cfg)
    server.start()
    server.wait_ready(120)
    yield server
    server.stop()


def _post(server: TritonServer, path: str, body: bytes) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(f"http://{server.url_http}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.slow
def test_front_refuses_wrapped_integers_and_wrong_types_with_400(front_server: TritonServer):
    gen = "/v2/models/fake/generate"
    status, _, body = _post(front_server, gen, json.dumps({"text_input": "hi", "max_tokens": 2}).encode())
    assert status == 200 and json.loads(body)["text_output"] == "hihi"
    for bad in (
        {"text_input": "hi", "max_tokens": 4294967301},  # Triton alone answers 200 with 5 tokens
        {"text_input": "hi", "max_tokens": "3"},  # Triton alone answers 500
        {"text_input": 5, "max_tokens": 3},
    ):
        status, _, body = _post(front_server, gen, json.dumps(bad).encode())
        assert status == 400, (bad, body)
        assert "4294967301" not in body.decode()
    status, _, body = _post(front_server, gen, b'{"text_input": "hi", "max_tokens": 3, "stream": true}')
    assert status == 400 and b"generate_stream" in body
    status, headers, body = _post(
        front_server,
        "/v2/models/fake/generate_stream",
        b'{"text_input": "hi", "max_tokens": 3, "stream": true}',
    )
    assert status == 200 and body.count(b"data: ") == 3 and "text/event-stream" in headers["Content-Type"]
    status, _, _ = _post(
        front_server, gen, json.dumps({"text_input": "x" * 400_000, "max_tokens": 2}).encode()
    )
    assert status == 413


@pytest.mark.slow
def test_front_passes_admin_apis_through_with_the_key(front_server: TritonServer):
    url = f"http://{front_server.url_http}/v2/logging"
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url, timeout=5)
    assert exc.value.code == 403
    with urllib.request.urlopen(urllib.request.Request(url, headers={ADMIN_HEADER: "k3y"}), timeout=5) as r:
        assert r.status == 200


@pytest.mark.slow
def test_full_queue_is_429_and_draining_503_both_with_retry_after(front_server: TritonServer):
    # the stand-in engine admits 64 requests: hold them with long ones on a gRPC stream, then ask over HTTP
    client = grpcclient.InferenceServerClient(front_server.url_grpc)
    client.start_stream(callback=lambda result, error: None)
    try:
        for i in range(64):
            client.async_stream_infer("fake", grpc_inputs(f"p{i}", 100_000, stream=True), request_id=str(i))
        deadline = time.monotonic() + 60
        while metric(scrape(front_server.url_metrics), "llmkiln_requests_active") < 64:  # all places taken
            assert time.monotonic() < deadline
            time.sleep(0.05)
        body = json.dumps({"text_input": "hi", "max_tokens": 2}).encode()
        deadline = time.monotonic() + 30
        while True:
            status, headers, payload = _post(front_server, "/v2/models/fake/generate", body)
            if status != 200 or time.monotonic() > deadline:
                break
        assert status == 429 and headers.get("Retry-After") == "1" and b"queue full" in payload
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    drain = front_server.cfg.drain_file
    assert drain is not None
    drain.write_text(str(time.time() + 3600))
    try:
        status, headers, payload = _post(front_server, "/v2/models/fake/generate", body)
        assert status == 503 and headers.get("Retry-After") == "1" and b"shutting down" in payload
    finally:
        drain.unlink()
