"""Liveness under Dynamo: a worker that stops answering (SIGSTOP) is killed by the launcher's supervision within
serve.stall_timeout_s; its stream moves to the other worker and ends whole, and the worker is restarted."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace

import pytest

from .conftest import MODEL, client
from .test_faults import LONG, PROMPT, busy_worker, wait_until

pytestmark = pytest.mark.slow


def test_a_stopped_worker_is_killed_and_its_stream_migrates(launch, stories_engine):
    launcher = launch(stories_engine, workers=2, faulty=True, migration_limit=3)
    launcher.spec = replace(launcher.spec, stall_timeout_s=3.0)
    done = threading.Event()

    def supervise() -> None:  # what serve_forever does
        while not done.wait(0.5):
            launcher.supervise_once()

    sup = threading.Thread(target=supervise, daemon=True)
    sup.start()
    try:
        c = client(launcher, timeout_s=120)
        stream = c.completions.create(model=MODEL, prompt=PROMPT, stream=True, **LONG)
        received, stopped, last = 0, None, None
        for chunk in stream:
            last = chunk
            received += 1
            if received == 3:
                stopped = busy_worker(launcher)
                pid = launcher.workers[stopped].pid
                assert pid is not None
                os.killpg(pid, signal.SIGSTOP)  # every thread of it: the status port stops answering too
        assert stopped is not None
        assert last is not None and last.choices[0].finish_reason == "length" and received >= 250  # migrated
        proc = launcher.workers[stopped]
        assert any("is stuck (its status port does not answer" in ln for ln in proc.lines), list(proc.lines)[
            -5:
        ]
        wait_until(lambda: proc.restarts == 1 and proc.alive(), timeout_s=120)
        wait_until(lambda: launcher.ready_instances() == 2, timeout_s=180)
    finally:
        done.set()
        sup.join(10)


def test_a_stopped_frontend_is_killed_and_the_launch_fails(launch, stories_engine):
    """SIGSTOP of dynamo.frontend: its /health stops answering; within serve.stall_timeout_s the launcher kills it
    and the launch fails (kiln serve exits 1 and stops the rest) instead of staying up behind a dead frontend."""
    import time

    from llmkiln.dynamo.launcher import LaunchFailed

    launcher = launch(stories_engine, workers=1)
    launcher.spec = replace(launcher.spec, stall_timeout_s=3.0)
    launcher.supervise_once()  # a live frontend: nothing happens
    pid = launcher.frontend.pid
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(LaunchFailed, match="frontend.* hung"):
        while time.monotonic() - t0 < 60:  # a hang guard; the bound is stall_timeout_s + a probe
            launcher.supervise_once()
            time.sleep(0.5)
    assert not launcher.frontend.alive()
    assert any("is stuck (its /health has not answered" in ln for ln in launcher.frontend.lines)
