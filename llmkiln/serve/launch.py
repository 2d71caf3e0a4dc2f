"""`kiln serve`: verify the engine, write its repository into a temp folder and run tritonserver on it until a
signal; the temp folder is removed on every path (a crashed server's log is kept in the user cache folder)."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from llmkiln.engine_dir import EngineDir
from llmkiln.host.check import check_engine
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.serve.processes import new_workdir, remove_dead_workdirs
from llmkiln.serve.repository import spec_from_engine, write_repository
from llmkiln.serve.server import ServerConfig, ServerFailed, TritonServer

DRAIN_FILE = "drain"
HEARTBEAT_FILE = "heartbeat"


@dataclass
class ServeOptions:
    """Command-line overrides; None = the recipe's serve section."""

    host: str = "127.0.0.1"
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    exit_timeout_s: int | None = None
    log_verbose: int = 0
    engines_root: Path | None = (
        None  # where a recipe name is looked up (default: $LLMKILN_ENGINES or ./engines)
    )
    admin_key: str | None = None  # the key admin API calls must send (None: admin APIs closed)
    role: WorkerRole = WorkerRole.AGGREGATED  # --role: a prefill or decode model (llmkiln.host.roles)
    kv: KvTransferOptions = field(default_factory=KvTransferOptions)  # --kv-export-timeout, ...


def server_config(engine: EngineDir, repo: Path, opts: ServeOptions) -> ServerConfig:
    serve = engine.recipe().serve
    return ServerConfig(
        repository=repo,
        host=opts.host,
        http_port=serve.http_port if opts.http_port is None else opts.http_port,
        grpc_port=serve.grpc_port if opts.grpc_port is None else opts.grpc_port,
        metrics_port=serve.metrics_port if opts.metrics_port is None else opts.metrics_port,
        exit_timeout_s=serve.exit_timeout_s if opts.exit_timeout_s is None else opts.exit_timeout_s,
        log_verbose=opts.log_verbose,
        workdir=repo.parent,
        admin_key=opts.admin_key,
        drain_file=repo.parent / DRAIN_FILE,
        heartbeat_file=repo.parent / HEARTBEAT_FILE,
        stall_timeout_s=serve.stall_timeout_s,
        http_front=True,
        grpc_front=True,
        max_request_bytes=serve.max_prompt_bytes,
        reap_workdir=True,
    )


def serve_engine(
    engine: str | Path,
    opts: ServeOptions,
    echo: IO[str] | None = None,
    on_ready: Callable[[TritonServer, str], None] | None = None,
) -> int:
    """Serve `engine` until SIGINT/SIGTERM; 0 after a clean stop, ServerFailed (exit 1) otherwise."""
    # a corrupted engine is never served (IntegrityError, exit 1); the model's engine host checks it again
    folder = check_engine(engine, opts.engines_root)
    spec = spec_from_engine(folder, role=opts.role, kv=opts.kv)
    remove_dead_workdirs()  # temp folders of killed `kiln serve` processes
    work = new_workdir()
    try:
        spec.drain_file = work / DRAIN_FILE
        spec.heartbeat_file = work / HEARTBEAT_FILE
        write_repository(spec, work / "repository")
        server = TritonServer(server_config(folder, work / "repository", opts), echo=echo or sys.stderr)

        def ready(s: TritonServer) -> None:
            if on_ready is not None:
                on_ready(s, spec.model_name)

        return serve_forever(server, on_ready=ready)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def serve_forever(server: TritonServer, on_ready: Callable[[TritonServer], None] | None = None) -> int:
    """Start, wait ready, run until SIGINT/SIGTERM, then drain and stop. Returns 0 after a clean stop; raises
    ServerFailed (exit code 1) with the cause and the log tail when the server fails, crashes or does not stop
    cleanly. Never returns tritonserver's own exit code (kiln serve's exit codes are 0, 1 and 2)."""

    def forward(signum: int, _frame: object) -> None:
        server.stop_requested.set()  # the loop below drains and stops (not in the signal handler)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        try:
            server.wait_ready()
        except ServerFailed:
            if server.stop_requested.is_set():  # interrupted while loading: a requested stop, not a failure
                server.stop()
                return 0
            raise
        if on_ready is not None:
            on_ready(server)
        assert server.proc is not None
        while server.proc.poll() is None and not server.stop_requested.is_set():
            time.sleep(0.2)
        if not server.stop_requested.is_set():
            code = server.wait_exit()
            cause = server.crash or f"tritonserver exited unexpectedly with code {code}"
            raise ServerFailed(f"{cause}.\n{server.failure_report()}")
        code = server.stop()
        if code == 0 or server.stopped_after_drain or (server.forced_exit and server.drained):
            return 0
        raise ServerFailed(
            f"tritonserver exited with code {code} while stopping"
            f"{'' if server.drained else ' (requests were still in flight)'}.\n{server.failure_report()}"
        )
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if server.proc is not None and server.proc.poll() is None:
            server.stop()
