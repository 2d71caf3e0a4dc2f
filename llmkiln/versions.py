"""Installed versions of the tools that can change what a build produces (recorded in manifests and keys)."""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib import metadata

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
    "openvino",
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
