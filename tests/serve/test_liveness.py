"""Liveness: a stuck or stopped stub (or an engine whose step never returns) is noticed within
serve.stall_timeout_s; the server reports it, kills what is stuck and the requests end with an error."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from llmkiln.host.engine_host import EngineHost
from llmkiln.runtime.request import SamplingParams
from llmkiln.serve.heartbeat import Beat
from llmkiln.serve.server import free_ports
from tests.proc_tree import descendants as _descendants
from tests.runtime.test_engine_fake import _prompt, make_engine

from .test_cli_serve import _cmd


def test_beat_problems():
    now = 1000.0
    assert Beat(now - 1, now - 1, 2, 0.5).problem(now, 5) is None
    assert "no heartbeat for 9 s" in (Beat(now - 9, now - 9, 0, 0).problem(now, 5) or "")
    assert "event loop has not run" in (Beat(now, now - 9, 1, 0).problem(now, 5) or "")
    assert Beat(now, now - 9, 0, 0).problem(now, 5) is None  # an idle loop is not stuck
    assert "no step for 9 s" in (Beat(now, now, 3, 9.0).problem(now, 5) or "")


def test_an_engine_whose_step_never_returns_is_not_live():
    eng = make_engine(max_batch_size=1)
    release = threading.Event()
    real = eng.runner.execute

    def execute(plan, trace=None):
        release.wait(30)
        return real(plan, trace)

    eng.runner.execute = execute
    host = EngineHost(eng.start(), stall_timeout_s=0.2)
    host.warmup_result = host.warmup()  # no recipe: nothing to warm, ready
    assert host.health().ready and host.health().live
    h = eng.submit(_prompt(1), SamplingParams(max_tokens=2))
    while eng.stalled_for_s <= 0.3:
        time.sleep(0.01)
    health = host.health()
    assert not health.ready and not health.live and health.healthy
    assert "no engine step for" in (health.reason or "")
    assert host.refresh_metrics().values["engine_stalled_seconds"] > 0.2
    release.set()
    h.result(timeout=30)
    assert eng.stalled_for_s == 0.0 and host.health().live
    eng.shutdown()


@pytest.mark.slow
def test_a_stopped_stub_fails_its_requests_and_kiln_serve_exits_1(
    engine_factory, stories_dir, tmp_path: Path
):
    recipe = tmp_path / "stories-stall.yaml"
    recipe.write_text(
        f"name: stories-stall\nextends: stories-fp32\nmodel:\n  path: {stories_dir}\nserve:\n  stall_timeout_s: 3\n"
    )
    engine = engine_factory(str(recipe))
    ports = free_ports(3)
    err = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--exit-timeout", "5"],
        stdout=subprocess.PIPE, stderr=err, text=True,
    )  # fmt: skip
    stub = None
    try:
        deadline = time.monotonic() + 300
        while "ready: model" not in (tmp_path / "stderr").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[
                -3000:
            ]
            time.sleep(0.2)
        stubs = [p for p in _descendants(proc.pid) if b"triton_python_backend_stub" in _cmd(p)]
        assert stubs
        stub = stubs[0]
        os.kill(stub, signal.SIGSTOP)  # the stub can run nothing now: not even a thread
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = [
            grpcclient.InferInput("text_input", [1, 1], "BYTES"),
            grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.array([[b"Once upon a time"]], dtype=object))
        inputs[1].set_data_from_numpy(np.array([[8]], dtype=np.int32))
        client.async_stream_infer("llmkiln", inputs)
        _, error = results.get(timeout=120)  # the request ends with an error: it does not hang
        assert error is not None
        client.close()
        assert proc.wait(timeout=120) == 1
    finally:
        if stub is not None:
            with_suppress_kill(stub)
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "stderr").read_text()
    assert "wrote no heartbeat" in text and "the model is stuck" in text, text[-3000:]


def with_suppress_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
