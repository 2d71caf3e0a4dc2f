"""sha256 of source model files, with a small cache so unchanged big weights are not re-read.

The hashes go into the engine manifest (proof the weights are untouched) and into the build-cache key.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmkiln.atomic import write_text_atomic
from llmkiln.hashing import list_files, sha256_file

# Files whose bytes are model weights (the manifest lists them separately from config/tokenizer files).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


class HashCache:
    """A JSON file mapping absolute path -> (size, mtime_ns, sha256); stale entries are simply recomputed."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, list] = {}
        self._dirty = False
        if path is not None and path.is_file():
            try:
                self._entries = json.loads(path.read_text())
            except (OSError, ValueError):
                self._entries = {}

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = str(file.resolve())
        hit = self._entries.get(key)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        digest = sha256_file(file)
        self._entries[key] = [st.st_size, st.st_mtime_ns, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        """Write the cache atomically (temp file + rename); a no-op when nothing changed."""
        if self.path is None or not self._dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(self._entries))
        self._dirty = False


def hash_model_dir(model_dir: Path, cache: HashCache | None = None) -> dict[str, str]:
    """{relative path: sha256} for every file of a source model folder."""
    cache = cache or HashCache(None)
    return {f.relative_to(model_dir).as_posix(): cache.sha256(f) for f in list_files(model_dir)}


def split_weight_hashes(hashes: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(weight files, other files) of a hash_model_dir result."""
    weights = {k: v for k, v in hashes.items() if is_weight_file(k)}
    others = {k: v for k, v in hashes.items() if not is_weight_file(k)}
    return weights, others
