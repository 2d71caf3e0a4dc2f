"""Reading JSONL files (one JSON value per line) with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmkiln.errors import BadInput


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
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(
                f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object"
            ) from None
        yield lineno, obj
