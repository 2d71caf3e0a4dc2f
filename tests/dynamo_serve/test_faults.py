"""Faults on loopback: a scheduler-thread exception, a killed worker, a drain, stale discovery state."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from .conftest import MODEL, client

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"
LONG = {"max_tokens": 300, "extra_body": {"ignore_eos": True}}


def wait_until(what, timeout_s: float = 60.0, every_s: float = 0.1):
    """Poll `what()` until it is truthy (a bound on waiting, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def worker_health(launcher, index: int) -> dict:
    """The worker's /health answer on its status port (status 'ready' when serving; an error status or
    'unreachable' otherwise)."""
    try:
        with urllib.request.urlopen(f"{launcher.spec.status_url(index)}/health", timeout=5) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        return {**(data if isinstance(data, dict) else {}), "http_status": exc.code}
    except (urllib.error.URLError, OSError) as exc:
        return {"status": "unreachable", "error": str(exc)}


def busy_worker(launcher) -> int:
    """Index of the worker that runs the one request in flight."""
    return (
        wait_until(
            lambda: next(
                (
                    i + 1
                    for i in range(launcher.spec.workers)
                    if launcher.worker_metrics(i)["num_running"] > 0
                ),
                None,
            )
        )
        - 1
    )


def test_scheduler_exception_fails_requests_and_worker_leaves(launch, stories_engine):
    """The worker's scheduler thread raises mid-stream: the client gets an error at once (migration off, so the
    error is not hidden by a retry), the worker reports unhealthy, stops itself and unregisters; the other
    worker serves what comes next."""
    launcher = launch(stories_engine, workers=2, faulty=True, migration_limit=0)
    c = client(launcher, timeout_s=60)
    stream = c.completions.create(model=MODEL, prompt=PROMPT, stream=True, **LONG)
    received = 0
    with pytest.raises(openai.APIError):
        for _ in stream:
            received += 1
            if received == 3:
                broken = busy_worker(launcher)
                (launcher.spec.state_dir / f"fault-{launcher.spec.status_ports[broken]}").touch()
    assert received < 300
    health = wait_until(
        lambda: worker_health(launcher, broken)["status"] != "ready" and worker_health(launcher, broken)
    )
    assert health["status"] in ("notready", "unreachable")
    wait_until(lambda: not launcher.workers[broken].alive())  # it stopped itself (no supervisor in tests)
    wait_until(lambda: launcher.ready_instances() == 1)
    log = launcher.spec.log_dir / f"worker-{broken}.log"
    assert "injected scheduler fault" in log.read_text()
    for _ in range(3):
        r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert r.usage.completion_tokens == 4


def test_killed_worker_requests_move_to_a_live_one(launch, stories_engine, tmp_path):
    """SIGKILL the worker that streams a request: the frontend migrates it (--migration-limit) and the client
    gets every token. Then the launch is killed outright (stale discovery files stay behind) and a new launch
    in the same folder wipes them: it sees only its own workers."""
    state = tmp_path / "state"
    launcher = launch(stories_engine, workers=2, faulty=True, migration_limit=3, state_dir=state)
    c = client(launcher, timeout_s=120)
    stream = c.completions.create(model=MODEL, prompt=PROMPT, stream=True, **LONG)
    received, text, killed = 0, [], None
    for chunk in stream:
        received += 1
        text.append(chunk.choices[0].text if chunk.choices else "")
        if received == 3:
            killed = busy_worker(launcher)
            launcher.workers[killed].signal(signal.SIGKILL)
    assert killed is not None and not launcher.workers[killed].alive()
    assert chunk.choices[0].finish_reason == "length"
    assert received >= 250  # every token arrived (a chunk may carry more than one)
    r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert r.usage.completion_tokens == 4

    # Kill what is left without any cleanup: the dead workers' keys stay in the discovery folder.
    for proc in launcher.procs:
        proc.signal(signal.SIGKILL)
        proc.wait(10)
    stale = sorted(p.name for p in launcher.spec.discovery_dir.rglob("*") if p.is_file())
    assert any("generate" in name for name in stale)
    fresh = launch(stories_engine, workers=1, state_dir=state)
    assert fresh.ready_instances() == 1
    now = {p.name for p in fresh.spec.discovery_dir.rglob("*") if p.is_file()}
    assert not now & set(stale)
    for _ in range(3):  # nothing is routed to a ghost
        assert (
            client(fresh).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).usage.completion_tokens
            == 4
        )


def test_drain_finishes_requests_in_flight_then_exits(launch, stories_engine):
    """SIGTERM a worker while it streams: it unregisters, finishes the request (the drain ends as soon as the
    worker is quiescent), and exits by itself."""
    launcher = launch(stories_engine, workers=2, faulty=True, migration_limit=0, drain_timeout_s=120.0)
    c = client(launcher, timeout_s=120)
    stream = c.completions.create(
        model=MODEL, prompt=PROMPT, stream=True, max_tokens=400, extra_body={"ignore_eos": True}
    )
    received, stopped, chunk = 0, None, None
    for chunk in stream:  # noqa: B007 (the last chunk is checked after the loop)
        received += 1
        if received == 3:
            stopped = busy_worker(launcher)
            launcher.workers[stopped].signal(signal.SIGTERM)
    assert chunk.choices[0].finish_reason == "length" and received >= 300
    assert launcher.workers[stopped].wait(60)
    assert launcher.workers[stopped].returncode() == 0
    log = (launcher.spec.log_dir / f"worker-{stopped}.log").read_text()
    assert "Grace period" in log and "engine stopped (0 request(s) cancelled at shutdown)" in log
    assert launcher.ready_instances() == 1


def test_cli_serve_dynamo_stops_everything_on_sigterm(stories_engine, tmp_path):
    """`kiln serve ENGINE --dynamo`: ready, answers, and SIGTERM leaves no process and no discovery file."""
    import subprocess
    import sys

    from llmkiln.serve.server import free_ports

    from .conftest import launch_processes_alive

    port = free_ports(1)[0]
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmkiln.cli.main",
            "serve",
            str(stories_engine),
            "--dynamo",
            "--workers",
            "2",
            "--http-port",
            str(port),
            "--grace-period",
            "1",
            "--state-dir",
            str(state),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(line.startswith("ready") for line in lines) or proc.poll() is not None, 180)
        assert proc.poll() is None, "".join(lines)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert r.usage.completion_tokens == 4
        assert len(launch_processes_alive(state / "discovery")) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    assert launch_processes_alive(state / "discovery") == []
    assert not (state / "discovery").exists()
    assert any(line.startswith("stopped") for line in lines)
