"""`kiln serve`: ready after warmup, answers, and Ctrl-C (SIGINT) stops everything it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmkiln.serve.server import free_ports

from .client import http_generate

pytestmark = pytest.mark.slow


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def test_kiln_serve_until_sigint(engine_factory, tmp_path: Path):
    engine = engine_factory("stories-fp32")
    ports = free_ports(3)
    err = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--exit-timeout", "10"],
        stdout=subprocess.PIPE, stderr=err, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while "ready: model 'llmkiln'" not in (tmp_path / "stderr").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[
                -3000:
            ]
            time.sleep(0.2)
        log = (tmp_path / "stderr").read_text()
        assert f"http://127.0.0.1:{ports[0]}" in log and "warmup done: 1 requests" in log
        status, body = http_generate(
            f"127.0.0.1:{ports[0]}", "llmkiln", {"text_input": "Once upon", "max_tokens": 8}
        )
        assert status == 200 and body["text_output"].startswith("Once upon")
        started = _descendants(proc.pid)
        cmdlines = " ".join(Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in started)
        prefix = re.search(r"shm-region-prefix-name=(\S+?)\x00", cmdlines).group(1)
        assert list(Path("/dev/shm").glob(prefix + "*"))
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped (clean shutdown)" in (tmp_path / "stderr").read_text()
    assert [p for p in started if Path(f"/proc/{p}").exists()] == []
    assert list(Path("/dev/shm").glob(prefix + "*")) == []
