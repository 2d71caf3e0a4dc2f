"""Run the tritonserver bundled in nvidia-pytriton on a model repository.

`TritonServer` starts the process and keeps its log, waits for readiness, watches the python-backend stubs, and
stops it gracefully:

- tritonserver runs in its own session (a terminal's Ctrl-C reaches only kiln) and dies with the thread that
  started it (`setpriv --pdeathsig KILL`): a SIGKILLed `kiln serve` leaves no server holding its ports. A stale
  server from an older, killed launcher is named (pid, how to stop it) when its port is wanted again, and the
  /dev/shm files of dead servers are removed at start.
- If the launcher dies (SIGKILL included), its reaper (llmkiln.serve.reaper, a process in its own session) kills
  the server's cgroup (or process group) — tritonserver, its stubs and their guards — and removes the server's
  /dev/shm files and the temp folder; each stub also dies with tritonserver by itself (parent_watch's guard).
- Triton 2.51 does not notice a dead python stub: health stays 200 and in-flight streams hang (measured: 70 s
  with no answer). A watchdog polls the stub pids every 0.25 s; when one dies, tritonserver is killed (it cannot
  recover), so readiness fails within a second, clients' streams end with an error, and the launcher reports
  the cause and the log tail (the log is kept in the user cache folder).
- stop(): drain first (the model's drain file: new requests get UNAVAILABLE at once, requests in flight finish or
  end with a final error at the deadline, `llmkiln_requests_active` reaches 0; the HTTP front's readiness says
  503), then — nothing in flight — tritonserver is killed, with the HTTP front answering 503 until it is gone
  (Triton 2.51's own shutdown answers "unknown model" while it unloads and can hang until its exit timeout:
  `_stop_after_drain`). Without a drain (no drain file, or requests still active): SIGTERM, then SIGKILL past the
  exit timeout.
- The admin APIs (shared memory, logging, trace, model repository, statistics) are restricted to clients that
  send the operator's key (`ServerConfig.admin_key`, header `llmkiln-admin-key`; gRPC:
  `triton-grpc-protocol-llmkiln-admin-key`); without a key a random one is used, so they are closed.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from llmkiln.engine_dir import user_cache_dir
from llmkiln.errors import BadInput, KilnError
from llmkiln.serve.backend_env import assemble_backend_dir, find_triton, server_env
from llmkiln.serve.exit_status import crash_excerpt, describe_exit
from llmkiln.serve.grpc_front import CANCEL_KEY_ENV, GrpcFront
from llmkiln.serve.heartbeat import read_beat
from llmkiln.serve.http_front import HttpFront
from llmkiln.serve.ports import free_ports, port_free
from llmkiln.serve.processes import (
    LLMKILN_SHM_PREFIX,
    SHM_DIR,
    SHM_ID_LEN,
    alive,
    children,
    new_workdir,
    processes_with,
    remove_orphan_shm,
    stale_servers,
)
from llmkiln.serve.reaper import Reaper, die_with_parent, start_time

EXIT_MARGIN_S = 5.0
DRAIN_MARGIN_S = 1.0  # requests still running this long before the exit timeout end with a final error
STUB_POLL_S = 0.25
STUCK_GRACE_S = 2.0  # a stuck model: time Triton gets to fail the requests of its killed stub
ERROR_LINE = re.compile(r"^E\d{4} ")
ADMIN_APIS = "shared-memory,logging,trace,model-repository,statistics"
ADMIN_HEADER = "llmkiln-admin-key"
ADMIN_KEY_ENV = "LLMKILN_ADMIN_KEY"
ACTIVE_METRIC = "llmkiln_requests_active"
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # what Triton's own gRPC endpoint accepts


class ServerFailed(KilnError):
    """tritonserver exited, crashed or never became ready; the message carries the cause and its log lines."""


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
    workdir: Path | None = None  # backend folder + log; a fresh temp folder (removed at the end) when None
    extra_args: list[str] = field(default_factory=list)
    admin_key: str | None = None  # the key admin API calls must send; None: a random one (APIs closed)
    drain_file: Path | None = None  # the model's drain file (RepoSpec.drain_file); None: no drain phase
    heartbeat_file: Path | None = (
        None  # the stub's heartbeat (RepoSpec.heartbeat_file); None: no liveness check
    )
    stall_timeout_s: float = 30.0  # the recipe's serve.stall_timeout_s: the liveness bound
    # llmkiln's HTTP front on host:http_port (generate bodies checked, Retry-After), Triton's HTTP on loopback
    http_front: bool = False
    max_request_bytes: int = 256 * 1024  # the front's body limit (the recipe's serve.max_prompt_bytes)
    # llmkiln's gRPC front on host:grpc_port (Triton never sees a cancelled stream: it crashes on them),
    # Triton's gRPC on loopback
    grpc_front: bool = False
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment (and the backend's)
    reap_workdir: bool = False  # remove `workdir` too if the launcher dies (kiln serve's temp folder)


class TritonServer:
    """One tritonserver process."""

    def __init__(self, cfg: ServerConfig, echo: IO[str] | None = None) -> None:
        self.cfg = cfg
        self.echo = echo
        self.shm_prefix = f"{LLMKILN_SHM_PREFIX}{uuid.uuid4().hex[:SHM_ID_LEN]}"
        self.admin_key = cfg.admin_key or secrets.token_urlsafe(24)
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=400)
        self._reader: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._log: IO[str] | None = None
        self.log_path: Path | None = None
        self.kept_log: Path | None = None
        self.forced_exit = False
        self.drained = False
        self.stopped_after_drain = False  # killed on purpose once nothing was in flight: a clean stop
        self.crash: str | None = None  # why the watchdog killed the server
        self.stub_pids: list[int] = []
        self._tree: list[tuple[int, int | None]] = []  # stubs and their guards, with their start times
        self.stop_requested = threading.Event()
        self._own_workdir: Path | None = None
        self.front: HttpFront | None = None
        self.reaper: Reaper | None = None  # kills what we started and removes its files if we die
        # where tritonserver's own HTTP endpoint listens (behind the front: loopback, a free port)
        self.triton_http = (cfg.host, cfg.http_port)
        self.grpc_front: GrpcFront | None = None
        self.triton_grpc = (cfg.host, cfg.grpc_port)  # the same for gRPC (llmkiln.serve.grpc_front)
        self.cancel_key = secrets.token_urlsafe(24)  # in-band cancels from the gRPC front carry it

    # -- lifecycle -------------------------------------------------------------------------------------------

    def command(self, backend_dir: Path) -> list[str]:
        c = self.cfg
        inst = find_triton()
        restricted = f"{ADMIN_APIS}:{ADMIN_HEADER}={self.admin_key}"
        return [
            str(inst.server_bin),
            f"--model-repository={c.repository}",
            f"--backend-directory={backend_dir}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--http-address={self.triton_http[0]}",
            f"--http-port={self.triton_http[1]}",
            f"--grpc-address={self.triton_grpc[0]}",
            f"--grpc-port={self.triton_grpc[1]}",
            f"--metrics-address={c.host}",
            f"--metrics-port={c.metrics_port}",
            f"--exit-timeout-secs={c.exit_timeout_s}",
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--model-control-mode=none",
            f"--log-verbose={c.log_verbose}",
            *c.extra_args,
        ]

    def _check_ports(self) -> None:
        c = self.cfg
        ports = {"--http-port": c.http_port, "--grpc-port": c.grpc_port, "--metrics-port": c.metrics_port}
        if len(set(ports.values())) != 3:
            raise BadInput(
                f"http/grpc/metrics ports must differ, got {c.http_port}/{c.grpc_port}/{c.metrics_port}"
            )
        for flag, port in ports.items():
            if not port_free(c.host, port):
                stale = [s for s in stale_servers({flag: port}) if s.port_flag == flag]
                why = stale[0].describe() if stale else "pick another port"
                raise BadInput(f"{flag} {port}: the port is already in use on {c.host}; {why}")

    def start(self) -> None:
        remove_orphan_shm()  # a killed server's shared memory (no process carries its prefix any more)
        self._check_ports()
        if self.cfg.workdir is None:  # ours: removed at the end (the log is kept elsewhere after a failure)
            self._own_workdir = new_workdir()
        workdir = self.cfg.workdir or self._own_workdir
        assert workdir is not None
        workdir.mkdir(parents=True, exist_ok=True)
        if self.cfg.drain_file is not None:
            self.cfg.drain_file.unlink(missing_ok=True)
        backend_dir = assemble_backend_dir(workdir / "backends")
        if self.cfg.http_front:
            self.triton_http = ("127.0.0.1", free_ports(1)[0])
            self.front = HttpFront(
                self.cfg.host,
                self.cfg.http_port,
                f"127.0.0.1:{self.triton_http[1]}",
                self.cfg.max_request_bytes,
            )
            try:
                self.front.start()
            except OSError as exc:
                raise BadInput(
                    f"--http-port {self.cfg.http_port}: cannot listen on {self.cfg.host}: {exc}"
                ) from None
        env = {**server_env(), **self.cfg.env}
        if self.cfg.grpc_front:
            self.triton_grpc = ("127.0.0.1", free_ports(1)[0])
            env[CANCEL_KEY_ENV] = self.cancel_key
            self.grpc_front = GrpcFront(
                self.cfg.host,
                self.cfg.grpc_port,
                f"127.0.0.1:{self.triton_grpc[1]}",
                self.cancel_key,
                GRPC_MAX_MESSAGE_BYTES,
            )
            try:
                self.grpc_front.start()
            except OSError as exc:
                self._stop_fronts()
                raise BadInput(
                    f"--grpc-port {self.cfg.grpc_port}: cannot listen on {self.cfg.host}: {exc}"
                ) from None
        self.log_path = workdir / "tritonserver.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self.reaper = Reaper("serve")
        self.reaper.start()
        self.reaper.remove_shm(self.shm_prefix)
        if self._own_workdir is not None or self.cfg.reap_workdir:
            self.reaper.remove_tree(workdir)
        self.proc = subprocess.Popen(
            self.reaper.wrap(die_with_parent(self.command(backend_dir))),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.reaper.watch_group(self.proc.pid)  # tritonserver leads its group; the stubs are in it
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

    def last_lines(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:])

    def keep_log(self) -> Path | None:
        """Copy the server log to <user cache>/serve-logs/ (once) so it outlives the temp folder."""
        if self.kept_log is None and self.log_path is not None and self.log_path.is_file():
            dest_dir = user_cache_dir() / "serve-logs"
            stamp = time.strftime("%Y%m%d-%H%M%S")
            dest = dest_dir / f"tritonserver-{stamp}-{os.getpid()}-{self.shm_prefix[-8:]}.log"
            with contextlib.suppress(OSError):
                dest_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.log_path, dest)
                self.kept_log = dest
        return self.kept_log or self.log_path

    def failure_report(self, n: int = 15) -> str:
        """Error lines (E...) of the log, then its last lines: what a user needs when the server fails."""
        lines = list(self.lines)
        errors = [ln for ln in lines if ERROR_LINE.match(ln)][-8:]
        head = ("Errors:\n" + "\n".join(e[:2000] for e in errors) + "\n") if errors else ""
        crash = crash_excerpt(lines)  # a stub's native crash: the signal, the last step, the stack
        head = f"Crash:\n{crash}\n{head}" if crash else head
        return f"{head}Last lines (full log: {self.keep_log()}):\n" + "\n".join(lines[-n:])

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
        """Block until /v2/health/ready answers 200; returns seconds waited. ServerFailed with the log otherwise.
        Then the stub watchdog starts."""
        assert self.proc is not None, "start() first"
        timeout_s = self.cfg.ready_timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                self._join_reader()
                self._clean_leftovers()  # a crashed server (Triton 2.51 can segfault on a failed warmup)
                self.keep_log()  # before the reaper removes the folder it is in
                self._close_reaper()
                raise ServerFailed(
                    f"tritonserver exited before it was ready ({describe_exit(code)}).\n{self.failure_report()}"
                )
            if self.is_ready():
                break
            if self.stop_requested.is_set():
                raise ServerFailed("stopped before the server was ready")
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServerFailed(
                    f"tritonserver not ready after {timeout_s:.0f} s.\n{self.failure_report()}"
                )
            time.sleep(0.2)
        self.stub_pids = [p for p in processes_with(self.shm_prefix) if p != self.proc.pid]
        self._tree = [(p, start_time(p)) for p in [*self.stub_pids, *children(self.stub_pids)]]  # + guards
        self._watchdog = threading.Thread(target=self._watch_stubs, name="stub-watchdog", daemon=True)
        self._watchdog.start()
        return time.monotonic() - t0

    def _watch_stubs(self) -> None:
        """Kill tritonserver when a python stub dies while serving (Triton would keep reporting healthy), or when
        the model is stuck: no heartbeat, a stopped event loop or an engine without a step for longer than the
        stall bound with requests in flight (llmkiln.serve.heartbeat)."""
        while self.proc is not None and self.proc.poll() is None and not self.stop_requested.is_set():
            dead = [p for p in self.stub_pids if not alive(p)]
            if dead and not self.stop_requested.is_set():
                self.crash = self.crash or (
                    f"the python backend stub (pid {dead[0]}) of the model died while serving; Triton cannot "
                    "recover from that, so tritonserver was stopped (requests in flight ended with an error)"
                )
                self.lines.append(f"llmkiln: {self.crash}")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                return
            stuck = self._stuck()
            if stuck is not None and not self.stop_requested.is_set():
                self._end_stuck(stuck)
                return
            time.sleep(STUB_POLL_S)

    def _stuck(self) -> str | None:
        """Why the model is stuck (from its heartbeat), or None. No heartbeat file yet: not judged."""
        path = self.cfg.heartbeat_file
        if path is None:
            return None
        beat = read_beat(path)
        if beat is None:
            return None
        return beat.problem(time.time(), self.cfg.stall_timeout_s)

    def _end_stuck(self, why: str) -> None:
        """A stuck model: readiness and requests 503 at the front, the stubs killed first (Triton then fails the
        requests in flight with an error instead of leaving them hanging), then tritonserver."""
        assert self.proc is not None
        self.crash = (
            f"{why} (serve.stall_timeout_s = {self.cfg.stall_timeout_s:g}): the model is stuck, so its stub and "
            "tritonserver were killed (requests in flight ended with an error)"
        )
        self.lines.append(f"llmkiln: {self.crash}")
        if self.front is not None:
            self.front.refuse_all()
        for pid in self.stub_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = (
            time.monotonic() + STUCK_GRACE_S
        )  # Triton answers the requests of a dead stub with an error
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def active_requests(self) -> float | None:
        """`llmkiln_requests_active` summed over the metrics endpoint (None when it cannot be read)."""
        try:
            with urllib.request.urlopen(self.url_metrics, timeout=2) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        values = [
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith(ACTIVE_METRIC + "{") or line.startswith(ACTIVE_METRIC + " ")
        ]
        return sum(values) if values else None

    def drain(self) -> bool:
        """Write the drain file (deadline = now + exit timeout - margin) and wait until no request is active or
        the deadline (+ margin) passed. True when the model reported 0 requests in flight."""
        drain_file = self.cfg.drain_file
        if drain_file is None or self.proc is None or self.proc.poll() is not None:
            return False
        deadline = time.time() + max(self.cfg.exit_timeout_s - DRAIN_MARGIN_S, 0.5)
        drain_file.write_text(f"{deadline:.3f}\n")
        if self.front is not None:
            self.front.draining()  # readiness 503 from now on
        while self.proc.poll() is None:
            if self.active_requests() == 0:
                self.drained = True
                return True
            if time.time() > deadline + EXIT_MARGIN_S:
                return False
            time.sleep(0.05)
        return False

    def terminate(self) -> None:
        """Ask for Triton's graceful shutdown (SIGTERM): it waits up to the exit timeout for in-flight requests."""
        self.stop_requested.set()  # stubs exit during a shutdown: the watchdog stands down
        if self.front is not None:
            # first: its pooled keep-alive connections would make Triton wait the whole exit timeout, then exit 1;
            # it keeps answering 503 until tritonserver is gone (wait_exit stops it)
            self.front.refuse_all()
        if self.grpc_front is not None:
            # the same for its connection to Triton; responses still on their way reach their clients first
            self.grpc_front.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def _stop_fronts(self) -> None:
        if self.front is not None:
            self.front.stop()
        if self.grpc_front is not None:
            self.grpc_front.stop()

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
        self._stop_fronts()
        if (self.proc.returncode != 0 and not self.stopped_after_drain) or self.crash is not None:
            self.keep_log()
        if self._own_workdir is not None:
            shutil.rmtree(self._own_workdir, ignore_errors=True)
        self._close_reaper()
        return self.proc.returncode

    def _close_reaper(self) -> None:
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None

    def stop(self, grace_s: float | None = None) -> int | None:
        """drain(), then terminate() and wait_exit(); returns tritonserver's exit code (-9 when killed)."""
        self.stop_requested.set()
        if self.proc is not None and self.proc.poll() is None and self.stub_pids and self.drain():
            self._stop_after_drain()
        self.terminate()
        return self.wait_exit(grace_s)

    def _stop_after_drain(self) -> None:
        """Nothing is in flight (the model said so): end tritonserver at once rather than by SIGTERM.

        Triton 2.51's own shutdown (measured, `python scripts/triton_probes.py closed-streams`) first unloads the
        model while its gRPC endpoint still takes streams — they get "unknown model", not the drain's UNAVAILABLE
        — and after client-cancelled gRPC streams (a channel closed without ending its stream, after every final
        response) it keeps the model "live" with 0 inferences in flight until its exit timeout, then exits 1.
        Killed, every port closes at once (gRPC clients: UNAVAILABLE), the HTTP front answers 503 until the
        end, the stubs die with tritonserver (their guard) and their /dev/shm files are removed (wait_exit)."""
        assert self.proc is not None
        if self.front is not None:
            self.front.refuse_all()
        if self.grpc_front is not None:  # the drain's last final errors reach their clients first
            self.grpc_front.stop()
        self.stopped_after_drain = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.lines.append("llmkiln: drained (0 requests in flight): stopped tritonserver")

    def _clean_leftovers(self) -> None:
        deadline = time.monotonic() + 5
        while self.leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.1)  # stubs notice their parent is gone and exit by themselves
        for pid in self.leftover_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        # a stub killed with tritonserver is an orphan zombie until init reaps it: wait for that (briefly), so
        # nothing of this server is in the process table when we return
        while time.monotonic() < deadline and any(start_time(p) == t for p, t in self._tree if t is not None):
            time.sleep(0.02)
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
        return processes_with(self.shm_prefix)

    def leftover_shm(self) -> list[Path]:
        """This server's python-backend shared-memory files still in /dev/shm."""
        return sorted(SHM_DIR.glob(f"{self.shm_prefix}*"))

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
