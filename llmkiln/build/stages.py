"""The stage API: what a build stage is and what it may read (BuildContext).

   class MyStage:
       name = "calibration"          # unique; also the manifest key its result is stored under
       version = "1"                 # bump when the stage's code changes what it writes
       cacheable = False             # True: output cached by key (see llmkiln.build.build_cache)
       def check(self, ctx) -> None: ...            # optional; raise BadInput before anything is written
       def describe(self, ctx) -> str: ...          # optional; the stage's own plan text for --dry-run
       def build_key_extra(self, ctx) -> dict | None: ...  # optional; inputs outside the recipe, in the build key
       def cache_key(self, ctx) -> dict: ...        # JSON-able inputs that determine the output
       def run(self, ctx, out_dir: Path) -> dict: ...   # write files into out_dir, return the manifest part
- A non-cacheable stage runs with out_dir = ctx.work_dir, the engine folder being assembled (it already holds
  the earlier stages' files). A cacheable stage (the expensive ONNX export) runs into
  engines/.stages/<name>/<key digest>/ and its files are copied (cloned where the filesystem can) into the engine
  folder; the next build with the same key reuses them, so recipes differing only in runtime fields share one
  export. (Not hard links: onnx.load refuses external data files with several links.)
- Which stages build which backend is decided above this room (llmkiln.backends), so that stages of the rooms
  built on top of this one (calibration, trtllm) can take part; the pipeline receives the list in ctx.stages.
- ctx.options carries `force`, `dry_run` and `allow_quality_regression`; ctx.scratch is a dict for passing values
  between stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from llmkiln.build.model_source import ModelLocation
from llmkiln.build.progress import BuildProgress
from llmkiln.capabilities import Backend
from llmkiln.recipe import Recipe


@runtime_checkable
class Stage(Protocol):
    """One build step; see the module docstring."""

    name: str
    version: str
    cacheable: bool

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]: ...

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]: ...


# backend name -> its stages, in order (llmkiln.backends.stages_for)
StageSource = Callable[[Backend], list[Stage]]


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
    stages: list[Stage] = field(default_factory=list)
    work_dir: Path | None = None
    scratch: dict[str, Any] = field(default_factory=dict)
    known_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def engine_dir(self) -> Path:
        return self.engines_root / self.recipe.name

    def require_work_dir(self) -> Path:
        """The folder being assembled; only stages' run() may ask (it is None in dry runs)."""
        if self.work_dir is None:
            raise RuntimeError("BuildContext.work_dir is set by build_engine before stages run")
        return self.work_dir
