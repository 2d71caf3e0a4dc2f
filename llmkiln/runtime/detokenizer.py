"""Incremental detokenization: turn a stream of token ids into text pieces without splitting a UTF-8 character.

Byte-fallback tokenizers emit one token per byte of a multi-byte character; decoding such a partial sequence
gives U+FFFD. We decode a small window of ids and hold text back while it ends in U+FFFD. Decoding a window
(rather than single tokens) also keeps the leading-space handling of sentencepiece-style decoders right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT = "\ufffd"


class _Decodes(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """push(token_id) returns the newly completed text ("" while a character is incomplete); flush() the rest.

    `prompt_ids` (optional) are context only: text is produced for pushed tokens, decoded after the prompt, so
    the first generated word keeps its leading space.
    """

    def __init__(self, tokenizer: _Decodes, prompt_ids: Sequence[int] = (), context: int = 6) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids)[-context:] if prompt_ids else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            out = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return out
        return ""

    def flush(self) -> str:
        """Whatever is held back (possibly with U+FFFD for a truncated character); resets the window."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
