"""The HTTP front before Triton's generate endpoints: types and ranges checked before Triton converts them,
stream on /generate refused, retryable answers with Retry-After, everything else passed through."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmkiln.serve.http_checks import parse_generate_body
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
        # issue 21, finding 7: bodies Python reads one way and Triton another
        (b'{"text_input": "x", "max_tokens": 3, "stream": [true]}', False, "generate_stream"),
        (
            b'{"text_input": "x", "max_tokens": 3, "temperature": "hot", "temperature": 0.5}',
            False,
            "'temperature' appears more than once",
        ),
        (b'{"text_input": "x\\ud800", "max_tokens": 3}', False, "'text_input' is not valid Unicode"),
        (b'{"text_input": "x", "max_tokens": 3, "note": {"\\udfff": 1}}', False, "not valid Unicode"),
        (b'{"text_input": "x", "max_tokens": 3, "id": 5}', False, "'id' (the request id) must be a string"),
        (b'{"text_input": "x", "max_tokens": 3, "note": NaN}', False, "not valid JSON"),
        ('{"text_input": "x", "max_tokens": 3}'.encode("utf-16"), False, "not UTF-8"),
        (b"[" * 5000, False, "nested more than"),
        (b'{"a": ' * 3000, False, "nested more than"),
        (b'{"a": ' * 80 + b"1" + b"}" * 80, False, "nested more than"),
    ],
)
def test_generate_bodies_triton_would_mangle_are_refused(body: bytes, streaming: bool, problem: str):
    data, got = parse_generate_body(body, streaming)
    assert data is None and got is not None and problem in got
    assert "4294967301" not in got and "1e39" not in got  # never echoes the value


def test_good_generate_bodies_pass():
    data, problem = parse_generate_body(
        b'{"text_input": "x", "max_tokens": 3, "stream": true}', streaming=True
    )
    assert problem is None and data == {"text_input": "x", "max_tokens": 3, "stream": True}
    ok = b'{"text_input": "x", "max_tokens": [3], "stop_words": ["a", "b"], "top_p": 0.5, "custom": 1}'
    data, problem = parse_generate_body(ok, streaming=False)
    assert problem is None and data is not None and data["stop_words"] == ["a", "b"]


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


def _post(
    server: TritonServer, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(
        f"http://{server.url_http}{path}", data=body, method="POST", headers=headers or {}
    )
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


BYPASSES = [  # issue 21, finding 7: each one got past the front's checks (status before the fix)
    ({}, b'{"text_input": "hi", "max_tokens": 2, "stream": [true]}', 400, b"generate_stream"),  # 200 + error
    (
        {},
        b'{"text_input": "hi", "max_tokens": 2, "temperature": "x", "temperature": 0.5}',
        400,
        b"more than once",
    ),
    ({}, b'{"text_input": "hi\\ud800", "max_tokens": 2}', 400, b"not valid Unicode"),  # 500
    ({}, b'{"text_input": "hi", "max_tokens": 2, "id": 5}', 400, b"request id"),  # 500
    ({"Content-Encoding": "gzip"}, b'{"text_input": "hi", "max_tokens": 2}', 415, b"uncompressed"),  # 500
    ({"Content-Encoding": "zstd"}, b'{"text_input": "hi", "max_tokens": 2}', 415, b"uncompressed"),
    ({}, b"[" * 5000, 400, b"nested"),
]


@pytest.mark.slow
@pytest.mark.parametrize("headers, body, status, message", BYPASSES)
def test_front_bypasses_are_client_errors_without_a_traceback(
    front_server: TritonServer, caplog: pytest.LogCaptureFixture, headers, body, status, message
):
    caplog.set_level(logging.ERROR)
    for path in ("/v2/models/fake/generate", "/v2/models/fake/generate_stream"):
        if path.endswith("stream") and b"[true]" in body:
            continue  # stream: [true] is right on the streaming endpoint
        got, resp_headers, payload = _post(front_server, path, body, headers)
        assert (got, message in payload) == (status, True), (path, payload)
        if status == 415:
            assert resp_headers.get("Accept-Encoding") == "identity"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    ok, _, payload = _post(front_server, "/v2/models/fake/generate", b'{"text_input": "hi", "max_tokens": 2}')
    assert ok == 200 and json.loads(payload)["text_output"] == "hihi"  # the front still serves


@pytest.mark.slow
def test_generate_through_the_stream_gives_the_same_answer(front_server: TritonServer):
    gen = "/v2/models/fake/generate"
    cases = [
        ({"text_input": "hi", "max_tokens": 3}, "hihih"),
        ({"text_input": ["hi"], "max_tokens": [3], "exclude_input_in_output": [True]}, "hih"),
        ({"text_input": "hi", "max_tokens": 3, "stop_words": ["i"]}, "hih"),
        ({"text_input": "hi", "max_tokens": 3, "stream": False}, "hihih"),
    ]
    for body, text in cases:
        status, headers, payload = _post(front_server, gen, json.dumps(body).encode())
        out = json.loads(payload)
        assert status == 200 and "application/json" in headers["Content-Type"], payload
        assert out["text_output"] == text and out["model_name"] == "fake", (body, out)
    status, _, payload = _post(front_server, gen, json.dumps(
        {"text_input": "hi", "max_tokens": 3, "return_perf_metrics": True, "id": "r1"}).encode())  # fmt: skip
    out = json.loads(payload)
    assert (
        status == 200
        and out["id"] == "r1"
        and out["num_output_tokens"] == 3
        and out["text_output"] == "hihih"
    )
    status, _, payload = _post(front_server, gen, b'{"text_input": "hi", "max_tokens": 0}')
    assert status == 400 and b"max_tokens must be an integer >= 1" in payload
    status, _, payload = _post(
        front_server, "/v2/models/nope/generate", b'{"text_input": "hi", "max_tokens": 1}'
    )
    assert 400 <= status < 500, payload


def _wait_metric(server: TritonServer, name: str, ok, timeout_s: float = 60.0) -> float:
    """Poll a metric until ok(value) (a bounded wait for an event, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = metric(scrape(server.url_metrics), name)
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_a_client_that_disconnects_is_cancelled(front_server: TritonServer, path: str):
    """Issue 21, finding 8: a disconnected /generate client's request ran to completion (30 of 30); the stand-in
    engine needs 2 ms per token, so 100,000 tokens would run for 200 s."""
    before = metric(scrape(front_server.url_metrics), "llmkiln_requests_cancelled_total")
    body = json.dumps(
        {"text_input": "hi", "max_tokens": 100_000, "stream": path == "generate_stream"}
    ).encode()
    host, port = front_server.url_http.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST /v2/models/fake/{path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert _wait_metric(front_server, "llmkiln_requests_active", lambda v: v >= 1) >= 1
    # the socket is closed: the request is cancelled and its place freed, long before it could finish
    assert _wait_metric(front_server, "llmkiln_requests_cancelled_total", lambda v: v > before) == before + 1
    assert _wait_metric(front_server, "llmkiln_requests_active", lambda v: v == 0) == 0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
_KEYS = st.sampled_from(
    ["text_input", "max_tokens", "stream", "temperature", "top_p", "top_k", "seed", "random_seed", "end_id",
     "stop_words", "priority", "exclude_input_in_output", "return_perf_metrics", "id", "parameters", "x"]
)  # fmt: skip


@st.composite
def _bodies(draw) -> bytes:
    """Raw bodies: a JSON object from a list of pairs (duplicates possible), with lone surrogates sometimes;
    max_tokens small when it is a valid count, so every request ends quickly."""
    pairs = [
        ("text_input", draw(st.sampled_from(["hi", "\ud800", ["hi"], 5]))),
        ("max_tokens", draw(st.sampled_from([1, 2, [2], "2", 0]))),
    ]
    pairs += draw(st.lists(st.tuples(_KEYS, _JSON), max_size=4))
    pairs = [
        (k, v)
        for k, v in pairs
        if not (k == "max_tokens" and isinstance(v, int) and not isinstance(v, bool) and v > 8)
    ]
    escaped = draw(st.booleans())  # \\u escapes, or raw UTF-8 (a lone surrogate then is invalid UTF-8)
    dump = lambda v: json.dumps(v, ensure_ascii=escaped)  # noqa: E731
    text = "{" + ",".join(f"{dump(k)}:{dump(v)}" for k, v in pairs) + "}"
    return text.encode("utf-8", "surrogatepass")


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_bodies(), stream=st.booleans(), encoding=st.sampled_from([None, None, None, "gzip", "deflate"]))
def test_fuzzed_generate_bodies_never_get_a_5xx(
    front_server: TritonServer, body: bytes, stream: bool, encoding
):
    path = "/v2/models/fake/generate_stream" if stream else "/v2/models/fake/generate"
    status, _, payload = _post(front_server, path, body, {"Content-Encoding": encoding} if encoding else None)
    assert status < 500, (body, status, payload)


# last: the drain it starts is not undone (the model stays in shutdown mode)
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


def test_a_health_probe_to_a_silent_triton_is_503_not_a_hang():
    """An upstream that accepts connections and never answers (a SIGSTOPped tritonserver): readiness and liveness
    through the front are 503 after HEALTH_TIMEOUT_S, not a hang for as long as the client waits."""
    from llmkiln.serve.http_front import HEALTH_TIMEOUT_S, HttpFront

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the handshakes; nobody reads or replies
    port = free_ports(1)[0]
    front = HttpFront("127.0.0.1", port, f"127.0.0.1:{silent.getsockname()[1]}", 1 << 20)
    front.start()
    try:
        for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/llmkiln/ready"):
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HEALTH_TIMEOUT_S + 20)
            assert exc.value.code == 503 and exc.value.headers["Retry-After"], path
            assert "health probe" in exc.value.read().decode()
    finally:
        front.stop()
        silent.close()
