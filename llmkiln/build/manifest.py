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
from llmkiln.build.weights import list_source_files, sha256_file

MANIFEST_NAME = "manifest.json"
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


def read_manifest(engine_dir: Path) -> dict[str, Any] | None:
    """The manifest of an engine folder, or None when absent or unreadable."""
    path = Path(engine_dir) / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def engine_files_present(engine_dir: Path, manifest: dict[str, Any]) -> bool:
    """True when every file the manifest lists still exists (a cheap check: no re-hashing)."""
    files = manifest.get("engine_files") or {}
    return bool(files) and all((engine_dir / rel).is_file() for rel in files)
