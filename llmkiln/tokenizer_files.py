"""The tokenizer files of a Hugging Face model folder, copied verbatim wherever a tokenizer travels with a model."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

# What AutoTokenizer / `tokenizers` may read, in the order they are copied (and listed in manifests).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
# Not a tokenizer file, but it carries the EOS/BOS ids runtimes read next to the tokenizer.
GENERATION_CONFIG = "generation_config.json"


def copy_tokenizer_files(src: Path, dst: Path, names: Iterable[str] = TOKENIZER_FILES) -> list[str]:
    """Copy each of `names` that exists in `src` into `dst` (byte for byte); returns the names copied, in order."""
    copied = []
    for name in names:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
            copied.append(name)
    return copied
