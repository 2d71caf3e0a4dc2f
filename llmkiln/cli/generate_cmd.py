"""`kiln generate ENGINE PROMPT`: stream a completion to stdout through the CPU runtime (llmkiln.runtime)."""

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
    from llmkiln.runtime.detokenizer import IncrementalDetokenizer
    from llmkiln.runtime.engine import LLMEngine
    from llmkiln.runtime.request import SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        ignore_eos=ignore_eos,
    )
    engine = LLMEngine.from_engine_dir(_engine_dir(engine)).start()
    try:
        prompt_ids = engine.encode(prompt)
        handle = engine.submit(prompt_ids, params)
        detok = IncrementalDetokenizer(engine.tokenizer, prompt_ids)
        for event in handle:
            if event.token_id is not None and (piece := detok.push(event.token_id)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        sys.stdout.write(detok.flush() + "\n")
    finally:
        engine.shutdown()
