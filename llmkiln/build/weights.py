"""sha256 of source model files, with a small cache so unchanged big weights are not re-read.

The cache (llmkiln.hashing.HashCache) is keyed on size + mtime + ctime + inode, so a file rewritten with its mtime
restored is re-hashed; `kiln build --force` re-hashes every source file (HashCache(refresh=True)).

The hashes go into the engine manifest (proof the weights are untouched) and into the build-cache key.
"""

from __future__ import annotations

from pathlib import Path

from llmkiln.hashing import HashCache, list_files

__all__ = ["HashCache", "hash_model_dir", "is_weight_file", "split_weight_hashes"]

# Files whose bytes are model weights (the manifest lists them separately from config/tokenizer files).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def hash_model_dir(model_dir: Path, cache: HashCache | None = None) -> dict[str, str]:
    """{relative path: sha256} for every file of a source model folder."""
    cache = cache or HashCache(None)
    return {f.relative_to(model_dir).as_posix(): cache.sha256(f) for f in list_files(model_dir)}


def split_weight_hashes(hashes: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(weight files, other files) of a hash_model_dir result."""
    weights = {k: v for k, v in hashes.items() if is_weight_file(k)}
    others = {k: v for k, v in hashes.items() if not is_weight_file(k)}
    return weights, others
