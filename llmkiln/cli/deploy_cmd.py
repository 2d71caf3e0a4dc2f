"""`kiln deploy dynamo RECIPE -o DIR`: a Kubernetes DynamoGraphDeployment for a recipe's engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llmkiln.cli.options import engines_dir_option, launch_fields, launch_options
from llmkiln.dynamo.deploy import DeployOptions, write_deployment

_DEPLOY = DeployOptions()


@click.group()
def deploy() -> None:
    """Write deployment manifests for an engine."""


@deploy.command("dynamo")
@click.argument("recipe")
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@launch_options(workers_names=("--workers", "--replicas"))
@click.option(
    "--threads-per-worker",
    type=int,
    default=_DEPLOY.threads_per_worker,
    show_default=True,
    help="CPUs (and intra-op threads) per CPU worker pod.",
)
@click.option(
    "--image", default=None, help="Container image with llmkiln + ai-dynamo (default llmkiln:<version>)."
)
@click.option(
    "--engine-pvc", default=_DEPLOY.engine_pvc, show_default=True, help="PVC holding engines/<recipe>/."
)
@click.option("--name", default=None, help="metadata.name (default llmkiln-<recipe>).")
@click.option("--namespace", default=None, help="metadata.namespace.")
@engines_dir_option
@click.option(
    "--checkpoint",
    default=None,
    help="trtllm-llmapi: the HF checkpoint folder on the volume (default <recipe>/hf_checkpoint).",
)
@click.option("--force", is_flag=True, help="Replace a non-empty --out folder.")
def dynamo(
    recipe: str,
    out: Path,
    threads_per_worker: int,
    image: str | None,
    engine_pvc: str,
    name: str | None,
    namespace: str | None,
    engines_dir: Path,
    checkpoint: str | None,
    force: bool,
    **launch: Any,  # launch_options: the Dynamo graph, as `kiln serve --dynamo` takes it
) -> None:
    """DynamoGraphDeployment (nvidia.com/v1beta1): Dynamo frontend + llmkiln CPU workers (onnx-cpu and openvino-cpu
    recipes) or dynamo.trtllm workers with their --extra-engine-args YAML (trtllm-llmapi recipes); engines as a
    volume. --prefill-workers P --decode-workers D: prefill and decode components instead of aggregated workers;
    the launch flags are `kiln serve --dynamo`'s, checked the same way (a flag that does not apply: exit 2)."""
    opts = DeployOptions(
        **launch_fields(launch),
        threads_per_worker=threads_per_worker,
        image=image,
        engine_pvc=engine_pvc,
        name=name,
        namespace=namespace,
        engines_root=engines_dir,
        checkpoint=checkpoint,
    )
    path = write_deployment(recipe, out, opts, force=force)
    click.echo(f"wrote {path} (and README.md); checked against the v1beta1 layout the ai-dynamo wheel ships")
