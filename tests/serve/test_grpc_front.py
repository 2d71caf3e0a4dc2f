"""llmkiln's gRPC front (llmkiln.serve.grpc_front) before a real tritonserver, stand-in engine."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from llmkiln.bench.client import grpc_inputs
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports

from .client import metric, scrape, stream_many
from .conftest import fake_repository

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fronted(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("grpc-front")
    fake_repository(tmp)
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics, exit_timeout_s=10,
                       workdir=tmp / "work", grpc_front=True, log_verbose=1)  # fmt: skip
    server = TritonServer(cfg)
    server.start()
    server.wait_ready(120)
    yield server
    server.stop()


def test_streams_pass_through_with_their_ids(fronted: TritonServer):
    assert fronted.triton_grpc[1] != fronted.cfg.grpc_port  # Triton's own gRPC is on another (loopback) port
    reqs = [{"prompt": f"p{i}", "max_tokens": 4, "stream": True} for i in range(3)]
    results = stream_many(fronted.url_grpc, "fake", reqs)  # ids "0", "1", "2" come back unchanged
    assert [r.text for r in results] == ["p0p0", "p1p1", "p2p2"] and all(r.error is None for r in results)


def test_a_cancelled_stream_is_cancelled_in_band(fronted: TritonServer):
    before = metric(scrape(fronted.url_metrics), "llmkiln_requests_cancelled_total")
    client = grpcclient.InferenceServerClient(fronted.url_grpc)
    got = threading.Event()
    client.start_stream(callback=lambda result, error: got.set())
    client.async_stream_infer("fake", grpc_inputs("cancel me", 5000, stream=True), request_id="c1")
    assert got.wait(30)
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 10
    while metric(scrape(fronted.url_metrics), "llmkiln_requests_cancelled_total") == before:
        assert time.monotonic() < deadline, "the cancel never reached the model"
        time.sleep(0.1)
    while fronted.grpc_front is not None and fronted.grpc_front.upstream_streams:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Triton saw an ordinary end of stream, never a cancellation
    assert not any("Cancellation notification received" in ln for ln in fronted.lines)


def test_errors_and_restricted_apis_pass_through(fronted: TritonServer):
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(fronted.url_grpc)
    client.start_stream(callback=lambda result, error: q.put(error))
    client.async_stream_infer("no-such-model", grpc_inputs("x", 2, stream=True))
    error = q.get(timeout=30)
    assert error is not None and "no-such-model" in str(error)
    client.stop_stream()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_log_settings()
    assert client.is_server_ready() and client.get_model_metadata("fake").name == "fake"
    client.close()


def test_a_client_cannot_send_a_cancel(fronted: TritonServer):
    # the front drops the reserved parameters: this is an ordinary request, served in full
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(fronted.url_grpc)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    inputs = grpc_inputs("abc", 3, stream=False)
    client.async_stream_infer(
        "fake", inputs, parameters={"llmkiln_cancel": "g0-0"}, enable_empty_final_response=True
    )
    result, error = q.get(timeout=30)
    assert error is None and result.as_numpy("text_output")[0, 0] == b"abcabc"
    client.stop_stream()
    client.close()
    # and straight to Triton's port, a cancel without the server's key is refused
    direct = grpcclient.InferenceServerClient(f"127.0.0.1:{fronted.triton_grpc[1]}")
    direct.start_stream(callback=lambda result, error: q.put((result, error)))
    direct.async_stream_infer("fake", grpc_inputs("", 1), parameters={"llmkiln_cancel": "g0-0",
                              "llmkiln_cancel_key": "guess"}, enable_empty_final_response=True)  # fmt: skip
    _, error = q.get(timeout=30)
    assert error is not None and "reserved" in str(error)
    direct.stop_stream()
    direct.close()


def test_large_messages_reach_the_model(fronted: TritonServer):
    # 5 MB is beyond gRPC's default 4 MiB message limit: the front takes what Triton takes, the model decides
    [r] = stream_many(fronted.url_grpc, "fake", [{"prompt": "x" * 5_000_000, "max_tokens": 2}])
    assert r.error is not None and "5000000 bytes is more than serve.max_prompt_bytes" in r.error
