"""Request files for `kiln lint-prompts`: JSONL in the format `kiln bench --from-jsonl` reads, plus chat messages.

Each line is one JSON object with either
- `prompt` (or `text`): the raw prompt text, sent as it is, or
- `messages`: a list of {role: system|user|assistant, content}, rendered with the engine's chat template.
Other fields (`max_tokens`, `group`, ...) are kept unchanged by `--fix`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmkiln.atomic import write_text_atomic
from llmkiln.chat_template import check_messages
from llmkiln.errors import BadInput
from llmkiln.jsonl import read_jsonl

Message = tuple[str, str]  # (role, content)


@dataclass(frozen=True)
class PromptRequest:
    """One request of the file: a raw prompt or chat messages, and the JSON object it came from."""

    lineno: int
    data: dict[str, Any]
    prompt: str | None = None
    prompt_field: str = "prompt"
    messages: tuple[Message, ...] | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages or ()]

    def with_prompt(self, prompt: str) -> PromptRequest:
        return replace(self, prompt=prompt)

    def with_messages(self, messages: Sequence[Message]) -> PromptRequest:
        return replace(self, messages=tuple(messages))

    def to_json(self) -> dict[str, Any]:
        """The original object with the (possibly edited) prompt or messages."""
        out = dict(self.data)
        if self.messages is not None:
            out["messages"] = self.message_dicts()
        else:
            out[self.prompt_field] = self.prompt
        return out


def read_requests(path: Path) -> list[PromptRequest]:
    """Every request of a JSONL file; BadInput naming `path:line` for a line that is neither form."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(
            f'{path}: no such file; give a JSONL file with one {{"prompt": ...}} or {{"messages": [...]}} per line'
        )
    out = []
    for lineno, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise BadInput(f"{path}:{lineno}: expected a JSON object with 'prompt', 'text' or 'messages'")
        if "messages" in obj:
            msgs = check_messages(obj["messages"], where=f"{path}:{lineno}: messages")
            out.append(PromptRequest(lineno, obj, messages=tuple((m["role"], m["content"]) for m in msgs)))
            continue
        field = "prompt" if "prompt" in obj else "text"
        prompt = obj.get(field)
        if not isinstance(prompt, str) or not prompt:
            raise BadInput(
                f"{path}:{lineno}: needs a non-empty string field 'prompt' (or 'text'), or a 'messages' list"
            )
        out.append(PromptRequest(lineno, obj, prompt=prompt, prompt_field=field))
    if not out:
        raise BadInput(f"{path}: no requests in the file")
    return out


def write_requests(path: Path, requests: Sequence[PromptRequest]) -> None:
    """The requests as JSONL (atomically: never half-written)."""
    lines = [json.dumps(r.to_json(), ensure_ascii=False) for r in requests]
    write_text_atomic(Path(path), "\n".join(lines) + "\n")
