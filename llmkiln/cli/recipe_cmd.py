"""`kiln recipes`, `kiln recipe show NAME`, `kiln recipe schema`."""

from __future__ import annotations

import json

import click
import yaml
from rich.console import Console
from rich.table import Table

from llmkiln.errors import RecipeError
from llmkiln.recipe import Recipe, list_recipes, load_recipe


@click.command()
@click.option("--paths", is_flag=True, help="Also show the file each recipe comes from.")
def recipes(paths: bool) -> None:
    """List the recipes (--recipes-dir / $LLMKILN_RECIPES, ./recipes, then the bundled ones) and what they do."""
    table = Table("recipe", "description", *(["file"] if paths else []), box=None)
    errors: list[str] = []
    for name, desc, file in list_recipes(errors):
        table.add_row(name, desc, *([str(file)] if paths else []))
    Console().print(table)
    if errors:  # listed above; exit 2 naming each file
        raise RecipeError("recipe files that cannot be read:\n  " + "\n  ".join(errors))


@click.group()
def recipe() -> None:
    """Inspect recipes."""


@recipe.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
def show(name: str, as_json: bool) -> None:
    """Print the resolved recipe NAME (extends merged, defaults filled): the fields its backend reads."""
    r, _ = load_recipe(name)
    data = r.for_backend()
    click.echo(
        json.dumps(data, indent=2) if as_json else yaml.safe_dump(data, sort_keys=False), nl=not as_json
    )


@recipe.command("schema")
def schema() -> None:
    """Print the recipe JSON schema (every field, its type, default and description)."""
    click.echo(json.dumps(Recipe.model_json_schema(), indent=2))
