"""Hit rates of request lists: render, tokenize (as the runtime does), simulate the prefix store."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.findings import HitRates
from llmkiln.lint.prefix_sim import HitResult, simulate_hits
from llmkiln.lint.requests import Message, PromptRequest


def rates(result: HitResult) -> HitRates:
    return HitRates(
        token_hit_rate=round(result.token_hit_rate, 6),
        request_hit_rate=round(result.request_hit_rate, 6),
        hit_tokens=result.hit_tokens,
        prompt_tokens=result.looked_up_tokens,
        tokens_per_block=result.tokens_per_block,
    )


@dataclass
class Scorer:
    """Token ids and simulated hits for request lists of one engine. Rendered texts and their ids are cached
    (ids compactly, as arrays): a fix changes some requests and leaves the others as they were."""

    encoder: PromptEncoder
    tokens_per_block: int
    max_input_len: int | None
    _texts: dict[tuple[str | None, tuple[Message, ...] | None, str | None], str] = field(default_factory=dict)
    _ids: dict[tuple[str, bool], array[int]] = field(default_factory=dict)

    def text(self, request: PromptRequest, bos_text: str | None = None) -> str:
        key = (request.prompt, request.messages, bos_text)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = self.encoder.render(request, bos_text)
        return text

    def encode(self, texts: Sequence[str], special: Sequence[bool]) -> list[array[int]]:
        """Ids of each text, encoded with or without the tokenizer's special tokens (cached by both)."""
        keys = list(zip(texts, special, strict=True))
        for flag in (True, False):
            todo = [t for t, f in dict.fromkeys(keys) if f == flag and (t, f) not in self._ids]
            for t, ids in zip(todo, self.encoder.encode_texts(todo, flag), strict=True):
                self._ids[(t, flag)] = array("I", ids)
        return [self._ids[k] for k in keys]

    def ids(self, requests: Sequence[PromptRequest], bos_text: str | None = None) -> list[array[int]]:
        texts = [self.text(r, bos_text) for r in requests]
        return self.encode(texts, [self.encoder.adds_special_tokens(r) for r in requests])

    def score(
        self,
        requests: Sequence[PromptRequest],
        bos_text: str | None = None,
        tokens_per_block: int | None = None,
        unlimited: bool = False,
    ) -> HitResult:
        """Simulated hits (unlimited: no prompt is rejected for limits.max_input_len)."""
        return simulate_hits(
            self.ids(requests, bos_text),
            tokens_per_block or self.tokens_per_block,
            None if unlimited else self.max_input_len,
        )
