"""`kiln generate ENGINE PROMPT`: stream a completion to stdout through the CPU runtime (llmkiln.runtime's
batching engine, the same one `kiln serve` hosts)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import resolve_engine
from llmkiln.runtime.detokenizer import IncrementalDetokenizer
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import SamplingParams


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
@click.option(
    "--verify",
    "verify_full",
    is_flag=True,
    hidden=True,
    help="Kept for old scripts: every engine file is re-hashed before every load anyway.",
)
@engines_dir_option
def generate(
    engine: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int | None,
    ignore_eos: bool,
    verify_full: bool,
    engines_dir: Path,
) -> None:
    """Stream the continuation of PROMPT from ENGINE (an engine folder, or a recipe name under the engines root)."""
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        ignore_eos=ignore_eos,
    )
    folder = resolve_engine(engine, engines_dir).require()
    del verify_full  # every load re-hashes every file
    folder.verify()  # a corrupted engine is never loaded (IntegrityError, exit 1)
    manifest = folder.manifest()
    if manifest is not None and manifest.source.generated:
        click.secho(
            f"note: {folder.path.name} was built from a generated model ({manifest.source.generated}, random "
            "weights): its text is gibberish by design; build a trained model for real text "
            "(e.g. `kiln build RECIPE --model /path/to/hf-model`)",
            fg="yellow",
            err=True,
        )
    runtime = load_engine(folder).start()
    try:
        prompt_ids = runtime.encode(prompt)
        handle = runtime.submit(prompt_ids, params)
        detok = IncrementalDetokenizer(runtime, prompt_ids)  # the engine decodes (encode() found a tokenizer)
        for event in handle:
            if event.token_id is not None and (piece := detok.push(event.token_id)):
                sys.stdout.write(piece)
                sys.stdout.flush()
        sys.stdout.write(detok.flush() + "\n")
    finally:
        runtime.shutdown()
