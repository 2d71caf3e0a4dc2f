"""The stage API: what a build stage is, what it may read (BuildContext), and which stages each backend runs.

   class MyStage:
       name = "calibration"          # unique; also the manifest key its result is stored under
       version = "1"                 # bump when the stage's code changes what it writes
       cacheable = False             # True: output cached by key (see llmkiln.build.build_cache)
       def check(self, ctx) -> None: ...            # optional; raise BadInput before anything is written
       def describe(self, ctx): ...                 # optional; the stage's own plan text for --dry-run
       def build_key_extra(self, ctx): ...          # optional; inputs outside the recipe, added to the build key
       def cache_key(self, ctx) -> dict: ...        # JSON-able inputs that determine the output
       def run(self, ctx, out_dir: Path) -> dict: ...   # write files into out_dir, return the manifest part
- A non-cacheable stage runs with out_dir = ctx.work_dir, the engine folder being assembled (it already holds
  the earlier stages' files). A cacheable stage (the expensive ONNX export) runs into
  engines/.stages/<name>/<key digest>/ and its files are copied (cloned where the filesystem can) into the engine
  folder; the next build with the same key reuses them, so recipes differing only in runtime fields share one
  export. (Not hard links: onnx.load refuses external data files with several links.)
- STAGE_REGISTRY maps a backend to its ordered stages, as "module:Class" strings (imported lazily, so a no-op
  build never imports torch) or Stage instances. Add yours with one line, or at run time with register_stage().
- ctx.options carries `dry_run` and `allow_quality_regression` for stages that honour them; ctx.scratch is a
  dict for passing values between stages.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from llmkiln.build.model_source import ModelLocation
from llmkiln.build.progress import BuildProgress
from llmkiln.errors import BuildFailed
from llmkiln.recipe import Recipe

# backend -> ordered stages ("module:Class" or a Stage instance)
STAGE_REGISTRY: dict[str, list[Any]] = {
    "onnx-cpu": [
        "llmkiln.build.onnx_export:OnnxExportStage",
        "llmkiln.build.onnx_export:TokenizerStage",
        "llmkiln.calibration.stage:CpuCalibrationStage",
    ],
    "onnx-gpu": [
        "llmkiln.build.onnx_export:OnnxExportStage",
        "llmkiln.build.onnx_export:TokenizerStage",
        "llmkiln.build.onnx_gpu:OnnxTrtEngineStage",
    ],
    "trtllm": [
        "llmkiln.build.trtllm_stage:TrtllmCheckpointStage",
        "llmkiln.calibration.stage:FakeQuantQualityStage",
        "llmkiln.build.trtllm_stage:TrtllmTokenizerStage",
        "llmkiln.build.trtllm_stage:TrtllmRepoStage",
        "llmkiln.build.trtllm_stage:TrtllmEngineStage",
    ],
}


@runtime_checkable
class Stage(Protocol):
    """One build step; see the module docstring."""

    name: str
    version: str
    cacheable: bool

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]: ...

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]: ...


@dataclass
class BuildOptions:
    """Switches passed through from `kiln build`."""

    force: bool = False
    dry_run: bool = False
    allow_quality_regression: bool = False


@dataclass
class BuildContext:
    """Everything a stage may read. `work_dir` is the engine folder being assembled (None in dry runs)."""

    recipe: Recipe
    recipe_file: Path
    engines_root: Path
    source: ModelLocation
    source_hashes: dict[str, str]
    tool_versions: dict[str, str]
    progress: BuildProgress
    options: BuildOptions
    work_dir: Path | None = None
    scratch: dict[str, Any] = field(default_factory=dict)
    known_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def engine_dir(self) -> Path:
        return self.engines_root / self.recipe.name


def register_stage(backend: str, stage: Any, index: int | None = None) -> None:
    """Add a stage (instance or "module:Class") to a backend's list, at `index` or at the end."""
    stages = STAGE_REGISTRY.setdefault(backend, [])
    stages.insert(len(stages) if index is None else index, stage)


def _instantiate(entry: Any) -> Stage:
    if isinstance(entry, str):
        module_name, attr = entry.split(":")
        return getattr(importlib.import_module(module_name), attr)()
    return entry


def stages_for(backend: str) -> list[Stage]:
    """The backend's stages, in order, instantiated (BuildFailed when it has none)."""
    entries = STAGE_REGISTRY.get(backend) or []
    if not entries:
        raise BuildFailed(f"backend {backend!r}: no build stages are available for it in this installation")
    return [_instantiate(e) for e in entries]
