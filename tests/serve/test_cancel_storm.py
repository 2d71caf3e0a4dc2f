"""Cancel storms: gRPC clients that end their streams right after the first response cannot take the server down.

Triton 2.51's gRPC frontend crashes when stream contexts are cancelled with requests in flight (SIGSEGV in
ModelStreamInferHandler::Process, heap corruption, GRPC_CALL_ERROR_TOO_MANY_OPERATIONS aborts; reproduced with a
20-line model: `python scripts/triton_probes.py cancel-storm stop careful`). `kiln serve` puts llmkiln's gRPC
front before it (llmkiln.serve.grpc_front): Triton never sees a cancelled stream, the model gets in-band cancels.
Without the front this storm crashed tritonserver (stories-fp32, 16 clients, 64 tokens: after 600 and 2,400
streams); with it: the server stays up, the cancels reach the runtime, and memory and descriptors settle back.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from llmkiln.serve.repository import spec_from_engine
from llmkiln.serve.server import TritonServer

from .client import cancel_storm, metric, scrape, stream_many
from .conftest import engine_server

pytestmark = pytest.mark.slow

STREAMS = 500  # per pattern
CLIENTS = 16
MAX_TOKENS = 256  # still generating when the cancel comes (without the front: dead after 167 streams)
RSS_MARGIN = 0.15  # after the storm, tritonserver + stub RSS within 15% (+ 16 MiB) of before it
RSS_SLACK_BYTES = 16 << 20
FD_MARGIN = 8  # open descriptors of tritonserver + stub within 8 of before it


@pytest.fixture(scope="module")
def served(engine_factory, tmp_path_factory: pytest.TempPathFactory):
    engine = engine_factory("stories-fp32")
    tmp = tmp_path_factory.mktemp("storm")
    server = engine_server(spec_from_engine(engine), tmp, grpc_front=True)  # as `kiln serve` runs it
    server.start()
    server.wait_ready(300)
    yield server
    server.stop()


def _footprint(server: TritonServer) -> tuple[int, int]:
    """(RSS bytes, open descriptors) of tritonserver and its stubs."""
    assert server.proc is not None
    rss = fds = 0
    for pid in (server.proc.pid, *server.stub_pids):
        status = Path(f"/proc/{pid}/status").read_text()
        rss += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
        fds += len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds


def _settle(server: TritonServer, timeout_s: float = 120) -> dict[str, float]:
    """Wait until nothing is in flight: no request in the model, no relayed stream left in the front."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = scrape(server.url_metrics)
        front = server.grpc_front
        idle = metric(values, "llmkiln_requests_active") == 0 and metric(values, "llmkiln_active_slots") == 0
        if idle and (front is None or front.upstream_streams == 0):
            time.sleep(1.5)  # the engine gauges refresh every second
            return scrape(server.url_metrics)
        assert time.monotonic() < deadline, f"still busy after {timeout_s} s: {values}"
        time.sleep(0.25)


def _alive(server: TritonServer) -> bool:
    return server.proc is not None and server.proc.poll() is None


def test_cancel_storm_in_both_patterns_leaves_the_server_healthy(served: TritonServer):
    model = served.model  # type: ignore[attr-defined]
    for pattern in ("stop", "close"):  # warm the allocators and gRPC's pools before the baseline
        cancel_storm(served.url_grpc, model, pattern, 50, CLIENTS, MAX_TOKENS, lambda: _alive(served))
    before = _settle(served)
    rss0, fds0 = _footprint(served)

    for pattern in ("stop", "close"):
        n = cancel_storm(
            served.url_grpc, model, pattern, STREAMS, CLIENTS, MAX_TOKENS, lambda: _alive(served)
        )
        assert _alive(served), f"tritonserver died after {n} '{pattern}' streams:\n{served.last_lines(20)}"
        assert n == STREAMS

    after = _settle(served)
    cancelled = metric(after, "llmkiln_requests_cancelled_total") - metric(
        before, "llmkiln_requests_cancelled_total"
    )
    assert cancelled > 0, "no cancel reached the runtime"
    assert metric(after, "llmkiln_requests_failed_total") == 0
    assert metric(after, "llmkiln_kv_blocks_pinned") == 0
    with urllib.request.urlopen(f"http://{served.url_http}/v2/health/ready", timeout=5) as r:
        assert r.status == 200
    [ok] = stream_many(
        served.url_grpc, model, [{"prompt": "Once upon a time", "max_tokens": 8, "stream": True}]
    )
    assert ok.error is None and ok.text.strip()

    assert served.log_path is not None
    assert "after the final one dropped" not in served.log_path.read_text()  # one final response per request
    rss1, fds1 = _footprint(served)
    assert fds1 <= fds0 + FD_MARGIN, f"open descriptors {fds0} -> {fds1}"
    assert rss1 <= rss0 * (1 + RSS_MARGIN) + RSS_SLACK_BYTES, f"RSS {rss0 >> 20} -> {rss1 >> 20} MiB"
    print(f"cancel storm: {2 * STREAMS} streams, {cancelled:.0f} cancelled in the runtime; "
          f"RSS {rss0 >> 20} -> {rss1 >> 20} MiB, descriptors {fds0} -> {fds1}")  # fmt: skip
