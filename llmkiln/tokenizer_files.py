"""The tokenizer files of a Hugging Face model folder, copied verbatim wherever a tokenizer travels with a model,
and what they say about chat: the model's own chat template and the ids that end a reply."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# What AutoTokenizer / `tokenizers` may read, in the order they are copied (and listed in manifests).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)
# transformers 5 writes a model's chat template to its own file (it used to live in tokenizer_config.json).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
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


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object file's contents ({} when absent, unreadable or not an object: callers fall back)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_chat_template(folder: Path) -> tuple[str | None, str | None]:
    """(template, where) of a model folder's own chat template, in transformers 5's order: `chat_template.jinja`,
    then tokenizer_config.json's `chat_template` (a string, or a list of named templates: the "default" one).
    (None, None) when the model ships none."""
    jinja = folder / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        text = jinja.read_text(encoding="utf-8")
        if text.strip():
            return text, CHAT_TEMPLATE_FILE
    template = _json_object(folder / "tokenizer_config.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template.strip():
        return template, "tokenizer_config.json"
    return None, None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def model_stop_token_ids(folder: Path) -> tuple[int, ...]:
    """Every id a model folder says ends a reply: generation_config.json's and config.json's `eos_token_id` (an
    int or a list: Llama 3 Instruct lists <|end_of_text|> and <|eot_id|>) and tokenizer_config.json's
    `eos_token` (looked up in tokenizer.json's vocabulary and added tokens), in that order, without repeats."""
    out: list[int] = []
    for name in (GENERATION_CONFIG, "config.json"):
        out += _ids(_json_object(folder / name).get("eos_token_id"))
    eos = _json_object(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):  # an AddedToken written as a mapping
        eos = eos.get("content")
    if isinstance(eos, str) and eos:
        tok = _json_object(folder / "tokenizer.json")
        for added in tok.get("added_tokens", []):
            if isinstance(added, dict) and added.get("content") == eos and isinstance(added.get("id"), int):
                out.append(added["id"])
                break
        else:
            vocab = tok.get("model", {}).get("vocab", {})
            if isinstance(vocab, dict) and isinstance(vocab.get(eos), int):
                out.append(vocab[eos])
    return tuple(dict.fromkeys(out))
