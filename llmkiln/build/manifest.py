"""Assembling an engine's manifest (its format and reader are llmkiln.engine_dir's Manifest).

Keys: format, recipe, recipe_file, recipe_sha256, build_key, backend, precision, source {path, generated?, seed?,
weights, files}, engine_files {name: sha256}, tool_versions, stages [{name, seconds, cached, key}], one entry per
stage with the dict that stage returned (e.g. "export", "calibration"), build_seconds, built_at.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmkiln.build.weights import split_weight_hashes
from llmkiln.engine_dir import MANIFEST, MANIFEST_FORMAT
from llmkiln.hashing import list_files, sha256_file

if TYPE_CHECKING:
    from llmkiln.build.stages import BuildContext


def hash_engine_files(engine_dir: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """{relative path: sha256} of every engine file except the manifest; `known` hashes are reused."""
    known = known or {}
    out = {}
    for f in list_files(engine_dir):
        rel = f.relative_to(engine_dir).as_posix()
        if rel == MANIFEST:
            continue
        out[rel] = known.get(rel) or sha256_file(f)
    return out


def manifest_head(ctx: BuildContext, build_key: str) -> dict[str, Any]:
    """The manifest keys that describe the inputs (recipe, build key, source, tool versions); the pipeline adds
    the outputs, a TRT-LLM plan keeps it as the draft a resume completes."""
    weights, other = split_weight_hashes(ctx.source_hashes)
    return {
        "format": MANIFEST_FORMAT,
        "recipe": ctx.recipe.name,
        "recipe_file": str(ctx.recipe_file),
        "recipe_sha256": ctx.recipe.compute_hash(),
        "build_key": build_key,
        "backend": ctx.recipe.backend,
        "precision": ctx.recipe.precision,
        "source": {**ctx.source.describe(), "weights": weights, "files": other},
        "tool_versions": ctx.tool_versions,
    }
