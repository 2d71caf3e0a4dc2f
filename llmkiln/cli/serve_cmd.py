"""`kiln repo` (write or check a Triton model repository) and `kiln serve` (run tritonserver on an engine, or
with --dynamo the Dynamo frontend and N llmkiln workers: an OpenAI-compatible endpoint with KV-aware routing)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from llmkiln.cli.options import (
    LAUNCH_PARAMS,
    engines_dir_option,
    given_flags,
    launch_fields,
    launch_options,
    recipe_sets,
)
from llmkiln.dynamo.launcher import DynamoLauncher, serve_dynamo
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.host.host_options import HostOptions
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.serve.backend_env import check_triton_python
from llmkiln.serve.launch import ServeOptions, serve_engine
from llmkiln.serve.repository import check_repository, spec_from_engine, write_repository
from llmkiln.serve.server import ADMIN_KEY_ENV, TritonServer
from llmkiln.trtllm.llmapi_repo import check_llmapi_repository
from llmkiln.trtllm.repo_check import check_trtllm_repository
from llmkiln.trtllm.upstream import check_and_take, default_upstream, repo_kind

PORT = click.IntRange(1, 65535)


@click.command()
@click.argument("engine", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Repository folder to write.")
@click.option(
    "--model-name", default=None, help="Triton model name (default: the recipe's serve.model_name)."
)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
@click.option(
    "--role",
    type=click.Choice([r.value for r in WorkerRole]),
    default=WorkerRole.AGGREGATED.value,
    show_default=True,
    help="The model's role (as `kiln serve --role`; the KV transfer options at their defaults).",
)
@click.option(
    "--check", "check_dir", type=click.Path(path_type=Path), help="Parse and validate an existing repository."
)
@click.option(
    "--upstream-models",
    type=click.Path(path_type=Path),
    default=None,
    help="With --check on a TensorRT-LLM repository: the container's model folder (e.g. "
    "/app/all_models/inflight_batcher_llm or /app/all_models/llmapi); its config.pbtxt I/O names and parameter "
    "keys must match the generated ones.",
)
@click.option(
    "--take-model-files",
    is_flag=True,
    help="With --check on a TensorRT-LLM repository: after the comparison, copy the container's python model "
    "code into the repository (default folder: the pinned container's).",
)
@engines_dir_option
def repo(
    engine: Path | None,
    out: Path | None,
    model_name: str | None,
    force: bool,
    role: str,
    check_dir: Path | None,
    upstream_models: Path | None,
    take_model_files: bool,
    engines_dir: Path,
) -> None:
    """Write the Triton model repository for ENGINE to --out, or validate one with --check DIR."""
    if check_dir is not None and repo_kind(check_dir) != "cpu":
        _check_trtllm(check_dir, upstream_models, take_model_files)
        return
    if upstream_models is not None or take_model_files:
        raise BadInput(
            "--upstream-models / --take-model-files apply to TensorRT-LLM repositories (--check DIR)"
        )
    if check_dir is not None:
        for m in check_repository(check_dir):
            warm = len(m.config.model_warmup)
            click.echo(f"ok: {check_dir / m.name} (engine {m.engine_dir}, {warm} warmup sample(s))")
        if engine is None:
            return
    if engine is None or out is None:
        raise BadInput("give ENGINE and -o OUT to write a repository, or --check DIR to validate one")
    spec = spec_from_engine(resolve_engine(engine, engines_dir).require(), model_name, role=WorkerRole(role))
    model_dir = write_repository(spec, out, overwrite=force)
    click.echo(
        f"wrote {model_dir} (config.pbtxt, 1/model.py, {len(spec.warmup.prefixes)} warmup prefix(es), {len(spec.warmup.prompts)} prompt(s))"
    )


def _check_trtllm(repo_dir: Path, upstream: Path | None, take: bool) -> None:
    kind = repo_kind(repo_dir)
    problems = check_trtllm_repository(repo_dir) if kind == "engine" else check_llmapi_repository(repo_dir)
    if problems:
        raise BadInput(f"{repo_dir}: invalid {kind} repository:\n  " + "\n  ".join(problems))
    click.echo(f"ok: {repo_dir} ({kind} repository, configs parse, I/O and warmup checked)")
    if upstream is None and not take:
        return
    taken = check_and_take(repo_dir, upstream, take=take)
    click.echo(f"ok: matches the container's model files ({upstream or default_upstream(kind)})")
    for rel in taken:
        click.echo(f"took {rel}")


_DYNAMO = DynamoOptions()


@click.command()
@click.argument("engine", type=click.Path(path_type=Path))
@click.option("--host", default=_DYNAMO.host, show_default=True, help="Address the endpoints listen on.")
@click.option("--http-port", type=PORT, default=None, help="Default: the recipe's serve.http_port.")
@click.option("--grpc-port", type=PORT, default=None, help="Default: the recipe's serve.grpc_port.")
@click.option("--metrics-port", type=PORT, default=None, help="Default: the recipe's serve.metrics_port.")
@click.option(
    "--exit-timeout",
    type=click.IntRange(1, 3600),
    default=None,
    help="Seconds in-flight requests get at shutdown.",
)
@click.option(
    "--log-verbose", type=click.IntRange(0, 10), default=0, help="tritonserver --log-verbose level."
)
@click.option(
    "--verify",
    "verify_full",
    is_flag=True,
    hidden=True,
    help="Kept for old scripts: every engine file is re-hashed before serving anyway.",
)
@click.option(
    "--role",
    type=click.Choice([r.value for r in WorkerRole]),
    default=WorkerRole.AGGREGATED.value,
    show_default=True,
    help="Triton: the part of a request's life this server's model serves. prefill: runs the prompt to its first "
    "token and answers with its hand-off (output disaggregated_params); decode: takes that hand-off (input "
    "disaggregated_params), pulls the prompt's KV from the prefill server with NIXL and decodes. With --dynamo "
    "the roles come from --prefill-workers / --decode-workers.",
)
@click.option(
    "--dynamo",
    is_flag=True,
    help="Scale out: Dynamo's OpenAI frontend + KV router in front of --workers workers.",
)
@launch_options(prefix="--dynamo: ")
@click.option(
    "--prefill-set",
    "prefill_sets",
    multiple=True,
    metavar="SECTION.FIELD=VALUE",
    help="--dynamo with prefill workers: a recipe override for the prefill workers only (repeatable), e.g. "
    "scheduler.max_prefill_tokens=128.",
)
@click.option(
    "--decode-first/--no-decode-first",
    default=None,
    help="--dynamo with prefill workers on one CPU host: the decode workers run on every core and the prefill "
    "workers' compute at idle priority (it gets the cycles decode steps, the front door and KV transfers leave). "
    "Default: on where each worker's share is at most 2 cores (Linux), off otherwise.",
)
@click.option(
    "--threads-per-worker",
    type=int,
    default=_DYNAMO.threads_per_worker,
    help="--dynamo: intra-op threads (default: cores // workers).",
)
@click.option(
    "--grace-period",
    type=float,
    default=_DYNAMO.grace_period_s,
    show_default=True,
    help="--dynamo: seconds a stopping worker keeps serving after it unregistered.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="--dynamo: discovery folder (wiped at start) and logs (default: a temp folder, removed after).",
)
@engines_dir_option
def serve(
    engine: Path,
    host: str,
    http_port: int | None,
    grpc_port: int | None,
    metrics_port: int | None,
    exit_timeout: int | None,
    log_verbose: int,
    verify_full: bool,
    role: str,
    dynamo: bool,
    prefill_sets: tuple[str, ...],
    decode_first: bool | None,
    threads_per_worker: int,
    grace_period: float,
    state_dir: Path | None,
    engines_dir: Path,
    **launch: Any,  # launch_options: the Dynamo graph
) -> int:
    """Serve ENGINE with tritonserver; ready only after warmup. Ctrl-C or SIGTERM shuts it down cleanly.

    Exit codes: 0 clean stop; 1 the server failed or crashed (cause and log tail printed, log kept); 2 bad input.
    Admin APIs (shared memory, logging, trace, model repository, statistics) need the header
    `llmkiln-admin-key: $LLMKILN_ADMIN_KEY`; with the variable unset they are closed.

    With --dynamo: the Dynamo frontend (OpenAI API: /v1/models, /v1/completions, /v1/chat/completions) and
    --workers llmkiln workers, each warmed up before it registers; Ctrl-C or SIGTERM stops them all.
    --prefill-workers P --decode-workers D: prefill/decode separation instead (P + D workers, each with its core
    share; the prompt's KV moves from prefill to decode worker with NIXL; a prompt whose uncached part is at most
    --max-local-prefill-tokens is prefilled on the decode worker instead; --prefill-set tunes the prefill workers;
    --decode-first gives the decode tier every core and the prefill tier's compute idle priority: the default where
    each worker's share is at most 2 cores, --no-decode-first turns it off).

    --role prefill / decode (Triton): this server hosts one tier of prefill/decode separation; a client (or router)
    sends the prompt to the prefill server, then the same prompt with that answer's disaggregated_params output to
    the decode server (docs/serve.md, "Prefill and decode on Triton"); --kv-export-timeout and
    --max-local-prefill-tokens apply.

    A flag of the other front door is refused (exit 2): --grpc-port, --metrics-port, --log-verbose and --role are
    Triton's; --workers, --prefill-workers, --decode-workers, --prefill-set, --decode-first, --router-mode,
    --migration-limit, --threads-per-worker, --grace-period and --state-dir are Dynamo's. With --dynamo, the flags
    of prefill/decode separation without --prefill-workers and --decode-workers are refused as `kiln deploy
    dynamo` refuses them (llmkiln.dynamo.options).
    """
    _refuse_other_front_door(dynamo)
    del verify_full  # every start re-hashes every engine file
    fields = launch_fields(launch)
    if dynamo:
        return _serve_dynamo(
            engine,
            DynamoOptions(
                **fields,
                prefill_overrides=recipe_sets(prefill_sets, "--prefill-set"),
                decode_first=decode_first,
                host=host,
                http_port=http_port,
                threads_per_worker=threads_per_worker,
                state_dir=state_dir,
                grace_period_s=grace_period,
                drain_timeout_s=None if exit_timeout is None else float(exit_timeout),
                engines_root=engines_dir,
            ),
        )

    # the role and its KV options checked together (BadInput naming the flag), before anything is started
    host_options = HostOptions(role=WorkerRole(role), kv=fields["kv"])
    check_triton_python()  # before anything is built or started: one message, exit 2

    def ready(server: TritonServer, model_name: str) -> None:
        ep = server.endpoints()
        as_role = "" if host_options.role is WorkerRole.AGGREGATED else f" ({host_options.role.value} role)"
        click.secho(f"ready: model {model_name!r}{as_role}", fg="green", err=True)
        click.echo(f"  HTTP    {ep['http']}   (POST {ep['http']}/v2/models/{model_name}/generate)", err=True)
        click.echo(f"  gRPC    {ep['grpc']}", err=True)
        click.echo(f"  metrics {ep['metrics']}", err=True)

    opts = ServeOptions(
        host,
        http_port,
        grpc_port,
        metrics_port,
        exit_timeout,
        log_verbose,
        admin_key=os.environ.get(ADMIN_KEY_ENV) or None,
        engines_root=engines_dir,
        role=host_options.role,
        kv=host_options.kv,
    )
    code = serve_engine(engine, opts, on_ready=ready)
    click.echo("stopped (clean shutdown)", err=True)
    return code


TRITON_ONLY = ("--grpc-port", "--metrics-port", "--log-verbose", "--role")
# the KV transfer flags serve both: Dynamo's prefill/decode workers and Triton's --role prefill / decode (an
# aggregated Triton model refuses them: HostOptions)
KV_FLAGS = tuple(KvTransferOptions.FLAGS.values())
DYNAMO_ONLY = (
    *(flag for flag in ("--" + name.replace("_", "-") for name in LAUNCH_PARAMS) if flag not in KV_FLAGS),
    "--prefill-set",
    "--decode-first",
    "--threads-per-worker",
    "--grace-period",
    "--state-dir",
)


def _refuse_other_front_door(dynamo: bool) -> None:
    """BadInput (exit 2) naming every given flag that the chosen front door would ignore."""
    typed = given_flags()
    given = [flag for flag in (TRITON_ONLY if dynamo else DYNAMO_ONLY) if flag in typed]
    if not given:
        return
    flags = ", ".join(given)
    if dynamo:
        raise BadInput(
            f"{flags}: Triton's flag(s), not used with --dynamo (the OpenAI endpoint is --http-port; each "
            "worker's metrics are on its status port): remove them"
        )
    raise BadInput(f"{flags}: flag(s) of the Dynamo front door: add --dynamo or remove them")


def _serve_dynamo(engine: Path, opts: DynamoOptions) -> int:
    def ready(launcher: DynamoLauncher, waited_s: float) -> None:
        spec = launcher.spec
        click.secho(
            f"ready in {waited_s:.1f} s: {spec.workers} worker(s), router {spec.options.router_mode}",
            fg="green",
            err=True,
        )
        click.echo(
            f"  OpenAI  {spec.url}   (POST {spec.url}/chat/completions, {spec.url}/completions)", err=True
        )
        for i in range(spec.workers):
            role = "" if not spec.disaggregated else f", {spec.worker_role(i).value}"
            click.echo(
                f"  worker-{i} {spec.status_url(i)}/health  /metrics  ({spec.worker_threads(i)} thread(s){role})",
                err=True,
            )
        if spec.disaggregated:
            on = "on" if spec.decode_first else "off"
            click.echo(f"  decode tier first: {on} ({spec.decode_first_why})", err=True)
        click.echo(f"  logs    {spec.log_dir}", err=True)

    code = serve_dynamo(engine, opts, on_ready=ready)
    click.echo("stopped", err=True)
    return code
