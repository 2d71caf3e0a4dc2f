"""What the GPU host has, checked against the pins and the recipe before `kiln build --resume` runs anything.

`gpu_status()` (llmkiln.trtllm.engine_build) only says whether CUDA and TensorRT-LLM are there at all;
`check_host(recipe)` then compares `tensorrt_llm.__version__` and `tensorrt.__version__` with pins.json and the
GPU's compute capability with what the recipe needs (FP8: SM 8.9+), and raises one NeedsGpuHost (exit 3) that
names everything found and everything needed. The probes are plain imports and torch.cuda queries, so a test
can put stand-in `tensorrt_llm` / `tensorrt` modules on sys.path.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from llmkiln.errors import NeedsGpuHost
from llmkiln.recipe import Recipe
from llmkiln.trtllm import pins


@dataclass(frozen=True)
class HostFacts:
    """Versions and devices found on this host (None: not importable / no CUDA device)."""

    tensorrt_llm: str | None
    tensorrt: str | None
    compute_capability: tuple[int, int] | None
    device: str | None
    errors: tuple[str, ...] = field(default_factory=tuple)


def _version(module: str) -> tuple[str | None, str | None]:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a CUDA/TensorRT library error raised at import
        return None, f"import {module} failed: {type(exc).__name__}: {exc}"
    version = getattr(mod, "__version__", None)  # an external module: no typed attribute to read
    return (str(version) if version is not None else "unknown"), None


def probe_host() -> HostFacts:
    """Import tensorrt_llm and tensorrt, ask torch for device 0's compute capability. Never raises."""
    errors: list[str] = []
    trtllm, err = _version("tensorrt_llm")
    errors += [err] if err else []
    trt, err = _version("tensorrt")
    errors += [err] if err else []
    cc, device = None, None
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            cc, device = (int(major), int(minor)), str(torch.cuda.get_device_name(0))
        else:
            errors.append(f"torch {torch.__version__}: torch.cuda.is_available() is False")
    except Exception as exc:  # a broken torch install is "no GPU", with the reason
        errors.append(f"import torch failed: {exc}")
    return HostFacts(trtllm, trt, cc, device, tuple(errors))


def required_compute_capability(recipe: Recipe) -> tuple[int, int]:
    """FP8 weights / FP8 KV need SM 8.9 (Ada, Hopper, Blackwell)."""
    if recipe.precision == "fp8" or recipe.kv_cache.dtype == "fp8":
        major, minor = str(pins.pin("fp8_min_compute_capability")).split(".")
        return int(major), int(minor)
    return (8, 0)


def host_problems(recipe: Recipe, facts: HostFacts) -> list[str]:
    """Each mismatch as 'found X, needs Y'."""
    problems = []
    want_llm, want_trt = str(pins.pin("tensorrt_llm")), str(pins.pin("tensorrt"))
    if facts.tensorrt_llm is None:
        problems.append(f"tensorrt_llm: not importable, needs {want_llm}")
    elif facts.tensorrt_llm != want_llm:
        problems.append(f"tensorrt_llm {facts.tensorrt_llm} found, needs {want_llm}")
    # TensorRT engines are tied to the TensorRT version: compare major.minor.patch (the build number may vary)
    if facts.tensorrt is None:
        problems.append(f"tensorrt: not importable, needs {want_trt}")
    elif pins.version_tuple(facts.tensorrt, 3) != pins.version_tuple(want_trt, 3):
        problems.append(f"tensorrt {facts.tensorrt} found, needs {want_trt}")
    need = required_compute_capability(recipe)
    if facts.compute_capability is None:
        problems.append(f"GPU: none found, needs compute capability >= {need[0]}.{need[1]}")
    elif facts.compute_capability < need:
        cc = facts.compute_capability
        problems.append(
            f"GPU {facts.device} has compute capability {cc[0]}.{cc[1]}, needs >= {need[0]}.{need[1]} "
            f"(recipe {recipe.name}: precision {recipe.precision}, kv_cache.dtype {recipe.kv_cache.dtype})"
        )
    return problems


def check_host(recipe: Recipe, facts: HostFacts | None = None) -> HostFacts:
    """NeedsGpuHost (exit 3) with every mismatch, or the facts when the host fits the pins and the recipe."""
    facts = facts if facts is not None else probe_host()
    problems = host_problems(recipe, facts)
    if problems:
        details = f" ({'; '.join(facts.errors)})" if facts.errors else ""
        raise NeedsGpuHost(
            f"this host does not match the pinned TensorRT-LLM generation: {'; '.join(problems)}{details}. "
            f"Run it in the container {pins.container()} on a GPU with compute capability >= "
            f"{'.'.join(map(str, required_compute_capability(recipe)))}"
        )
    return facts
