"""sha256 of source model files, every byte read on every build.

There is no cache keyed on file stamps: a rewrite through a shared mmap leaves size, mtime, ctime and inode as they
were, so such a cache would give a stale sha256 (and an "up to date" build) for changed weights. Hashing runs at
about 2 GB/s on one core (sha256 with SHA-NI): 0.25 s for bench-llama-125m's 500 MB, ~7-14 s for 14-28 GB of 7B.

The hashes go into the engine manifest (proof the weights are untouched) and into the build-cache key.
"""

from __future__ import annotations

from pathlib import Path

from llmkiln.hashing import list_files, sha256_file

__all__ = ["hash_model_dir", "is_weight_file", "split_weight_hashes"]

# Files whose bytes are model weights (the manifest lists them separately from config/tokenizer files).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")


def is_weight_file(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def hash_model_dir(model_dir: Path) -> dict[str, str]:
    """{relative path: sha256} for every file of a source model folder (each read in full)."""
    return {f.relative_to(model_dir).as_posix(): sha256_file(f) for f in list_files(model_dir)}


def split_weight_hashes(hashes: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(weight files, other files) of a hash_model_dir result."""
    weights = {k: v for k, v in hashes.items() if is_weight_file(k)}
    others = {k: v for k, v in hashes.items() if not is_weight_file(k)}
    return weights, others
