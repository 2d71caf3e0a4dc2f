"""`--recipe-overlay OUT`: the table's recipe changes as a recipe that `extends` the current one, validated by
llmkiln.recipe before it is written (atomically)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe, load_raw, merge, recipe_path, resolve_model_path, validate

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def nest(changes: Mapping[str, Any]) -> dict[str, Any]:
    """{"scheduler.max_batch_size": 16} -> {"scheduler": {"max_batch_size": 16}}."""
    out: dict[str, Any] = {}
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def write_overlay(
    out: Path,
    parent: str,
    changes: Mapping[str, Any],
    why: Mapping[str, str],
    source: str,
    parent_file: Path | None = None,
) -> Recipe:
    """Write the overlay recipe `out` (name = its file name) extending recipe `parent` (whose file is
    `parent_file` when known); returns it validated."""
    out = Path(out)
    if out.suffix not in (".yaml", ".yml") or not _NAME.match(out.stem):
        raise BadInput(
            f"--recipe-overlay {out}: give a .yaml file whose name is a recipe name (lower case letters, digits, "
            "'.', '_', '-'), e.g. stories-fp32-diagnosed.yaml"
        )
    if out.stem == parent:
        raise BadInput(f"--recipe-overlay {out}: the overlay must not have the name of the recipe it extends")
    found = out.parent / f"{parent}.yaml"
    resolved = found.resolve() if found.is_file() else recipe_path(parent)
    if parent_file is not None and resolved != Path(parent_file).resolve():
        raise BadInput(
            f"--recipe-overlay {out}: it extends {parent!r} by name, which resolves to {resolved} from there, "
            f"not to {parent_file}: write the overlay next to {parent_file} or add `kiln --recipes-dir "
            f"{Path(parent_file).parent}`"
        )
    parent_file = resolved
    base = load_raw(parent_file)
    body: dict[str, Any] = {
        "name": out.stem,
        "description": f"{parent} with the changes `kiln diagnose` recommends",
        "extends": parent,
    }
    parent_recipe = validate(base, str(parent_file))
    model = resolve_model_path(parent_recipe, parent_file)
    given = parent_recipe.model.path
    if model is not None and given is not None and out.parent.resolve() != parent_file.parent:
        # model.path is relative to the recipe file that is loaded: keep pointing at the parent's model
        absolute = Path(os.path.expanduser(given)).is_absolute()
        body["model"] = {"path": given if absolute else os.path.relpath(model, out.parent.resolve())}
    body = merge(body, nest(changes))
    merged = merge({k: v for k, v in base.items() if k not in ("name", "description")}, body)
    merged.pop("extends", None)
    recipe = validate(merged, str(out))
    lines = [f"# written by `kiln diagnose` from {source}", "# why:"]
    lines += [f"#   {field}: {reason}" for field, reason in why.items()]
    write_text_atomic(out, "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, width=110))
    return recipe
