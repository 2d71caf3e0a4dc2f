"""sha256 of files and folders, and the digest of JSON-able values: the proofs in manifests and cache keys.

`HashCache` remembers a file's sha256 under its stamp (size, mtime, ctime, inode), so unchanged big files are
not re-read; `check_files` checks a folder against recorded hashes through it (engine and stage-cache integrity).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_CHUNK = 1 << 22


def sha256_file(path: Path) -> str:
    """sha256 hex digest of one file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def list_files(folder: Path) -> list[Path]:
    """Every regular file under `folder` (recursively), hidden files and folders excluded, sorted."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                out.append(Path(root) / name)
    return out


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON form of obj (sorted keys)."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


def file_stamp(path: Path) -> list[int]:
    """[size, mtime_ns, ctime_ns, inode]: what changes when a file's bytes may have changed. ctime is part of
    it because a writer can restore the mtime (touch -d, cp -p, rsync -t) but never the ctime."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class HashCache:
    """A JSON file mapping absolute path -> [size, mtime_ns, ctime_ns, inode, sha256]: a file whose stamp is
    unchanged is not re-read. `refresh=True` re-hashes every file asked for (and records the new hashes).

    Saving is best effort (a read-only cache folder only costs re-hashing next time)."""

    def __init__(self, path: Path | None, refresh: bool = False) -> None:
        self.path = path
        self.refresh = refresh
        self._entries: dict[str, list[Any]] = {}
        self._dirty = False
        self.hashed = 0  # files actually read by sha256() (the rest came from the cache)
        if path is not None and path.is_file():
            try:
                loaded = json.loads(path.read_text())
                self._entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self._entries = {}

    def cached(self, file: Path) -> str | None:
        """The recorded sha256 of `file` when its stamp is unchanged (and refresh is off), else None."""
        if self.refresh:
            return None
        hit = self._entries.get(str(file.resolve()))
        if isinstance(hit, list) and len(hit) == 5 and hit[:4] == file_stamp(file):
            return str(hit[4])
        return None

    def sha256(self, file: Path) -> str:
        hit = self.cached(file)
        if hit is not None:
            return hit
        stamp = file_stamp(file)
        digest = sha256_file(file)
        self.hashed += 1
        if file_stamp(file) == stamp:  # not changed while we read it: safe to remember
            self._entries[str(file.resolve())] = [*stamp, digest]
            self._dirty = True
        return digest

    def forget(self, file: Path) -> None:
        if self._entries.pop(str(file.resolve()), None) is not None:
            self._dirty = True

    def save(self) -> None:
        """Write the cache atomically (temp file + rename); a no-op when nothing changed."""
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(fd, "w") as fh:
                json.dump(self._entries, fh)
            os.replace(name, self.path)
        except OSError:
            return
        self._dirty = False


def check_files(folder: Path, expected: dict[str, str], cache: HashCache) -> list[str]:
    """Every file of `expected` ({relative path: sha256}) under `folder` against its hash; returns one line per
    problem (missing, changed), empty when all match. Unchanged stamps use the cache's recorded hash."""
    problems = []
    for rel, want in sorted(expected.items()):
        f = folder / rel
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        got = cache.sha256(f)
        if got != want:
            cache.forget(f)
            problems.append(f"{f}: sha256 {got[:16]}… differs from the manifest's {want[:16]}…")
    return problems
