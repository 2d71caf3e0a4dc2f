"""`kiln model init KIND OUT [--seed N]`: write a deterministic random Llama in Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path

import click

from llmkiln.build.generate import MODEL_KINDS, WEIGHTS_FILE, ModelKind, generate_model, summarize_model


@click.group()
def model() -> None:
    """Generated models."""


@model.command("init")
@click.argument("kind", type=click.Choice(MODEL_KINDS))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Weight seed.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of text.")
def init(kind: ModelKind, out: Path, seed: int, as_json: bool) -> None:  # kind: click.Choice(MODEL_KINDS)
    """Write a deterministic random Llama KIND (tiny-llama | bench-llama-125m | gpu-smoke-llama) into the folder OUT.

    Same KIND and seed give byte-identical files. OUT must not exist, be empty, or already hold exactly this model.
    """
    summary = summarize_model(generate_model(kind, out, seed))
    if as_json:
        data = {
            "kind": kind,
            "seed": seed,
            "path": str(summary.path),
            "num_parameters": summary.num_parameters,
            "files": {
                n: {"sha256": h, "bytes": summary.file_bytes[n]} for n, h in summary.file_sha256.items()
            },
        }
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"{kind} (seed {seed}): {summary.num_parameters:,} parameters in {summary.path}")
    for name, digest in summary.file_sha256.items():
        click.echo(f"  {name:<24} {summary.file_bytes[name]:>12,} B  sha256 {digest}")
    click.echo(f"weights sha256: {summary.file_sha256[WEIGHTS_FILE]}")
