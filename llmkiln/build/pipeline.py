"""The build pipeline: recipe → ordered stages → engines/<recipe>/, renamed into place only when complete.

How a build runs (build_engine):
 1. Load and validate the recipe (RecipeError, exit 2), resolve the model folder (missing → BadInput naming
    `model.path`), run every stage's optional `check(ctx)`. Nothing is written before this point.
 2. Hash the source files (sha256, cached by size+mtime in engines/.cache/hashes.json) and compute the whole-build
    key = recipe hash + source hashes + tool versions + stage names/versions. If engines/<recipe>/manifest.json
    carries the same key (and its files exist), the build is a no-op ("up to date"); `force=True` rebuilds.
 3. Run the backend's stages in order into a temp folder engines/.tmp-<recipe>@*/, write recipe.resolved.yaml and
    manifest.json, then rename the folder to engines/<recipe>. Any exception removes the temp folder, so an
    interrupted build never leaves a half-written engines/<recipe>.

Stage API (so other rooms plug in stages):
    class MyStage:
        name = "calibration"          # unique; also the manifest key its result is stored under
        version = "1"                 # bump when the stage's code changes what it writes
        cacheable = False             # True: output cached by key (see below)
        def check(self, ctx) -> None: ...            # optional; raise BadInput before anything is written
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

import fcntl
import importlib
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from llmkiln.atomic import atomic_dir, remove_dir, write_json_atomic
from llmkiln.build.logs import output_to
from llmkiln.build.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    digest,
    engine_files_present,
    hash_engine_files,
    read_manifest,
    tool_versions,
)
from llmkiln.build.model_source import ModelLocation, generated_model_dir, resolve_source
from llmkiln.build.progress import BuildProgress, QuietProgress
from llmkiln.build.weights import HashCache, hash_model_dir, split_weight_hashes
from llmkiln.errors import BuildFailed
from llmkiln.recipe import Recipe, load_recipe

RESOLVED_RECIPE_NAME = "recipe.resolved.yaml"
STAGE_META_NAME = "stage.json"
STAGE_LOG_NAME = "stage.log"

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


@dataclass
class BuildResult:
    """What build_engine returns. `cached`: the engine was already up to date and nothing was done."""

    engine_dir: Path
    cached: bool
    manifest: dict[str, Any]
    seconds: float
    dry_run: bool = False


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
    entries = STAGE_REGISTRY.get(backend) or []
    if not entries:
        raise BuildFailed(f"backend {backend!r}: no build stages are available for it in this installation")
    return [_instantiate(e) for e in entries]


def _stage_digest(stage: Stage, key: dict[str, Any]) -> str:
    return digest({"stage": stage.name, "version": stage.version, "key": key})


def build_key(
    recipe: Recipe,
    source_hashes: dict[str, str],
    tools: dict[str, str],
    stages: list[Stage],
    ctx: BuildContext | None = None,
) -> str:
    """The whole-build cache key: recipe hash + source file hashes + tool versions + stage names/versions,
    plus each stage's optional `build_key_extra(ctx)` (inputs outside the recipe, e.g. calibration set contents)."""
    data = {
        "recipe": recipe.compute_hash(),
        "source": source_hashes,
        "tools": tools,
        "stages": [[s.name, s.version] for s in stages],
        "format": MANIFEST_FORMAT,
    }
    extra = {
        s.name: s.build_key_extra(ctx) for s in stages if ctx is not None and hasattr(s, "build_key_extra")
    }
    if extra:
        data["stage_inputs"] = extra
    return digest(data)


@contextmanager
def _lock(engines_root: Path, name: str) -> Iterator[None]:
    """Serialize builds of one recipe across processes (engines/.locks/<name>.lock)."""
    lock_dir = engines_root / ".locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _clone_file(src: Path, dst: Path) -> None:
    """Copy src to dst: a copy-on-write clone where the filesystem has one (FICLONE), else an in-kernel copy.

    NOTE: not hard links: onnx refuses external data files with several links ("potential hardlink attack").
    """
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return
        except OSError:
            pass
    shutil.copyfile(src, dst)


_FICLONE = 0x40049409


def _copy_tree(src: Path, dst: Path, skip: set[str]) -> None:
    """Copy every file of a stage cache folder into the engine folder being assembled."""
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src)
        if f.is_dir() or rel.as_posix() in skip:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        _clone_file(f, target)


