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
    _ids: dict[str, array[int]] = field(default_factory=dict)

    def text(self, request: PromptRequest, bos_text: str | None = None) -> str:
        key = (request.prompt, request.messages, bos_text)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = self.encoder.render(request, bos_text)
        return text

    def encode(self, texts: Sequence[str]) -> list[array[int]]:
        todo = [t for t in dict.fromkeys(texts) if t not in self._ids]
        for t, ids in zip(todo, self.encoder.encode_texts(todo), strict=True):
            self._ids[t] = array("I", ids)
        return [self._ids[t] for t in texts]

    def ids(self, requests: Sequence[PromptRequest], bos_text: str | None = None) -> list[array[int]]:
        texts = [self.text(r, bos_text) for r in requests]
        if bos_text == "" and self.encoder.bos_is_split_off() and self.encoder.adds_bos():
            self._derive_without_template_bos(requests, texts)
        return self.encode(texts)

    def _derive_without_template_bos(self, requests: Sequence[PromptRequest], texts: Sequence[str]) -> None:
        """A chat template without its bos_token: when the BOS text is split off before normalization, the ids
        are the usual ones without the template's BOS (the second token), so no re-encoding is needed."""
        bos = self.encoder.bos_text
        for r, text in zip(requests, texts, strict=True):
            if text in self._ids or not r.is_chat:
                continue
            usual = self.text(r)
            if usual == bos + text and usual in self._ids:
                ids = self._ids[usual]
                self._ids[text] = ids[:1] + ids[2:]

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
