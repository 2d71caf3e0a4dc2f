"""`kiln serve --dynamo` SIGKILLed three times in a row: the frontend and the workers die with it (before: they
lived on with parent 1 and the port kept answering), the discovery folder goes, the port is free."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from llmkiln.serve.processes import alive
from llmkiln.serve.server import free_ports, port_free
from tests.proc_tree import descendants

from .conftest import MODEL, launch_processes_alive

pytestmark = pytest.mark.slow


def wait_until(what, timeout_s: float, every_s: float = 0.05) -> bool:
    """Poll `what()` until truthy; a bound on waiting, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(every_s)
    return bool(what())


@contextlib.contextmanager
def ready_launch(engine: Path, args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`kiln serve ENGINE --dynamo ARGS` until it printed ready; killed after the block if still running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--dynamo", "--grace-period", "1", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        ready = lambda: any(line.startswith("ready") for line in lines) or proc.poll() is not None  # noqa: E731
        assert wait_until(ready, 240, 0.2) and proc.poll() is None, "".join(lines)[-3000:]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)


def kill_and_check(engine: Path, state: Path, env: dict[str, str]) -> None:
    port = free_ports(1)[0]
    args = ["--workers", "2", "--http-port", str(port), "--state-dir", str(state)]
    with ready_launch(engine, args, env) as proc:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert r.usage.completion_tokens == 4
        started = descendants(proc.pid)
        launch = launch_processes_alive(state / "discovery")
        assert len(launch) == 3 and set(launch) <= started
        proc.kill()
        proc.wait(timeout=30)
        survivors = lambda: [p for p in started if alive(p)]  # noqa: E731
        assert wait_until(lambda: not survivors(), 30), survivors()
        assert launch_processes_alive(state / "discovery") == []
        assert wait_until(lambda: not (state / "discovery").exists(), 15)
        # a killed process's leader can read as a zombie while its other threads still close its sockets
        assert wait_until(lambda: port_free("127.0.0.1", port), 15)
        cgroups = [p for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                   for p in root.glob(f"**/llmkiln-dynamo-{proc.pid}-*")]  # fmt: skip
        assert cgroups == []


@pytest.mark.parametrize("cgroup", ["auto", "off"])
def test_sigkilled_kiln_serve_dynamo_three_times_leaves_nothing(stories_engine, tmp_path, cgroup):
    env = {**os.environ, **({"LLMKILN_CGROUP": "0"} if cgroup == "off" else {})}  # off: process groups only
    for round_ in range(3):
        kill_and_check(stories_engine, tmp_path / f"state-{round_}", env)


def test_sigkilled_kiln_serve_dynamo_leaves_no_temp_state_folder(stories_engine, tmp_path):
    """Without --state-dir the launch's state (discovery, logs) is a temp folder of its own: the reaper removes it
    when the launcher is SIGKILLed (a failed launch keeps it: the error names its logs)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    args = ["--workers", "1", "--http-port", str(free_ports(1)[0])]
    with ready_launch(stories_engine, args, {**os.environ, "TMPDIR": str(tmpdir)}) as proc:
        [state] = tmpdir.glob("llmkiln-dynamo-*")
        assert (state / "logs").is_dir()
        proc.kill()
        proc.wait(timeout=30)
        assert wait_until(lambda: not state.exists(), 30), sorted(state.rglob("*"))


def test_a_refused_dynamo_launch_leaves_no_temp_state_folder(stories_engine, tmp_path):
    """A launch refused before it started anything (its HTTP port is taken) exits 2 and leaves nothing in $TMPDIR."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "llmkiln.cli.main", "serve", str(stories_engine), "--dynamo", "--workers", "1",
             "--http-port", str(busy)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmpdir)},
        )  # fmt: skip
    assert r.returncode == 2 and "already in use" in r.stderr, r.stderr
    assert list(tmpdir.iterdir()) == []