def _run_cached_stage(
    stage: Stage, ctx: BuildContext, key_digest: str, key: dict[str, Any]
) -> tuple[dict, bool]:
    """Run a cacheable stage into engines/.stages/<name>/<digest>/ (or reuse it); copy its files into work_dir."""
    assert ctx.work_dir is not None  # internal invariant: set by build_engine before stages run
    cache_dir = ctx.engines_root / ".stages" / stage.name / key_digest[:24]
    meta_path = cache_dir / STAGE_META_NAME
    meta = None if ctx.options.force else _read_json(meta_path)
    cached = meta is not None
    if meta is None:

        def publish(tmp: Path, final: Path) -> None:
            nonlocal meta
            if final.exists() and (ctx.options.force or _read_json(meta_path) is None):
                remove_dir(final)  # forced, or left incomplete
            try:
                tmp.rename(final)
            except OSError:  # a concurrent build published the same key meanwhile: use theirs (same inputs)
                meta = _read_json(meta_path) or meta

        with atomic_dir(cache_dir, prefix=f".tmp-{key_digest[:12]}-", mode=0o755, publish=publish) as tmp:
            part = stage.run(ctx, tmp)
            files = hash_engine_files(tmp)
            files = {k: v for k, v in files.items() if k not in (STAGE_META_NAME, STAGE_LOG_NAME)}
            meta = {"stage": stage.name, "version": stage.version, "key": key, "result": part, "files": files}
            write_json_atomic(tmp / STAGE_META_NAME, meta)
    _copy_tree(cache_dir, ctx.work_dir, skip={STAGE_META_NAME, STAGE_LOG_NAME})
    ctx.known_hashes.update(meta.get("files", {}))
    return meta.get("result", {}), cached


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _remove_stale(engines_root: Path, name: str) -> None:
    """Temp/old folders of this recipe left by a killed build (we hold the recipe's lock, so none is live)."""
    for stale in [*engines_root.glob(f".tmp-{name}@*"), *engines_root.glob(f".old-{name}@*")]:
        shutil.rmtree(stale, ignore_errors=True)


def build_engine(
    recipe_name_or_path: str | os.PathLike[str],
    engines_root: Path = Path("engines"),
    force: bool = False,
    model_override: Path | None = None,
    progress: BuildProgress | None = None,
    *,
    dry_run: bool = False,
    allow_quality_regression: bool = False,
) -> BuildResult:
    """Build (or find up to date) the engine for a recipe; see the module docstring."""
    t0 = time.perf_counter()
    progress = progress or QuietProgress()
    options = BuildOptions(force=force, dry_run=dry_run, allow_quality_regression=allow_quality_regression)
    recipe, recipe_file = load_recipe(recipe_name_or_path)
    stages = stages_for(recipe.backend)
    engines_root = Path(engines_root).absolute()
    if model_override is None and recipe.model.generated is not None and not dry_run:
        target = generated_model_dir(engines_root, recipe.model.generated, recipe.model.seed)
        if not (target / "config.json").is_file():
            progress.info(f"generating model {recipe.model.generated} (seed {recipe.model.seed}) → {target}")
    source = resolve_source(recipe, recipe_file, engines_root, model_override, create=not dry_run)
    ctx = BuildContext(recipe, recipe_file, engines_root, source, {}, tool_versions(), progress, options)
    for stage in stages:
        check = getattr(stage, "check", None)
        if check is not None:
            check(ctx)

    engine_dir = ctx.engine_dir
    if dry_run:
        return _dry_run(ctx, stages, t0)

    with _lock(engines_root, recipe.name):
        hash_cache = HashCache(engines_root / ".cache" / "hashes.json")
        ctx.source_hashes = hash_model_dir(source.path, hash_cache)
        hash_cache.save()
        key = build_key(recipe, ctx.source_hashes, ctx.tool_versions, stages, ctx)
        existing = read_manifest(engine_dir)
        if (
            not force
            and existing is not None
            and existing.get("build_key") == key
            and engine_files_present(engine_dir, existing)
        ):
            seconds = time.perf_counter() - t0
            progress.finish({"engine_dir": str(engine_dir), "cached": True, "seconds": seconds})
            return BuildResult(engine_dir, True, existing, seconds)

        progress.start(recipe.name, str(engine_dir))
        _remove_stale(engines_root, recipe.name)
        # replace_dir: an older engine is moved aside, not deleted, until the new one is in place
        with atomic_dir(engine_dir, prefix=f".tmp-{recipe.name}@", mode=0o755) as tmp:
            ctx.work_dir = tmp
            manifest = _run_stages(ctx, stages, key, t0)
    seconds = time.perf_counter() - t0
    progress.finish({"engine_dir": str(engine_dir), "cached": False, "seconds": seconds})
    return BuildResult(engine_dir, False, manifest, seconds)


