"""Nothing half-written: files and folders are written under a temporary sibling name and renamed into place.

- `atomic_file(path)` / `write_text_atomic` / `write_bytes_atomic` / `write_json_atomic`: one file, temp file +
  os.replace (a new inode, so a hard-linked earlier copy is never modified in place).
- `atomic_dir(final)`: a context manager yielding a temp folder next to `final`; when the block completes the
  folder is published with `publish(tmp, final)` (default `replace_dir`); the temp folder never outlives the block,
  whatever happens.
- `remove_dead_writers(folder, owner)`: the temp folders a killed writer left (its pid in their names), removed
  once that process is gone; a live writer's are left alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Publish = Callable[[Path, Path], None]


@contextmanager
def atomic_file(path: Path, *, mode: int | None = None, suffix: str = "") -> Iterator[Path]:
    """Yield a temp file path next to `path`; on success chmod it to `mode` (when given; else mkstemp's 0600) and
    os.replace it onto `path`; on any exception remove it."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write `data` to `path` atomically (temp file + rename)."""
    with atomic_file(path, mode=mode) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` (UTF-8) to `path` atomically (temp file + rename)."""
    write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON (non-JSON values as str) with a final newline, atomically, mode 0644."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", mode=0o644)


def _move_aside(path: Path) -> Path:
    """Rename `path` to a unique `.old-<name>@<pid>-<ns>` sibling (readers keep their open files); return it."""
    old = path.with_name(f".old-{path.name}@{os.getpid()}-{time.monotonic_ns()}")
    path.rename(old)
    return old


def remove_dir(path: Path) -> None:
    """Delete a folder others may be reading: move it aside first (the name is free at once), then delete it."""
    shutil.rmtree(_move_aside(path), ignore_errors=True)


def replace_dir(tmp: Path, final: Path) -> None:
    """Publish: rename `tmp` to `final`, replacing an existing `final` (moved aside first, deleted after)."""
    old = _move_aside(final) if final.exists() else None
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def keep_existing(tmp: Path, final: Path) -> None:
    """Publish: rename `tmp` to `final` (replacing an empty folder), unless `final` already holds something
    (e.g. a concurrent writer finished first): then theirs is kept and atomic_dir drops `tmp`."""
    try:
        tmp.rename(final)
    except OSError:
        if not final.exists():
            raise


@contextmanager
def atomic_dir(
    final: Path, *, prefix: str | None = None, mode: int | None = None, publish: Publish = replace_dir
) -> Iterator[Path]:
    """Yield a fresh temp folder next to `final` (name `prefix`*, default `.tmp-<name>-`*, chmod `mode` when
    given); when the block completes, `publish(tmp, final)` moves it into place. On any exception, and after a
    publish that leaves it behind, the temp folder is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=prefix or f".tmp-{final.name}-"))
    try:
        if mode is not None:
            tmp.chmod(mode)
        yield tmp
        publish(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def writer_alive(pid: int) -> bool:
    """Whether process `pid` still exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_writers(folder: Path, owner: re.Pattern[str]) -> list[Path]:
    """Remove the folders directly under `folder` whose name `owner` matches, with the writing process's pid as
    its group 1, where that process is gone (a killed build or write); the removed paths."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        m = owner.match(entry.name)
        if m and entry.is_dir() and not writer_alive(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed
