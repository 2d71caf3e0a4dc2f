"""sha256 of files and folders, and the digest of JSON-able values: the proofs in manifests and cache keys."""

from __future__ import annotations

import hashlib
import json
import os
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