def _run_stages(ctx: BuildContext, stages: list[Stage], key: str, t0: float) -> dict[str, Any]:
    assert ctx.work_dir is not None  # internal invariant
    stage_records: list[dict[str, Any]] = []
    parts: dict[str, Any] = {}
    log_dir = ctx.engines_root / ".logs" / ctx.recipe.name
    log_dir.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        ctx.progress.stage_start(stage.name)
        ts = time.perf_counter()
        stage_key = stage.cache_key(ctx)
        key_digest = _stage_digest(stage, stage_key)
        log = log_dir / f"{stage.name}.log"
        try:
            with output_to(log):
                if stage.cacheable:
                    part, cached = _run_cached_stage(stage, ctx, key_digest, stage_key)
                else:
                    part, cached = stage.run(ctx, ctx.work_dir), False
        except Exception:
            ctx.progress.info(f"stage {stage.name} failed; its output is in {log}")
            raise
        seconds = time.perf_counter() - ts
        ctx.progress.stage_end(stage.name, seconds, cached)
        stage_records.append(
            {"name": stage.name, "seconds": round(seconds, 3), "cached": cached, "key": key_digest}
        )
        parts[stage.name] = part or {}

    (ctx.work_dir / RESOLVED_RECIPE_NAME).write_text(ctx.recipe.to_yaml())
    weights, other = split_weight_hashes(ctx.source_hashes)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "recipe": ctx.recipe.name,
        "recipe_file": str(ctx.recipe_file),
        "recipe_sha256": ctx.recipe.compute_hash(),
        "build_key": key,
        "backend": ctx.recipe.backend,
        "precision": ctx.recipe.precision,
        "source": {**ctx.source.describe(), "weights": weights, "files": other},
        "engine_files": hash_engine_files(ctx.work_dir, ctx.known_hashes),
        "tool_versions": ctx.tool_versions,
        "stages": stage_records,
        **parts,
        "build_seconds": round(time.perf_counter() - t0, 3),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_json_atomic(ctx.work_dir / MANIFEST_NAME, manifest)
    return manifest


def _dry_run(ctx: BuildContext, stages: list[Stage], t0: float) -> BuildResult:
    """Report what a build would do (stage keys, whether each is cached) without writing anything."""
    src = ctx.source.path
    if src.is_dir():
        ctx.source_hashes = hash_model_dir(src, HashCache(ctx.engines_root / ".cache" / "hashes.json"))
    key = build_key(ctx.recipe, ctx.source_hashes, ctx.tool_versions, stages, ctx)
    existing = read_manifest(ctx.engine_dir)
    up_to_date = bool(
        existing and existing.get("build_key") == key and engine_files_present(ctx.engine_dir, existing)
    )
    plan = []
    for stage in stages:
        stage_key = stage.cache_key(ctx)
        d = _stage_digest(stage, stage_key)
        cached = (
            stage.cacheable
            and (ctx.engines_root / ".stages" / stage.name / d[:24] / STAGE_META_NAME).is_file()
        )
        entry = {"name": stage.name, "key": d, "cacheable": stage.cacheable, "cached": cached}
        describe = getattr(stage, "describe", None)  # optional: a stage's own plan text (trtllm: the argv)
        if describe is not None:
            entry["describe"] = describe(ctx)
        plan.append(entry)
        ctx.progress.info(f"{stage.name}: {'cached' if cached else 'would run'}")
    seconds = time.perf_counter() - t0
    manifest = {
        "dry_run": True,
        "recipe": ctx.recipe.name,
        "build_key": key,
        "up_to_date": up_to_date,
        "plan": plan,
    }
    ctx.progress.finish(
        {"engine_dir": str(ctx.engine_dir), "cached": up_to_date, "seconds": seconds, "dry_run": True}
    )
    return BuildResult(ctx.engine_dir, up_to_date, manifest, seconds, dry_run=True)
