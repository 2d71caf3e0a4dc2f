"""Serve an engine folder for the duration of a benchmark, on free loopback ports, through either front door:
`serve_engine` (tritonserver, gRPC: `kiln serve`) or `serve_dynamo_engine` (Dynamo's frontend and llmkiln workers,
OpenAI endpoint: `kiln serve --dynamo`). Both verify the engine first and leave no process or state behind."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmkiln.dynamo.launcher import DynamoLauncher, make_spec
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir
from llmkiln.serve.ports import free_ports
from llmkiln.serve.repository import spec_from_engine, write_repository
from llmkiln.serve.server import ServerConfig, TritonServer


@dataclass(frozen=True)
class Served:
    """A running server: its gRPC url, model name and process handle."""

    url: str
    model: str
    server: TritonServer
    ready_s: float


@contextlib.contextmanager
def serve_engine(
    engine_dir: Path,
    model_name: str = "llmkiln",
    ready_timeout_s: float = 600.0,
    echo: bool = False,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Served]:
    """Write a model repository for `engine_dir` in a temp folder, start tritonserver on 127.0.0.1, stop it after.

    Readiness includes the recipe's warmup (Triton runs it before the model is READY). `overrides`: nested
    recipe fields for the served engine (e.g. {"scheduler": {"tpot_slo_ms": 50}}); `env`: extra environment
    of the server and its python backend (e.g. LLMKILN_PROFILE).
    """
    engine_dir = Path(engine_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="llmkiln-bench-") as tmp:
        folder = EngineDir(engine_dir).require()
        folder.verify()  # never benchmark a corrupted engine (IntegrityError names the file)
        spec = spec_from_engine(folder, model_name)
        spec.drain_file = Path(tmp) / "drain"
        if overrides:
            spec = replace(spec, engine_overrides=overrides)
        repo = Path(tmp) / "repo"
        write_repository(spec, repo)
        ports = free_ports(3)
        cfg = ServerConfig(
            repository=repo,
            http_port=ports[0],
            grpc_port=ports[1],
            metrics_port=ports[2],
            ready_timeout_s=ready_timeout_s,
            workdir=Path(tmp) / "work",
            exit_timeout_s=10,
            drain_file=Path(tmp) / "drain",
            env=dict(env or {}),
        )
        server = TritonServer(cfg, echo=sys.stderr if echo else None)
        server.start()
        try:
            ready_s = server.wait_ready()
            yield Served(url=server.url_grpc, model=model_name, server=server, ready_s=ready_s)
        finally:
            server.stop()


@contextlib.contextmanager
def serve_dynamo_engine(
    engine_dir: Path,
    opts: DynamoOptions | None = None,
    ready_timeout_s: float = 300.0,
    echo: bool = False,
    worker_command: tuple[str, ...] | None = None,
) -> Iterator[DynamoLauncher]:
    """`kiln serve ENGINE --dynamo` for a benchmark: the launch of `opts` (default: two workers, 1 s grace period)
    on a free loopback HTTP port unless `opts.http_port` is set, its state and logs in a temp folder removed after
    a clean stop (kept after a failure: the LaunchFailed message names the logs). Yields the ready launcher (`launcher.url` is the OpenAI base URL; `launcher.spec.served_model_name` or the recipe's
    serve.model_name is the model). `worker_command`: another worker program behind the same front door, given
    the llmkiln worker's arguments (ClusterSpec.worker_command; a peer engine served the same way)."""
    engine_dir = Path(engine_dir).resolve()
    EngineDir(
        engine_dir
    ).require().verify()  # never benchmark a corrupted engine (IntegrityError names the file)
    opts = opts if opts is not None else DynamoOptions(grace_period_s=1.0)
    if opts.http_port is None:
        opts = replace(opts, http_port=free_ports(1)[0])
    state = Path(tempfile.mkdtemp(prefix="llmkiln-bench-dynamo-"))
    spec = make_spec(engine_dir, opts, state)
    if worker_command is not None:
        spec = replace(spec, worker_command=worker_command)
    launcher = DynamoLauncher(spec, echo=sys.stderr if echo else None)
    try:
        launcher.start()
        launcher.wait_ready(ready_timeout_s)
        yield launcher
    finally:
        launcher.stop()
    shutil.rmtree(state, ignore_errors=True)  # after a failure the logs stay (the error names them)
