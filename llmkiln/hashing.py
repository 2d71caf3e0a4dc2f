"""sha256 of files and folders, and the digest of JSON-able values: the proofs in manifests and cache keys.

`check_files` checks a folder against recorded hashes (engine and stage-cache integrity) by reading every byte:
there is deliberately no cache keyed on file stamps (see check_files).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
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


def check_files(folder: Path, expected: dict[str, str]) -> FileCheck:
    """Every file of `expected` ({relative path: sha256}) under `folder` against its hash, each one read in full:
    one problem line per missing or changed file (none when all match), and the bytes read.

    No stat-based shortcut: a rewrite through a shared mmap leaves size, mtime, ctime and inode unchanged (even
    after msync, measured on Linux 6.18 ext4 and tmpfs), so no stamp can prove the bytes are the ones once hashed."""
    problems: list[str] = []
    nbytes = 0
    for rel, want in sorted(expected.items()):
        f = folder / rel
        if not f.is_file():
            problems.append(f"{f}: missing")
            continue
        nbytes += f.stat().st_size
        got = sha256_file(f)
        if got != want:
            problems.append(f"{f}: sha256 {got[:16]}… differs from the manifest's {want[:16]}…")
    return FileCheck(problems, len(expected), nbytes)


@dataclass(frozen=True)
class FileCheck:
    """What check_files found: problem lines (empty: all match), files listed, bytes hashed."""

    problems: list[str]
    files: int
    bytes: int
