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
    """num_cached_tokens of each request served one after another by a fresh runtime (its own prefix store):
    raw prompts as text (the runtime tokenizes them, adding BOS), chat requests as the token ids the OpenAI
    frontend hands a worker (the rendered template, no special tokens added)."""
    encoder = PromptEncoder.from_engine(folder)
    engine = load_engine(folder, overrides).start()
    try:
        out = []
        for req in requests:
            text = encoder.render(req, bos_text)
            prompt = encoder.encode_requests([req], [text])[0] if req.is_chat else text
            handle = engine.submit(prompt, SamplingParams(max_tokens=1))
            handle.result()
            out.append(handle.num_cached_tokens)
        return out
    finally:
        engine.shutdown()


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
