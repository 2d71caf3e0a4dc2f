"""Hit rates of request lists: render, tokenize (as the runtime does), simulate the prefix store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.findings import HitRates
from llmkiln.lint.prefix_sim import HitResult, simulate_hits
from llmkiln.lint.requests import PromptRequest


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
    """Token ids and simulated hits for request lists of one engine. Texts of the first list scored stay
    cached: a fix changes some requests and leaves the others' ids as they were."""

    encoder: PromptEncoder
    tokens_per_block: int
    max_input_len: int | None
    _cache: dict[str, list[int]] = field(default_factory=dict)
    _frozen: bool = False

    def ids(self, requests: Sequence[PromptRequest], bos_text: str | None = None) -> list[list[int]]:
        texts = [self.encoder.render(r, bos_text) for r in requests]
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        fresh = dict(zip(todo, self.encoder.encode_texts(todo), strict=True))
        if not self._frozen:
            self._cache.update(fresh)
            self._frozen = True
        return [self._cache[t] if t in self._cache else fresh[t] for t in texts]

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
