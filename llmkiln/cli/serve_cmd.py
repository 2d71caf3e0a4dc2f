"""`kiln repo` (write or check a Triton model repository) and `kiln serve` (run tritonserver on an engine, or
with --dynamo the Dynamo frontend and N llmkiln workers: an OpenAI-compatible endpoint with KV-aware routing)."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.dynamo.cluster import ROUTER_MODES
from llmkiln.dynamo.launcher import DynamoLauncher, DynamoOptions, serve_dynamo
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.serve.launch import ServeOptions, serve_engine
from llmkiln.serve.repository import check_repository, spec_from_engine, write_repository
from llmkiln.serve.server import TritonServer


@click.command()
@click.argument("engine", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Repository folder to write.")
@click.option(
    "--model-name", default=None, help="Triton model name (default: the recipe's serve.model_name)."
)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
@click.option(
    "--check", "check_dir", type=click.Path(path_type=Path), help="Parse and validate an existing repository."
)
def repo(
    engine: Path | None, out: Path | None, model_name: str | None, force: bool, check_dir: Path | None
) -> None:
    """Write the Triton model repository for ENGINE to --out, or validate one with --check DIR."""
    if check_dir is not None:
        for m in check_repository(check_dir):
            warm = len(m.config.model_warmup)
            click.echo(f"ok: {check_dir / m.name} (engine {m.engine_dir}, {warm} warmup sample(s))")
        if engine is None:
            return
    if engine is None or out is None:
        raise BadInput("give ENGINE and -o OUT to write a repository, or --check DIR to validate one")
    spec = spec_from_engine(resolve_engine(engine).require(), model_name)
    model_dir = write_repository(spec, out, overwrite=force)
    click.echo(f"wrote {model_dir} (config.pbtxt, 1/model.py, {len(spec.warmup.prompts)} warmup prompt(s))")


@click.command()
@click.argument("engine", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the endpoints listen on.")
@click.option("--http-port", type=int, default=None, help="Default: the recipe's serve.http_port.")
@click.option("--grpc-port", type=int, default=None, help="Default: the recipe's serve.grpc_port.")
@click.option("--metrics-port", type=int, default=None, help="Default: the recipe's serve.metrics_port.")
@click.option("--exit-timeout", type=int, default=None, help="Seconds in-flight requests get at shutdown.")
@click.option("--log-verbose", type=int, default=0, help="tritonserver --log-verbose level.")
@click.option(
    "--dynamo",
    is_flag=True,
    help="Scale out: Dynamo's OpenAI frontend + KV router in front of --workers workers.",
)
@click.option("--workers", type=int, default=2, show_default=True, help="--dynamo: llmkiln workers.")
@click.option(
    "--router-mode",
    type=click.Choice(ROUTER_MODES),
    default="kv",
    show_default=True,
    help="--dynamo: kv (to the worker holding the prompt's prefix) or round-robin / random.",
)
@click.option(
    "--migration-limit",
    type=int,
    default=3,
    show_default=True,
    help="--dynamo: times a request whose worker died moves to another worker.",
)
@click.option(
    "--threads-per-worker",
    type=int,
    default=0,
    help="--dynamo: intra-op threads (default: cores // workers).",
)
@click.option(
    "--grace-period",
    type=float,
    default=5.0,
    show_default=True,
    help="--dynamo: seconds a stopping worker keeps serving after it unregistered.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="--dynamo: discovery folder (wiped at start) and logs (default: a temp folder, removed after).",
)
def serve(
    engine: Path,
    host: str,
    http_port: int | None,
    grpc_port: int | None,
    metrics_port: int | None,
    exit_timeout: int | None,
    log_verbose: int,
    dynamo: bool,
    workers: int,
    router_mode: str,
    migration_limit: int,
    threads_per_worker: int,
    grace_period: float,
    state_dir: Path | None,
) -> int:
    """Serve ENGINE with tritonserver; ready only after warmup. Ctrl-C or SIGTERM shuts it down cleanly.

    With --dynamo: the Dynamo frontend (OpenAI API: /v1/models, /v1/completions, /v1/chat/completions) and
    --workers llmkiln workers, each warmed up before it registers; Ctrl-C or SIGTERM stops them all.
    """
    if dynamo:
        return _serve_dynamo(
            engine,
            DynamoOptions(
                workers=workers,
                host=host,
                http_port=http_port,
                router_mode=router_mode,
                migration_limit=migration_limit,
                threads_per_worker=threads_per_worker,
                state_dir=state_dir,
                grace_period_s=grace_period,
                drain_timeout_s=None if exit_timeout is None else float(exit_timeout),
            ),
        )

    def ready(server: TritonServer, model_name: str) -> None:
        ep = server.endpoints()
        click.secho(f"ready: model {model_name!r}", fg="green", err=True)
        click.echo(f"  HTTP    {ep['http']}   (POST {ep['http']}/v2/models/{model_name}/generate)", err=True)
        click.echo(f"  gRPC    {ep['grpc']}", err=True)
        click.echo(f"  metrics {ep['metrics']}", err=True)

    opts = ServeOptions(host, http_port, grpc_port, metrics_port, exit_timeout, log_verbose)
    code = serve_engine(engine, opts, on_ready=ready)
    click.echo(f"stopped (tritonserver exit code {code})", err=True)
    return code


def _serve_dynamo(engine: Path, opts: DynamoOptions) -> int:
    def ready(launcher: DynamoLauncher, waited_s: float) -> None:
        spec = launcher.spec
        click.secho(
            f"ready in {waited_s:.1f} s: {spec.workers} worker(s), router {spec.router_mode}",
            fg="green",
            err=True,
        )
        click.echo(
            f"  OpenAI  {spec.url}   (POST {spec.url}/chat/completions, {spec.url}/completions)", err=True
        )
        for i in range(spec.workers):
            click.echo(
                f"  worker-{i} {spec.status_url(i)}/health  /metrics  ({spec.threads} thread(s))", err=True
            )
        click.echo(f"  logs    {spec.log_dir}", err=True)

    code = serve_dynamo(engine, opts, on_ready=ready)
    click.echo("stopped", err=True)
    return code
