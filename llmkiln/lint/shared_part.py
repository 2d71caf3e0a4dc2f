"""The part of a request meant to be shared with other requests, and how to put an edited one back.

- chat requests with a leading system message: that message's content (the chat template renders it first);
- raw prompts: the text up to where the request stops agreeing with its closest other request (past masked
  dynamic content and slots, see alignment.py), cut back to the last line break (or word break) before it;
- anything else (chat without a system message): nothing.
Fixes edit the shared part; content moved out of it goes right after it (the first message after the system
message, or the text after the raw shared part).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmkiln.lint.requests import PromptRequest


@dataclass(frozen=True)
class SharedPart:
    """`text` is the shared part of a request; for raw prompts it is `prompt[:len(text)]`."""

    text: str
    where: Literal["system", "prefix", "none"]


def snap_end(text: str, end: int) -> int:
    """`end` moved back to just after the last line break before it (else the last whitespace); the whole
    text when the request agrees with another to its end."""
    if end >= len(text):
        return len(text)
    nl = text.rfind("\n", 0, end)
    if nl >= 0:
        return nl + 1
    k = end
    while k > 0 and not text[k - 1].isspace():
        k -= 1
    return k


def shared_part(request: PromptRequest, raw_end: int) -> SharedPart:
    """The shared part of a request; `raw_end` is the snapped agreement end of a raw prompt."""
    if request.messages is not None:
        if request.messages and request.messages[0][0] == "system":
            return SharedPart(request.messages[0][1], "system")
        return SharedPart("", "none")
    return SharedPart((request.prompt or "")[:raw_end], "prefix")


def rebuild(request: PromptRequest, part: SharedPart, new_text: str, moved: str = "") -> PromptRequest:
    """The request with its shared part replaced by `new_text`, and `moved` put right after it."""
    if part.where == "none":
        return request
    if request.messages is None:
        prompt = request.prompt or ""
        return request.with_prompt(new_text + moved + prompt[len(part.text) :])
    msgs = list(request.messages)
    msgs[0] = ("system", new_text)
    if moved:
        if len(msgs) > 1:
            role, content = msgs[1]
            msgs[1] = (role, moved + content)
        else:
            msgs.append(("user", moved.rstrip("\n")))
    return request.with_messages(msgs)
