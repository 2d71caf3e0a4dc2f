"""Serve-room fixtures: a minimal engine folder for repository tests, the stand-in engine plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


@pytest.fixture
def recipe_engine_dir(tmp_path: Path) -> Path:
    """A folder that looks like an engine to the repository code (recipe.resolved.yaml only)."""
    from llmkiln.recipe import load_recipe

    recipe, _ = load_recipe("stories-fp32")
    d = tmp_path / "engine"
    d.mkdir()
    (d / "recipe.resolved.yaml").write_text(recipe.to_yaml())
    return d
