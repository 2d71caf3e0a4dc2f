"""The build pipeline: recipe → ordered stages → engines/<recipe>/, renamed into place only when complete.

How a build runs (build_engine):
 1. Load and validate the recipe (RecipeError, exit 2), resolve the model folder (missing → BadInput naming
    `model.path`), run every stage's optional `check(ctx)`. Nothing is written before this point.
 2. Hash the source files (sha256 of every byte, every build: build/weights.py) and compute the whole-build
    key = recipe hash + source hashes + tool versions + stage names/versions. If engines/<recipe>/manifest.json
    carries the same key (and its files exist), the build is a no-op ("up to date"); `force=True` rebuilds.
 3. Run the backend's stages in order into a temp folder engines/.tmp-<recipe>@*/, write recipe.resolved.yaml and
    manifest.json (through llmkiln.engine_dir), then rename the folder to engines/<recipe>. Any exception removes
    the temp folder, so an interrupted build never leaves a half-written engines/<recipe>.

The stages of each backend come from the caller (`stages_for`; llmkiln.backends.build is the full product).
The stage API is in llmkiln.build.stages; the build key and the stage cache in llmkiln.build.build_cache.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmkiln.atomic import atomic_dir
from llmkiln.build.build_cache import (
    STAGE_META_NAME,
    build_key,
    run_cached_stage,
    stage_cache_dir,
    stage_digest,
)
from llmkiln.build.logs import output_to
from llmkiln.build.manifest import hash_engine_files, manifest_head
from llmkiln.build.model_source import generated_model_dir, resolve_source
from llmkiln.build.progress import BuildProgress, QuietProgress
from llmkiln.build.stages import BuildContext, BuildOptions, Stage, StageSource
from llmkiln.build.weights import hash_model_dir
from llmkiln.engine_dir import EngineDir, Manifest
from llmkiln.errors import IntegrityError
from llmkiln.recipe import load_recipe
from llmkiln.versions import tool_versions


@dataclass
class BuildResult:
    """What build_engine returns. `cached`: the engine was already up to date and nothing was done."""

    engine_dir: Path
    cached: bool
    manifest: dict[str, Any]  # the manifest's JSON (or, for a dry run, the plan)
    seconds: float
    dry_run: bool = False


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


def _remove_stale(engines_root: Path, name: str) -> None:
    """Temp/old folders of this recipe left by a killed build (we hold the recipe's lock, so none is live)."""
    for stale in [*engines_root.glob(f".tmp-{name}@*"), *engines_root.glob(f".old-{name}@*")]:
        shutil.rmtree(stale, ignore_errors=True)


def _current_manifest(engine_dir: Path, key: str, progress: BuildProgress | None = None) -> Manifest | None:
    """The engine's manifest when it carries this build key and its files match their recorded sha256 (up to
    date), else None. Every engine file is re-read (EngineDir.verify)."""
    folder = EngineDir(engine_dir)
    existing = folder.manifest()
    if existing is None or existing.build_key != key or not folder.files_present(existing):
        return None
    try:
        folder.verify()
    except IntegrityError as exc:
        if progress is not None:
            progress.info(f"rebuilding: {exc}")
        return None
    return existing


def build_engine(
    recipe_name_or_path: str | os.PathLike[str],
    engines_root: Path,
    *,
    stages_for: StageSource,
    force: bool = False,
    model_override: Path | None = None,
    progress: BuildProgress | None = None,
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
    if model_override is None and recipe.model.package is not None and not dry_run:
        # a package is imported into the model cache (not the engine folder) before the checks, so that they
        # see its config.json; a bad package is BadInput before anything of the engine is written
        resolve_source(recipe, recipe_file, engines_root, None, create=True, log=progress.info)
    # Checks run before anything is written, a generated model included: they see its future folder (no
    # config.json yet) and check it from its spec; it is generated only after they pass.
    source = resolve_source(recipe, recipe_file, engines_root, model_override, create=False)
    ctx = BuildContext(
        recipe, recipe_file, engines_root, source, {}, tool_versions(), progress, options, stages
    )
    for stage in stages:
        check = getattr(stage, "check", None)
        if check is not None:
            check(ctx)
    if not dry_run:
        ctx.source = resolve_source(recipe, recipe_file, engines_root, model_override, create=True)
        source = ctx.source

    engine_dir = ctx.engine_dir
    if dry_run:
        return _dry_run(ctx, stages, t0)

    with _lock(engines_root, recipe.name):
        ctx.source_hashes = hash_model_dir(source.path)  # every byte, every build (no stamp shortcut)
        key = build_key(recipe, ctx.source_hashes, ctx.tool_versions, stages, ctx)
        existing = None if force else _current_manifest(engine_dir, key, progress)
        if not force and existing is not None:
            seconds = time.perf_counter() - t0
            progress.finish({"engine_dir": str(engine_dir), "cached": True, "seconds": seconds})
            return BuildResult(engine_dir, True, existing.to_json(), seconds)

        progress.start(recipe.name, str(engine_dir))
        if source.generated is not None:
            progress.info(
                f"note: {source.generated} is a generated model with random weights: its engine runs and measures "
                "like a real one, but its text is gibberish by design"
            )
        _remove_stale(engines_root, recipe.name)
        # replace_dir: an older engine is moved aside, not deleted, until the new one is in place
        with atomic_dir(engine_dir, prefix=f".tmp-{recipe.name}@", mode=0o755) as tmp:
            ctx.work_dir = tmp
            manifest = _run_stages(ctx, stages, key, t0)
    seconds = time.perf_counter() - t0
    progress.finish({"engine_dir": str(engine_dir), "cached": False, "seconds": seconds})
    return BuildResult(engine_dir, False, manifest, seconds)


def _run_stages(ctx: BuildContext, stages: list[Stage], key: str, t0: float) -> dict[str, Any]:
    work_dir = ctx.require_work_dir()
    stage_records: list[dict[str, Any]] = []
    parts: dict[str, Any] = {}
    log_dir = ctx.engines_root / ".logs" / ctx.recipe.name
    log_dir.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        ctx.progress.stage_start(stage.name)
        ts = time.perf_counter()
        stage_key = stage.cache_key(ctx)
        key_digest = stage_digest(stage, stage_key)
        log = log_dir / f"{stage.name}.log"
        try:
            with output_to(log):
                if stage.cacheable:
                    part, cached = run_cached_stage(stage, ctx, key_digest, stage_key)
                else:
                    part, cached = stage.run(ctx, work_dir), False
        except Exception:
            ctx.progress.info(f"stage {stage.name} failed; its output is in {log}")
            raise
        seconds = time.perf_counter() - ts
        ctx.progress.stage_end(stage.name, seconds, cached)
        stage_records.append(
            {"name": stage.name, "seconds": round(seconds, 3), "cached": cached, "key": key_digest}
        )
        parts[stage.name] = part or {}

    folder = EngineDir(work_dir)
    folder.write_recipe(ctx.recipe)
    manifest: dict[str, Any] = {
        **manifest_head(ctx, key),
        "engine_files": hash_engine_files(work_dir, ctx.known_hashes),
        "stages": stage_records,
        **parts,
        "build_seconds": round(time.perf_counter() - t0, 3),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return folder.write_manifest(manifest).to_json()


def _dry_run(ctx: BuildContext, stages: list[Stage], t0: float) -> BuildResult:
    """Report what a build would do (stage keys, whether each is cached) without writing anything."""
    src = ctx.source.path
    if src.is_dir():
        ctx.source_hashes = hash_model_dir(src)
    key = build_key(ctx.recipe, ctx.source_hashes, ctx.tool_versions, stages, ctx)
    up_to_date = _current_manifest(ctx.engine_dir, key) is not None
    plan = []
    for stage in stages:
        stage_key = stage.cache_key(ctx)
        d = stage_digest(stage, stage_key)
        cached = stage.cacheable and (stage_cache_dir(ctx.engines_root, stage, d) / STAGE_META_NAME).is_file()
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
