"""`kiln deploy dynamo RECIPE -o DIR`: a Kubernetes DynamoGraphDeployment for a recipe's engine."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.dynamo.cluster import ROUTER_MODES, RouterMode
from llmkiln.dynamo.deploy import DeployOptions, write_deployment
from llmkiln.host.kv_transfer import MAX_LOCAL_PREFILL_TOKENS


@click.group()
def deploy() -> None:
    """Write deployment manifests for an engine."""


@deploy.command("dynamo")
@click.argument("recipe")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--replicas", type=int, default=2, show_default=True, help="llmkiln worker replicas.")
@click.option(
    "--threads-per-worker",
    type=int,
    default=2,
    show_default=True,
    help="CPUs (and intra-op threads) per worker.",
)
@click.option(
    "--image", default=None, help="Container image with llmkiln + ai-dynamo (default llmkiln:<version>)."
)
@click.option(
    "--engine-pvc", default="llmkiln-engines", show_default=True, help="PVC holding engines/<recipe>/."
)
@click.option("--name", default=None, help="metadata.name (default llmkiln-<recipe>).")
@click.option("--namespace", default=None, help="metadata.namespace.")
@click.option("--router-mode", type=click.Choice(ROUTER_MODES), default="kv", show_default=True)
@click.option("--migration-limit", type=int, default=3, show_default=True)
@engines_dir_option
@click.option(
    "--checkpoint",
    default=None,
    help="trtllm-llmapi: the HF checkpoint folder on the volume (default <recipe>/hf_checkpoint).",
)
@click.option(
    "--disaggregated",
    is_flag=True,
    help="Prefill and decode workers (--replicas decode, --prefill-replicas prefill) instead of aggregated ones.",
)
@click.option(
    "--prefill-replicas", type=int, default=1, show_default=True, help="--disaggregated: prefill workers."
)
@click.option(
    "--max-local-prefill-tokens",
    type=int,
    default=MAX_LOCAL_PREFILL_TOKENS,
    show_default=True,
    help="--disaggregated CPU workers: a prompt whose uncached part is at most this many tokens is prefilled on "
    "the decode worker (0: every prompt on the prefill tier).",
)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
def dynamo(
    recipe: str,
    out: Path,
    replicas: int,
    threads_per_worker: int,
    image: str | None,
    engine_pvc: str,
    name: str | None,
    namespace: str | None,
    router_mode: RouterMode,  # click.Choice(ROUTER_MODES)
    migration_limit: int,
    engines_dir: Path,
    checkpoint: str | None,
    disaggregated: bool,
    prefill_replicas: int,
    max_local_prefill_tokens: int,
    force: bool,
) -> None:
    """DynamoGraphDeployment (nvidia.com/v1beta1): Dynamo frontend + llmkiln CPU workers (onnx-cpu recipes) or
    dynamo.trtllm workers with their --extra-engine-args YAML (trtllm-llmapi recipes); engines as a volume."""
    opts = DeployOptions(
        replicas=replicas,
        threads_per_worker=threads_per_worker,
        image=image,
        engine_pvc=engine_pvc,
        name=name,
        namespace=namespace,
        router_mode=router_mode,
        migration_limit=migration_limit,
        engines_root=engines_dir,
        checkpoint=checkpoint,
        disaggregated=disaggregated,
        prefill_replicas=prefill_replicas,
        max_local_prefill_tokens=max_local_prefill_tokens,
    )
    path = write_deployment(recipe, out, opts, force=force)
    click.echo(f"wrote {path} (and README.md); checked against the v1beta1 layout the ai-dynamo wheel ships")
