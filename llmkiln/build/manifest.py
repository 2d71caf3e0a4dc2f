"""The engine manifest (engines/<recipe>/manifest.json): what was built, from what, with which tools.

Keys: format, recipe, recipe_sha256, build_key, backend, precision, source {path, generated?, seed?, weights,
files}, engine_files {name: sha256}, tool_versions, stages [{name, seconds, cached, key}], one entry per stage
with the dict that stage returned (e.g. "export", "calibration"), build_seconds, built_at.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from llmkiln.atomic import write_json_atomic as write_json_atomic  # re-exported: it used to live here
from llmkiln.build.weights import list_source_files, sha256_file, split_weight_hashes

MANIFEST_NAME = "manifest.json"
RESOLVED_RECIPE_NAME = "recipe.resolved.yaml"  # the recipe as validated, written next to the manifest
MANIFEST_FORMAT = 1

# Distributions whose versions can change what a build produces.
TOOL_PACKAGES = (
    "llmkiln",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-genai",
    "onnxruntime-genai-cuda",
    "onnx",
    "onnx-ir",
    "transformers",
    "tokenizers",
    "torch",
    "numpy",
    "nvidia-modelopt",
    "tensorrt_llm",
)


def package_versions(names: Iterable[str]) -> dict[str, str]:
    """{distribution: version} of those of `names` that are installed (absent ones are left out)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def tool_versions() -> dict[str, str]:
    """{distribution: version} of the installed build tools (absent ones are left out), plus python."""
    return {"python": platform.python_version(), **package_versions(TOOL_PACKAGES)}


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON form of obj (sorted keys)."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def hash_engine_files(engine_dir: Path, known: dict[str, str] | None = None) -> dict[str, str]:
    """{relative path: sha256} of every engine file except the manifest; `known` hashes are reused."""
    known = known or {}
    out = {}
    for f in list_source_files(engine_dir):
        rel = f.relative_to(engine_dir).as_posix()
        if rel == MANIFEST_NAME:
            continue
        out[rel] = known.get(rel) or sha256_file(f)
    return out


def manifest_head(ctx: Any, build_key: str) -> dict[str, Any]:
    """The manifest keys that describe the inputs (recipe, build key, source, tool versions), from a BuildContext;
    the pipeline adds the outputs, a TRT-LLM plan keeps it as the draft a resume completes."""
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


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, or None when it is absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_manifest(engine_dir: Path) -> dict[str, Any] | None:
    """The manifest of an engine folder, or None when absent or unreadable."""
    return read_json(Path(engine_dir) / MANIFEST_NAME)


def engine_files_present(engine_dir: Path, manifest: dict[str, Any]) -> bool:
    """True when every file the manifest lists still exists (a cheap check: no re-hashing)."""
    files = manifest.get("engine_files") or {}
    return bool(files) and all((engine_dir / rel).is_file() for rel in files)
