"""`kiln diagnose`: why the first token is slow, from a server's metrics, a saved snapshot or a bench report."""

from __future__ import annotations

from pathlib import Path

import click

from llmkiln.cli.options import engines_dir_option
from llmkiln.diagnose.diagnosis import diagnose as run_diagnosis
from llmkiln.diagnose.render import print_diagnosis
from llmkiln.engine_dir import resolve_engine
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe, load_recipe


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--metrics", "metrics_urls", multiple=True, help="A /metrics URL to scrape (repeatable).")
@click.option(
    "--engine", default=None, help="Engine folder (or recipe name under the engines root): its recipe."
)
@engines_dir_option
@click.option(
    "--recipe", "recipe_name", default=None, help="The current recipe (name or file), instead of --engine."
)
@click.option(
    "--recipe-overlay",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the recommended changes here as a recipe that extends the current one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
def diagnose(
    files: tuple[Path, ...],
    metrics_urls: tuple[str, ...],
    engine: str | None,
    engines_dir: Path,
    recipe_name: str | None,
    recipe_overlay: Path | None,
    as_json: bool,
) -> None:
    """Fill the symptom -> likely cause -> next step table from FILES (saved Prometheus snapshots or `kiln bench`
    JSON reports) and/or --metrics URLs (llmkiln, Triton nv_inference_*, Dynamo frontend metrics)."""
    if engine and recipe_name:
        raise BadInput("give --engine or --recipe, not both")
    recipe: Recipe | None = None
    recipe_file: Path | None = None
    if engine:
        recipe = resolve_engine(engine, engines_dir).recipe()
    elif recipe_name:
        recipe, recipe_file = load_recipe(recipe_name)
    result = run_diagnosis(list(metrics_urls), list(files), recipe, recipe_overlay, recipe_file)
    if as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        print_diagnosis(result)
