"""Reading JSON with bounded nesting (loads_json) and JSONL files (one JSON value per line) with errors that
name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmkiln.errors import BadInput

MAX_JSON_DEPTH = 64  # arrays/objects inside each other in a file a user hands us


def loads_json(text: str | bytes) -> Any:
    """json.loads whose nesting is bounded (MAX_JSON_DEPTH): a deeper document is a ValueError like any other
    JSON error (json.loads itself ends in a RecursionError at about 1,000 levels)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return data


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based line number, parsed value) for every non-blank line of a UTF-8 JSONL file; BadInput naming
    `path:line` for a line that is not valid JSON. The caller checks that the file exists (its message says
    what the file is for) and what each value must look like."""
    for lineno, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(
                f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                "save the file as UTF-8"
            ) from None
        if not line.strip():
            continue
        try:
            obj = loads_json(line)
        except ValueError as exc:
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise BadInput(
                f"{path}:{lineno}: not valid JSON ({msg}); each line must be one JSON object"
            ) from None
        yield lineno, obj
