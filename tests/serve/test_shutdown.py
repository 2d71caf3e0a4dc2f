"""Stopping `kiln serve` (real tritonserver, stand-in engine): clean and fast, and retryable answers to the end.

- 200 gRPC streams read to their final response and closed by closing the channel (without ending the stream),
  then SIGTERM: a clean stop (0), long before the exit timeout. Before: Triton 2.51 kept the model "live" with
  nothing in flight, waited out its exit timeout and exited 1 ("Exit timeout expired"), so kiln serve exited 1.
- Clients hammering gRPC and HTTP through the stop never see "unknown model" (gRPC) or a refused/reset
  connection (HTTP) while tritonserver lives: gRPC gets the drain's UNAVAILABLE "shutting down" or UNAVAILABLE
  from the transport once the server is gone; HTTP gets 503 + Retry-After until tritonserver is gone. Before:
  Triton unloaded the model while its gRPC endpoint still took streams, and the HTTP front closed first.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from llmkiln.serve.launch import serve_forever
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports

from .client import grpc_inputs
from .conftest import fake_repository

pytestmark = pytest.mark.slow

MODEL = "fake"


def _server(tmp: Path, exit_timeout_s: int) -> TritonServer:
    fake_repository(tmp, drain_file=tmp / "drain")
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                       exit_timeout_s=exit_timeout_s, workdir=tmp / "work", drain_file=tmp / "drain",
                       http_front=True)  # fmt: skip
    return TritonServer(cfg)


def one_stream(url: str, close_channel: bool, max_tokens: int = 4, timeout_s: float = 30) -> str:
    """One request on a fresh gRPC stream; 'ok' or the error text. close_channel: end by closing the channel
    without ending the stream (what the adversarial client did); otherwise tritonclient's close()."""
    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error, q=q: q.put((result, error)))
    try:
        try:
            c.async_stream_infer(
                MODEL, grpc_inputs("Once upon", max_tokens, stream=True), enable_empty_final_response=True
            )
        except InferenceServerException as exc:  # the stream failed before the request went out
            return str(q.get(timeout=timeout_s)[1] if not q.empty() else exc)
        while True:
            result, error = q.get(timeout=timeout_s)
            if error is not None:
                return str(error)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "ok"
    except queue.Empty:
        return "no answer"
    finally:
        if close_channel:
            c._channel.close()  # the stream is cancelled, not finished (a half-close never reaches the server)
        else:
            c.close()


def test_sigterm_after_200_client_closed_streams_is_a_clean_fast_stop(tmp_path: Path):
    server = _server(tmp_path, exit_timeout_s=30)
    seen: dict[str, float] = {}

    def scenario(s: TritonServer) -> None:
        def run() -> None:
            outcomes = [one_stream(s.url_grpc, close_channel=True) for _ in range(200)]
            assert outcomes == ["ok"] * 200, [o for o in outcomes if o != "ok"][:3]
            seen["sigterm"] = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=run, daemon=True).start()

    assert serve_forever(server, on_ready=scenario) == 0, server.last_lines()
    assert "sigterm" in seen  # every stream was read to its end before the SIGTERM
    log = "\n".join(server.lines)
    # stopped by the drain, not by waiting out the exit timeout (Triton's own "Exit timeout expired", or our kill)
    assert "Exit timeout expired" not in log and not server.forced_exit
    assert server.leftover_processes() == [] and server.leftover_shm() == []


