"""`kiln generate ENGINE PROMPT`: stream a completion to stdout (single sequence, plain onnxruntime)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmkiln.errors import BadInput


def _engine_dir(engine: str) -> Path:
    path = Path(engine)
    if path.is_dir():
        return path
    candidate = Path("engines") / engine
    if candidate.is_dir():
        return candidate
    raise BadInput(
        f"engine {engine!r}: no such folder (nor engines/{engine}); build it with `kiln build RECIPE`"
    )


@click.command()
@click.argument("engine")
@click.argument("prompt")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="Tokens to generate at most.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass (1 = off).")
@click.option(
    "--top-k", type=int, default=0, show_default=True, help="Sample among the k most likely (0 = off)."
)
@click.option("--seed", type=int, default=None, help="Seed for sampling (reproducible output).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating after the end-of-sequence token.")
def generate(
    engine: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    ignore_eos: bool,
) -> None:
    """Stream the continuation of PROMPT from ENGINE (an engine folder, or a recipe name under engines/)."""
    from llmkiln.runtime.sampling import SamplingConfig
    from llmkiln.runtime.simple import stream_text

    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    for piece in stream_text(
        _engine_dir(engine), prompt, max_tokens, sampling, seed, stop_at_eos=not ignore_eos
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
