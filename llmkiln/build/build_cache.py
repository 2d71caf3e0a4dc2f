"""When a build or a stage is up to date: the whole-build key, stage keys, and the stage cache.

- build_key: recipe hash + source file hashes + tool versions + stage names/versions (+ each stage's optional
  `build_key_extra(ctx)`); engines/<recipe>/manifest.json records it, and an equal key means "up to date".
- A cacheable stage runs into engines/.stages/<name>/<key digest>/ (temp folder + rename, with stage.json
  recording its result and file hashes); the next build with the same stage key reuses the folder once its files
  match those hashes (a corrupted entry is removed and the stage runs again). Its files are copied (cloned where
  the filesystem can) into the engine folder being assembled.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from llmkiln.atomic import atomic_dir, remove_dead_writers, remove_dir, write_json_atomic
from llmkiln.build.manifest import hash_engine_files
from llmkiln.build.stages import BuildContext, Stage
from llmkiln.engine_dir import MANIFEST_FORMAT
from llmkiln.hashing import check_files, digest
from llmkiln.recipe import Recipe

STAGE_META_NAME = "stage.json"
STAGE_LOG_NAME = "stage.log"


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, or None when it is absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stage_digest(stage: Stage, key: dict[str, Any]) -> str:
    """The digest of a stage's cache key (with its name and version)."""
    return digest({"stage": stage.name, "version": stage.version, "key": key})


def stage_cache_dir(engines_root: Path, stage: Stage, key_digest: str) -> Path:
    """engines/.stages/<name>/<digest prefix>/: where a cacheable stage's output for that key lives."""
    return engines_root / ".stages" / stage.name / key_digest[:24]


def build_key(
    recipe: Recipe,
    source_hashes: dict[str, str],
    tools: dict[str, str],
    stages: list[Stage],
    ctx: BuildContext | None = None,
) -> str:
    """The whole-build cache key: recipe hash + source file hashes + tool versions + stage names/versions,
    plus each stage's optional `build_key_extra(ctx)` (inputs outside the recipe, e.g. calibration set contents,
    the int8 weight rule; None where it has none)."""
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
    extra = {name: value for name, value in extra.items() if value is not None}  # None: nothing outside
    if extra:
        data["stage_inputs"] = extra
    return digest(data)


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


_OWNER = re.compile(r"^\.(?:tmp|old)-.*@(\d+)-")


def remove_dead_temp(folder: Path) -> list[Path]:
    """Remove `.tmp-*@PID-*` / `.old-*@PID-*` folders under `folder` whose writer process is gone (a killed
    build); folders of live builds (other recipes may share a stage cache) are left alone."""
    return remove_dead_writers(folder, _OWNER)


def _check_cached(cache_dir: Path, meta: dict[str, Any]) -> list[str]:
    """Problems of a cached stage folder against the file hashes its stage.json lists (none: reuse it); every
    file is re-read (no stamp shortcut, llmkiln.hashing.check_files)."""
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return [f"{cache_dir / STAGE_META_NAME}: lists no file hashes"]
    return check_files(cache_dir, {str(k): str(v) for k, v in files.items()}).problems


def run_cached_stage(
    stage: Stage, ctx: BuildContext, key_digest: str, key: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Run a cacheable stage into engines/.stages/<name>/<digest>/ (or reuse it); copy its files into work_dir."""
    work_dir = ctx.require_work_dir()
    cache_dir = stage_cache_dir(ctx.engines_root, stage, key_digest)
    meta_path = cache_dir / STAGE_META_NAME
    meta = None if ctx.options.force else read_json(meta_path)
    if meta is not None:
        problems = _check_cached(cache_dir, meta)
        if (
            problems
        ):  # a corrupted cache entry is never copied into an engine: drop it and run the stage again
            ctx.progress.info(
                f"stage {stage.name}: cached output {cache_dir} does not match its stage.json, rebuilding it:\n  "
                + "\n  ".join(problems[:5])
            )
            remove_dir(cache_dir)
            meta = None
    cached = meta is not None
    if meta is None:

        def publish(tmp: Path, final: Path) -> None:
            nonlocal meta
            if final.exists() and (ctx.options.force or read_json(meta_path) is None):
                remove_dir(final)  # forced, or left incomplete
            try:
                tmp.rename(final)
            except OSError:  # a concurrent build published the same key meanwhile: use theirs (same inputs)
                meta = read_json(meta_path) or meta

        remove_dead_temp(cache_dir.parent)
        prefix = f".tmp-{key_digest[:12]}@{os.getpid()}-"
        with atomic_dir(cache_dir, prefix=prefix, mode=0o755, publish=publish) as tmp:
            part = stage.run(ctx, tmp)
            files = hash_engine_files(tmp)
            files = {k: v for k, v in files.items() if k not in (STAGE_META_NAME, STAGE_LOG_NAME)}
            meta = {"stage": stage.name, "version": stage.version, "key": key, "result": part, "files": files}
            write_json_atomic(tmp / STAGE_META_NAME, meta)
    _copy_tree(cache_dir, work_dir, skip={STAGE_META_NAME, STAGE_LOG_NAME})
    ctx.known_hashes.update(meta.get("files", {}))
    return meta.get("result", {}), cached