def http_generate_outcome(url: str) -> str:
    body = json.dumps({"text_input": "Once upon", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://{url}/v2/models/{MODEL}/generate", data=body)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return f"{e.code}{' retry-after' if e.headers.get('Retry-After') else ''}"
    except urllib.error.URLError as e:
        return type(e.reason).__name__
    except (OSError, http.client.HTTPException) as e:  # a reset or a closed connection mid-answer
        return type(e).__name__


def test_clients_see_unavailable_and_503_through_the_stop_never_unknown_model_or_a_reset(tmp_path: Path):
    server = _server(tmp_path, exit_timeout_s=10)
    grpc_out: list[tuple[float, str]] = []
    http_out: list[tuple[float, str]] = []
    t_sig: list[float] = []
    t_gone: list[float] = []  # when tritonserver exited
    done = threading.Event()

    def scenario(s: TritonServer) -> None:
        assert s.proc is not None
        proc = s.proc

        def grpc_client() -> None:
            while not done.is_set():
                t = time.monotonic()
                grpc_out.append((t, one_stream(s.url_grpc, close_channel=False, timeout_s=10)))

        def http_client() -> None:
            while not done.is_set():
                t = time.monotonic()
                http_out.append((t, http_generate_outcome(s.url_http)))

        def watch_exit() -> None:
            while proc.poll() is None:
                time.sleep(0.005)
            t_gone.append(time.monotonic())

        threads = [threading.Thread(target=f, daemon=True) for f in (grpc_client, grpc_client, http_client,
                                                                      http_client, watch_exit)]  # fmt: skip

        def run() -> None:
            for t in threads:
                t.start()
            time.sleep(1.0)
            t_sig.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=run, daemon=True).start()

    assert serve_forever(server, on_ready=scenario) == 0, server.last_lines()
    time.sleep(0.5)
    done.set()
    sig, gone = t_sig[0], t_gone[0]
    assert any(o == "ok" for t, o in grpc_out if t < sig) and any(o == "200" for t, o in http_out if t < sig)
    after = [o for t, o in grpc_out if t > sig]
    assert after, "no gRPC request during the stop"
    print(
        "gRPC after the signal:", sorted({o[:80] for o in after}), "HTTP:", sorted({o for t, o in http_out})
    )
    # transport-level ends once tritonserver is gone: gRPC UNAVAILABLE, or tritonclient's own word for a stream
    # whose connection closed under it
    transport = ("StatusCode.UNAVAILABLE", "The stream is no longer in valid state")
    bad = [o for o in after if o != "ok" and "shutting down" not in o and not any(t in o for t in transport)]
    assert not bad, bad[:5]
    assert not [o for o in after if "unknown model" in o or "not found" in o.lower()]
    while_alive = [o for t, o in http_out if sig < t < gone]
    assert while_alive, "no HTTP request while the server stopped"
    assert all(o in ("200", "503 retry-after") for o in while_alive), sorted(set(while_alive))
    assert server.leftover_processes() == [] and server.leftover_shm() == []


def test_readiness_is_503_from_the_drain_on_while_work_in_flight_finishes(tmp_path: Path):
    server = _server(tmp_path, exit_timeout_s=5)
    server.start()
    try:
        server.wait_ready()
        ready_url = f"http://{server.url_http}/v2/health/ready"
        assert urllib.request.urlopen(ready_url, timeout=10).status == 200
        result: list[str] = []
        busy = threading.Thread(
            target=lambda: result.append(
                one_stream(server.url_grpc, close_channel=False, max_tokens=100_000, timeout_s=120)
            ),
            daemon=True,
        )
        busy.start()
        while not server.active_requests():
            time.sleep(0.05)
        statuses: set[str] = set()
        real_active = server.active_requests

        def probe_then_count() -> float | None:
            # the drain polls this after it started (drain file written, readiness switched): ask readiness here,
            # while the request is in flight, instead of hoping a sampling loop falls into the drain's window
            try:
                urllib.request.urlopen(ready_url, timeout=10)
                statuses.add("200")
            except urllib.error.HTTPError as e:
                statuses.add(f"{e.code} {e.headers.get('Retry-After')}")
            return real_active()

        server.active_requests = probe_then_count  # type: ignore[method-assign]
        stopper = threading.Thread(target=server.stop, daemon=True)
        stopper.start()
        stopper.join(60)
        busy.join(60)
        assert "503 1" in statuses and "200" not in statuses, (statuses, result, list(server.lines)[-15:])
        assert result and "did not finish within the exit timeout" in result[0], result
    finally:
        server.stop()
    assert server.drained and server.stopped_after_drain
    assert server.leftover_processes() == [] and server.leftover_shm() == []
