"""llmkiln.atomic: temp file / temp folder next to the target, renamed into place only when complete."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmkiln.atomic import (
    atomic_dir,
    atomic_file,
    keep_existing,
    remove_dead_writers,
    write_json_atomic,
    write_text_atomic,
)


def test_write_json_atomic_format_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_json_atomic(path, {"b": 1, "a": Path("x")})
    assert path.read_text() == '{\n  "b": 1,\n  "a": "x"\n}\n'
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_atomic_file_failure_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    write_text_atomic(path, "old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_dir_replaces_and_cleans_up(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with atomic_dir(final, mode=0o755) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".tmp-out-")
        (tmp / "new.txt").write_text("new")
        assert (final / "old.txt").is_file()  # untouched until the block completes
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert final.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_failure_keeps_old_folder(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_dir(final) as tmp:
        (tmp / "half.txt").write_text("half")
        raise KeyboardInterrupt
    assert sorted(p.name for p in final.iterdir()) == ["old.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_keep_existing_uses_theirs(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    (final / "theirs.json").write_text(json.dumps(1))
    with atomic_dir(final, publish=keep_existing) as tmp:
        (tmp / "ours.json").write_text(json.dumps(2))
    assert sorted(p.name for p in final.iterdir()) == ["theirs.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    fresh = tmp_path / "fresh"
    with atomic_dir(fresh, publish=keep_existing) as tmp:
        (tmp / "ours.json").write_text("2")
    assert (fresh / "ours.json").read_text() == "2"


def test_only_a_gone_writers_temp_folders_are_removed(tmp_path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(gone.stdout)  # exited and reaped: no such process now
    owner = re.compile(r"^\.tmp-x@(\d+)-")
    dead = tmp_path / f".tmp-x@{dead_pid}-a"
    live = tmp_path / f".tmp-x@{os.getpid()}-b"  # this process: still writing
    other = tmp_path / f".tmp-y@{dead_pid}-c"  # not this pattern's
    for d in (dead, live, other):
        d.mkdir()
    (dead / "half-written").write_text("x")
    assert remove_dead_writers(tmp_path, owner) == [dead]
    assert not dead.exists() and live.is_dir() and other.is_dir()
    assert remove_dead_writers(tmp_path / "missing", owner) == []
