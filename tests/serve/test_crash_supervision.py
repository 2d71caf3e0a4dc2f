"""Crash supervision by the kernel, not by threads: whatever `kiln serve` started dies with it.

- A python stub whose threads cannot run (SIGSTOP: the stand-in for "every thread in a futex wait") dies with
  tritonserver: its guard process waits on a pidfd, not on the stub's GIL.
- `kiln serve` SIGKILLed three times in a row leaves no process, no /dev/shm region, no temp folder, no cgroup,
  and its ports free — with the launch's cgroup (where cgroup v2 is writable) and with process groups only.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from llmkiln.serve.processes import alive, processes_with
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports, port_free
from tests.proc_tree import descendants, in_cgroup

from .client import http_generate
from .conftest import fake_repository

pytestmark = pytest.mark.slow


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def wait_until(what, timeout_s: float, every_s: float = 0.05) -> bool:
    """Poll `what()` until truthy; a bound on waiting, not a timing assertion."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(every_s)
    return bool(what())


def llmkiln_cgroups(launcher_pid: int) -> list[Path]:
    found = []
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        found += [p for p in root.glob(f"**/llmkiln-*-{launcher_pid}-*") if p.is_dir()]
    return found


def test_a_stub_that_cannot_run_dies_with_tritonserver(tmp_path: Path):
    fake_repository(tmp_path)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        ServerConfig(tmp_path / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics,
                     workdir=tmp_path / "work")
    )  # fmt: skip
    server.start()
    try:
        server.wait_ready()
        [stub] = server.stub_pids
        assert server.proc is not None
        os.kill(stub, signal.SIGSTOP)  # none of its threads runs again: no parent-watch thread either
        os.kill(server.proc.pid, signal.SIGKILL)  # what the kernel does to it when kiln serve dies
        # before: the stopped stub stayed (parent 1) holding its /dev/shm region and sockets
        assert wait_until(lambda: not alive(stub), 15), f"stub {stub} outlived tritonserver"
    finally:
        server.stop()
    assert server.leftover_processes() == [] and server.leftover_shm() == []


def start_kiln_serve(engine: Path, err_path: Path, ports: list[int], env: dict[str, str]) -> subprocess.Popen:
    err = err_path.open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmkiln.cli.main", "serve", str(engine), "--http-port", str(ports[0]),
         "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--exit-timeout", "5"],
        stdout=subprocess.DEVNULL, stderr=err, env=env,
    )  # fmt: skip
    ok = wait_until(
        lambda: "ready: model 'llmkiln'" in err_path.read_text() or proc.poll() is not None, 300, 0.2
    )
    assert ok and proc.poll() is None, err_path.read_text()[-3000:]
    return proc


def kill_and_check(engine: Path, err_path: Path, env: dict[str, str], cgroup: str) -> None:
    ports = free_ports(3)
    proc = start_kiln_serve(engine, err_path, ports, env)
    try:
        status, body = http_generate(
            f"127.0.0.1:{ports[0]}", "llmkiln", {"text_input": "Once", "max_tokens": 4}
        )
        assert status == 200, body
        started = descendants(proc.pid)
        names = " | ".join(cmdline(p) for p in started)
        assert "tritonserver" in names and "triton_python_backend_stub" in names
        prefix = re.search(r"shm-region-prefix-name=(\S+)", names).group(1)
        assert list(Path("/dev/shm").glob(prefix + "*"))
        if cgroup == "off":
            assert llmkiln_cgroups(proc.pid) == []
        proc.kill()
        proc.wait(timeout=30)
        survivors = lambda: [(p, cmdline(p)) for p in started if alive(p)]  # noqa: E731
        assert wait_until(lambda: not survivors(), 30), survivors()
        assert processes_with(prefix) == []
        # removed right after the processes are gone (before: only by the next `kiln serve`)
        assert wait_until(lambda: not list(Path("/dev/shm").glob(prefix + "*")), 15), prefix
        workdirs = lambda: list(Path(tempfile.gettempdir()).glob(f"llmkiln-serve-{proc.pid}-*"))  # noqa: E731
        assert wait_until(lambda: not workdirs(), 15), workdirs()
        assert wait_until(lambda: llmkiln_cgroups(proc.pid) == [], 15)
        # a killed process's leader can read as a zombie while its other threads still close its sockets
        assert wait_until(lambda: all(port_free("127.0.0.1", p) for p in ports), 15)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("cgroup", ["auto", "off"])
def test_sigkilled_kiln_serve_three_times_leaves_nothing(engine_factory, tmp_path: Path, cgroup: str):
    engine = engine_factory("stories-fp32")
    env = {**os.environ, **({"LLMKILN_CGROUP": "0"} if cgroup == "off" else {})}  # off: process groups only
    for round_ in range(3):
        kill_and_check(engine, tmp_path / f"stderr-{round_}", env, cgroup)


def test_the_reaper_kills_a_launch_even_when_a_process_left_its_group(tmp_path: Path):
    """A stand-in launcher whose child (in its own session) forks a grandchild into yet another session: SIGKILL of
    the launcher ends the child through its process group, and the grandchild through the cgroup (where
    writable; a process that calls setsid escapes process groups)."""
    script = tmp_path / "launcher.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "from llmkiln.serve.reaper import Reaper\n"
        "r = Reaper('test'); r.start(); r.remove_tree(sys.argv[1])\n"
        "argv = ['/bin/sh', '-c', 'setsid sleep 600 & exec sleep 600']\n"
        "p = subprocess.Popen(r.wrap(argv), start_new_session=True)\n"
        "r.watch_group(p.pid)\n"
        "print(r.cgroup or '-', p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    launcher = subprocess.Popen([sys.executable, str(script), str(doomed)], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        cg, child = launcher.stdout.readline().split()
        pids.append(int(child))
        assert wait_until(lambda: len(descendants(pids[0])) == 1, 10)
        pids += descendants(pids[0])
        reaper = next(p for p in descendants(launcher.pid) if "llmkiln.serve.reaper" in cmdline(p))
        cgroup = None if cg == "-" else Path(cg)
        if cgroup is not None:
            assert in_cgroup(pids[1], cgroup)
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not alive(pids[0]), 15)
        assert wait_until(lambda: not alive(reaper), 15) and not doomed.exists()
        if cgroup is not None:
            assert wait_until(lambda: not alive(pids[1]), 15)
            assert not cgroup.exists()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_the_reaper_never_signals_a_group_whose_leader_pid_is_another_process_now(tmp_path: Path):
    import io

    from llmkiln.serve.reaper import reap, start_time

    p = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = start_time(p.pid)
        assert started is not None
        reap(io.StringIO(f"pgid {p.pid} {started + 1}\n"))  # recorded for an earlier process with this pid
        assert p.poll() is None
        (tmp_path / "gone").mkdir()
        reap(io.StringIO(f"pgid {p.pid} {started}\nrmtree {tmp_path / 'gone'}\n"))
        assert p.wait(10) == -signal.SIGKILL and not (tmp_path / "gone").exists()
    finally:
        if p.poll() is None:
            p.kill()
