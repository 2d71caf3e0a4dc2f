"""`kiln serve`: write a repository for an engine into a temp folder and run tritonserver on it until a signal."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from llmkiln.engine_dir import EngineDir, resolve_engine
from llmkiln.serve.repository import spec_from_engine, write_repository
from llmkiln.serve.server import ServerConfig, TritonServer, serve_forever


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
    )


def serve_engine(
    engine: str | Path,
    opts: ServeOptions,
    echo: IO[str] | None = None,
    on_ready: Callable[[TritonServer, str], None] | None = None,
) -> int:
    """Serve `engine` until SIGINT/SIGTERM; returns tritonserver's exit code. The temp folder is removed after."""
    folder = resolve_engine(engine, opts.engines_root).require()
    spec = spec_from_engine(folder)
    work = Path(tempfile.mkdtemp(prefix="llmkiln-serve-"))
    write_repository(spec, work / "repository")
    server = TritonServer(server_config(folder, work / "repository", opts), echo=echo or sys.stderr)

    def ready(s: TritonServer) -> None:
        if on_ready is not None:
            on_ready(s, spec.model_name)

    code = serve_forever(server, on_ready=ready)  # on failure the folder (with tritonserver.log) is kept
    shutil.rmtree(work, ignore_errors=True)
    return code
