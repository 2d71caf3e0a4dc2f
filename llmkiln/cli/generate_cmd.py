"""`kiln generate ENGINE PROMPT [--chat [--system TEXT]]`: stream a completion (or, with --chat, the assistant's
reply to PROMPT as a user message, rendered with the engine's chat template exactly as the OpenAI chat endpoint
renders it) to stdout through the CPU runtime (llmkiln.runtime's batching engine, the same one `kiln serve`
hosts). Generation stops at the model's end tokens (EngineDir.stop_token_ids); special tokens are not printed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.requests import PromptRequest
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
    "--chat",
    is_flag=True,
    help="PROMPT is a user message: render it with the engine's chat template and print the assistant's reply.",
)
@click.option(
    "--system",
    default=None,
    help="With --chat: a system message first (else the template's own default, if it has one).",
)
@click.option("--show-prompt", is_flag=True, help="Print the prompt text the engine sees (stderr) first.")
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
    chat: bool,
    system: str | None,
    show_prompt: bool,
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
    if system is not None and not chat:
        raise BadInput("--system needs --chat (a system message only exists in a chat)")
    if chat:
        messages = [*([("system", system)] if system is not None else []), ("user", prompt)]
        encoder = PromptEncoder.from_engine(folder)
        request = PromptRequest(lineno=0, data={}, messages=tuple(messages))
        text = encoder.render(request)
        prompt_ids = encoder.encode_requests([request], [text])[0]
    else:
        text = prompt
        prompt_ids = None
    if show_prompt:
        click.echo(text, err=True)
    runtime = load_engine(folder).start()
    try:
        if prompt_ids is None:
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
