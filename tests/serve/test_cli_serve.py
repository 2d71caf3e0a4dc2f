"""`kiln serve`: ready after warmup, answers, and Ctrl-C (SIGINT) stops everything it started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmkiln.errors import BadInput
from llmkiln.serve.backend_env import assemble_backend_dir, server_env
from llmkiln.serve.processes import LLMKILN_SHM_PREFIX, SHM_DIR, remove_dead_workdirs, remove_orphan_shm
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports, port_free
from tests.proc_tree import descendants as _descendants

from .client import http_generate

pytestmark = pytest.mark.slow


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
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped (clean shutdown)" in (tmp_path / "stderr").read_text()
    assert [p for p in started if Path(f"/proc/{p}").exists()] == []
    assert list(Path("/dev/shm").glob(prefix + "*")) == []


def _start_kiln_serve(engine: Path, tmp_path: Path, ports: list[int], *extra: str) -> subprocess.Popen:
    err = (tmp_path / "stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--exit-timeout", "5", *extra],
        stdout=subprocess.PIPE, stderr=err, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while "ready: model 'llmkiln'" not in (tmp_path / "stderr").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-3000:]
        time.sleep(0.2)
    return proc


def _workdirs(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"llmkiln-serve-{pid}-*"))


def test_kiln_serve_exits_1_with_the_cause_when_the_stub_dies(engine_factory, tmp_path: Path):
    engine = engine_factory("stories-fp32")
    ports = free_ports(3)
    proc = _start_kiln_serve(engine, tmp_path, ports)
    try:
        assert _workdirs(proc.pid)
        stubs = [p for p in _descendants(proc.pid) if b"triton_python_backend_stub" in _cmd(p)]
        assert stubs
        os.kill(stubs[0], signal.SIGKILL)
        assert proc.wait(timeout=30) == 1  # a hang guard: kiln serve notices the dead stub and exits
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "stderr").read_text()
    assert "python backend stub" in err and "died while serving" in err and "Last lines" in err
    kept = Path(re.search(r"full log: (\S+\.log)", err).group(1))
    assert kept.is_file() and "Started GRPCInferenceService" in kept.read_text()
    assert _workdirs(proc.pid) == []  # the temp folder is gone, the log kept elsewhere
    assert port_free("127.0.0.1", ports[0]) and port_free("127.0.0.1", ports[1])


def test_sigkilled_kiln_serve_takes_tritonserver_with_it(engine_factory, tmp_path: Path):
    engine = engine_factory("stories-fp32")
    ports = free_ports(3)
    proc = _start_kiln_serve(engine, tmp_path, ports)
    started = _descendants(proc.pid)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while [p for p in started if Path(f"/proc/{p}").exists() and b"tritonserver" in _cmd(p)]:
        assert time.monotonic() < deadline, "tritonserver outlived its killed parent"
        time.sleep(0.1)
    # its python stubs notice the dead parent a moment later; they inherited the listening sockets
    deadline = time.monotonic() + 30
    while [p for p in started if Path(f"/proc/{p}").exists() and _cmd(p)]:
        assert time.monotonic() < deadline, f"processes outlived the killed launcher: {started}"
        time.sleep(0.1)
    assert port_free("127.0.0.1", ports[0]) and port_free("127.0.0.1", ports[1])
    # its reaper removes the killed launcher's temp folder (and the next start would: remove_dead_workdirs)
    deadline = time.monotonic() + 15
    while _workdirs(proc.pid):
        assert time.monotonic() < deadline, _workdirs(proc.pid)
        time.sleep(0.1)
    assert remove_dead_workdirs() is not None


def test_a_stale_server_on_the_port_is_named(tmp_path: Path):
    # a server started the way an older launcher did (no parent-death signal), whose parent is gone
    from .conftest import fake_repository

    fake_repository(tmp_path)
    ports = free_ports(3)
    cfg = ServerConfig(tmp_path / "repo", http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                       workdir=tmp_path / "work")  # fmt: skip
    orphan = TritonServer(cfg)
    backend = assemble_backend_dir(tmp_path / "work" / "backends")
    subprocess.run(["setsid", "-f", *orphan.command(backend)], env=server_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not orphan.is_ready():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        [pid] = [p for p in orphan.leftover_processes() if b"tritonserver" in _cmd(p).split(b"\0")[0]]
        with pytest.raises(BadInput) as exc:
            TritonServer(ServerConfig(tmp_path / "repo", http_port=ports[0], grpc_port=free_ports(1)[0],
                                      metrics_port=free_ports(1)[0], workdir=tmp_path / "w2")).start()  # fmt: skip
        msg = str(exc.value)
        assert f"tritonserver pid {pid}" in msg and "stale server left by a killed `kiln serve`" in msg
        assert f"kill {pid}" in msg
    finally:
        for p in orphan.leftover_processes():
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while orphan.leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert remove_orphan_shm() is not None and orphan.leftover_shm() == []


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_failed_start_leaves_no_temp_folder(engine_factory, tmp_path: Path):
    engine = engine_factory("stories-fp32")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        grpc, metrics = free_ports(2)
        tmpdir = tmp_path / "tmp"  # the launcher's temp folders go here (TMPDIR)
        tmpdir.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--http-port", str(busy),
             "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmpdir)},
        )  # fmt: skip
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and f"--http-port {busy}" in err and "already in use" in err, err
    assert "Traceback" not in err
    assert list(tmpdir.iterdir()) == []


def test_a_live_servers_stub_region_is_kept_by_another_servers_start(tmp_path: Path):
    # The stub's region names are the server's prefix plus a uuid (more hex digits): the orphan sweep must judge
    # them by the server's prefix, which the live tritonserver's command line carries, not by the longer name.
    prefix = f"{LLMKILN_SHM_PREFIX}a1b2c3d4"
    live = SHM_DIR / f"{prefix}67c4f4a8-c61d-4e35-afaf-f2df906f460b"
    dead = SHM_DIR / f"{LLMKILN_SHM_PREFIX}0badc0de9f8e7d6c-0000-4e35-afaf-f2df906f460b"
    # a process whose command line carries the prefix, as a running tritonserver's does
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", f"shm-region-prefix-name={prefix}"]
    )
    try:
        deadline = time.monotonic() + 10
        # exec'd: its command line is its own, not this process's
        while prefix.encode() not in _cmd(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        live.write_bytes(b"x")
        dead.write_bytes(b"x")
        removed = remove_orphan_shm()
        assert dead in removed and not dead.exists()
        assert live.exists(), "a live server's stub region was removed"
    finally:
        proc.kill()
        proc.wait()
        live.unlink(missing_ok=True)
        dead.unlink(missing_ok=True)
