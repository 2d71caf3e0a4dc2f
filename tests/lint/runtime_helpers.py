"""Lint test helpers: serving requests through the real runtime, writing request files."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmkiln.engine_dir import EngineDir
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.requests import PromptRequest
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import SamplingParams


def served_cached(
    folder: EngineDir,
    requests: Sequence[PromptRequest],
    overrides: dict[str, Any] | None = None,
    bos_text: str | None = None,
) -> list[int]:
    """num_cached_tokens of each request served one after another by a fresh runtime (its own prefix store),
    prompts rendered as the server renders them (chat templates with `bos_text` as bos_token when given)."""
    encoder = PromptEncoder.from_engine(folder)
    engine = load_engine(folder, overrides).start()
    try:
        out = []
        for req in requests:
            handle = engine.submit(encoder.render(req, bos_text), SamplingParams(max_tokens=1))
            handle.result()
            out.append(handle.num_cached_tokens)
        return out
    finally:
        engine.shutdown()


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
