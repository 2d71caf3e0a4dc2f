"""Run the tritonserver bundled in nvidia-pytriton on a model repository.

`TritonServer` starts the process (own session, so a terminal's Ctrl-C reaches only kiln, which forwards it as
SIGTERM for a graceful shutdown), keeps the last log lines, waits for readiness, and fails with those lines
when a port is taken or the server dies. Each server gets its own python-backend shared-memory prefix so a
clean shutdown can be verified (no /dev/shm/<prefix>* left).
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from llmkiln.errors import BadInput, KilnError
from llmkiln.serve.backend_env import assemble_backend_dir, find_triton, server_env

SHM_DIR = Path("/dev/shm")
SHM_BASE_PREFIX = "triton_python_backend_shm_region"
EXIT_MARGIN_S = 5.0
ERROR_LINE = re.compile(r"^E\d{4} ")


class ServerFailed(KilnError):
    """tritonserver exited or never became ready; the message carries its last log lines."""


@dataclass
class ServerConfig:
    """How to run tritonserver."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    exit_timeout_s: int = 30
    log_verbose: int = 0
    ready_timeout_s: float = 300.0
    workdir: Path | None = None  # backend folder + log; a fresh temp folder when None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment (and the backend's)


def port_free(host: str, port: int) -> bool:
    """True when `port` can be bound on `host` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports the OS considers free now (benchmarks and tests start servers on them)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in ports:
            ports.append(port)
    return ports


class TritonServer:
    """One tritonserver process."""

    def __init__(self, cfg: ServerConfig, echo: IO[str] | None = None) -> None:
        self.cfg = cfg
        self.echo = echo
        self.shm_prefix = f"{SHM_BASE_PREFIX}_llmkiln_{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        self._reader: threading.Thread | None = None
        self._log: IO[str] | None = None
        self.log_path: Path | None = None
        self.forced_exit = False
        self._own_workdir: Path | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def command(self, backend_dir: Path) -> list[str]:
        c = self.cfg
        inst = find_triton()
        return [
            str(inst.server_bin),
            f"--model-repository={c.repository}",
            f"--backend-directory={backend_dir}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-address={c.host}",
            f"--http-port={c.http_port}",
            f"--grpc-address={c.host}",
            f"--grpc-port={c.grpc_port}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            f"--exit-timeout-secs={c.exit_timeout_s}",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--model-control-mode=none",
            f"--log-verbose={c.log_verbose}",
            *c.extra_args,
        ]

    def start(self) -> None:
        c = self.cfg
        for what, port in (
            ("--http-port", c.http_port),
            ("--grpc-port", c.grpc_port),
            ("--metrics-port", c.metrics_port),
        ):
            if not port_free(c.host, port):
                raise BadInput(f"{what} {port}: the port is already in use on {c.host}; pick another port")
        if len({c.http_port, c.grpc_port, c.metrics_port}) != 3:
            raise BadInput(
                f"http/grpc/metrics ports must differ, got {c.http_port}/{c.grpc_port}/{c.metrics_port}"
            )
        if c.workdir is None:  # ours: removed after a clean exit (kept, with the log, after a failure)
            self._own_workdir = Path(tempfile.mkdtemp(prefix="llmkiln-serve-"))
        workdir = c.workdir or self._own_workdir
        assert workdir is not None
        workdir.mkdir(parents=True, exist_ok=True)
        backend_dir = assemble_backend_dir(workdir / "backends")
        self.log_path = workdir / "tritonserver.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            self.command(backend_dir),
            env={**server_env(), **c.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name="tritonserver-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self.lines.append(line.rstrip("\n"))
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            if self.echo is not None:
                self.echo.write(line)
                self.echo.flush()

    def log_text(self) -> str:
        return "\n".join(self.lines)

    def last_lines(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:])

    def failure_report(self, n: int = 15) -> str:
        """Error lines (E...) of the log, then its last lines: what a user needs when the server fails."""
        lines = list(self.lines)
        errors = [ln for ln in lines if ERROR_LINE.match(ln)][-8:]
        head = ("Errors:\n" + "\n".join(e[:2000] for e in errors) + "\n") if errors else ""
        return f"{head}Last lines (full log: {self.log_path}):\n" + "\n".join(lines[-n:])

    @property
    def url_http(self) -> str:
        return f"{self.cfg.host}:{self.cfg.http_port}"

    @property
    def url_grpc(self) -> str:
        return f"{self.cfg.host}:{self.cfg.grpc_port}"

    @property
    def url_metrics(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"

    def endpoints(self) -> dict[str, str]:
        return {"http": f"http://{self.url_http}", "grpc": self.url_grpc, "metrics": self.url_metrics}

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.url_http}/v2/health/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until /v2/health/ready answers 200; returns seconds waited. ServerFailed with the log otherwise."""
        assert self.proc is not None, "start() first"
        timeout_s = self.cfg.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                self._join_reader()
                self._clean_leftovers()  # a crashed server (Triton 2.51 can segfault on a failed warmup)
                raise ServerFailed(
                    f"tritonserver exited with code {code} before it was ready.\n{self.failure_report()}"
                )
            if self.is_ready():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServerFailed(
                    f"tritonserver not ready after {timeout_s:.0f} s.\n{self.failure_report()}"
                )
            time.sleep(0.2)

    def terminate(self) -> None:
        """Ask for a graceful shutdown (SIGTERM): Triton waits up to the exit timeout for in-flight requests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, grace_s: float | None = None) -> int | None:
        """Wait for the exit; past the exit timeout (+ margin) SIGKILL the process group and clean up after it.

        Triton 2.51 keeps a model "live" while a client holds a gRPC stream open and then never exits on its
        own; the python stub dies with its parent but cannot unlink its shared memory. This server's processes
        and /dev/shm files carry its unique prefix, so they are removed here and nothing is left behind.
        """
        if self.proc is None:
            return None
        grace_s = self.cfg.exit_timeout_s + EXIT_MARGIN_S if grace_s is None else grace_s
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.forced_exit = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._join_reader()
        self._clean_leftovers()
        if self._own_workdir is not None and self.proc.returncode == 0 and not self.forced_exit:
            shutil.rmtree(self._own_workdir, ignore_errors=True)
        return self.proc.returncode

    def stop(self, grace_s: float | None = None) -> int | None:
        """terminate() then wait_exit(); returns tritonserver's exit code (-9 when it had to be killed)."""
        self.terminate()
        return self.wait_exit(grace_s)

    def _clean_leftovers(self) -> None:
        deadline = time.monotonic() + 5
        while self.leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.1)  # stubs notice their parent is gone and exit by themselves
        for pid in self.leftover_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        removed = 0
        for f in self.leftover_shm():
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
                removed += 1
        if self.forced_exit:
            self.lines.append(
                f"llmkiln: tritonserver did not exit within the exit timeout ({self.cfg.exit_timeout_s} s; "
                f"a client kept a stream open?): killed it and removed {removed} shared-memory file(s)"
            )

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def leftover_processes(self) -> list[int]:
        """Pids of this server's processes still alive (tritonserver and its python stubs carry the shm prefix)."""
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if self.shm_prefix.encode() in cmdline:
                pids.append(int(proc.name))
        return pids

    def leftover_shm(self) -> list[Path]:
        """This server's python-backend shared-memory files still in /dev/shm."""
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*"))

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(server: TritonServer, on_ready: Callable[[TritonServer], None] | None = None) -> int:
    """Start, wait ready, forward SIGINT/SIGTERM as SIGTERM, return the server's exit code."""
    stopping = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        stopping.set()
        if server.proc is not None and server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        try:
            server.wait_ready()
        except ServerFailed:
            if stopping.is_set():  # interrupted while loading: a requested stop, not a failure
                return int(server.wait_exit() or 0)
            raise
        if on_ready is not None:
            on_ready(server)
        assert server.proc is not None
        while server.proc.poll() is None and not stopping.is_set():
            time.sleep(0.2)
        code = server.wait_exit()
        if not stopping.is_set():
            raise ServerFailed(
                f"tritonserver exited unexpectedly with code {code}.\n{server.failure_report()}"
            )
        return 0 if code in (0, None) else int(code)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
