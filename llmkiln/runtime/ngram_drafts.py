"""N-gram (prompt-lookup) drafts: the tokens that followed the latest earlier occurrence of a sequence's suffix.

The drafter of speculative decoding on llmkiln's runtime (recipe `speculative.method: ngram`): no draft model,
the sequence itself is the draft source, so it pays where the output repeats its input (summarize, extract, edit
a given text, code) and costs little elsewhere (no match: no draft). The same idea as vLLM's n-gram proposer,
TensorRT-LLM's NGram drafter and OpenVINO GenAI's prompt-lookup decoding: look up the last n tokens (n from
`max_ngram` down to 1) among the earlier tokens of prompt and output and propose the up to k tokens that followed
the most recent earlier match.

`NgramIndex` keeps, for every n-gram of the sequence, where its latest occurrence that has a follower ends, and
grows with every appended token (O(max_ngram) per token), so a lookup costs O(max_ngram) whatever the length:
a 1500-token prompt is indexed once (about 1 ms), not scanned at every step.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """The n-grams (1 ≤ n ≤ max_ngram) of one growing token sequence, each mapped to the end of its latest
    occurrence that a later token follows."""

    def __init__(self, max_ngram: int) -> None:
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens: each n-gram ending right before a new token now has a follower."""
        seq, ends, top = self.tokens, self._ends, self.max_ngram
        for t in tokens:
            i = len(seq)  # the n-grams ending at i (seq[i - n : i]) are followed by t
            for n in range(1, min(top, i) + 1):
                ends[tuple(seq[i - n : i])] = i
            seq.append(int(t))

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with `tokens`, of which the index holds a prefix (the sequence only grows)."""
        if len(tokens) > len(self.tokens):
            self.extend(tokens[len(self.tokens) :])

    def propose(self, k: int, min_ngram: int = 1) -> tuple[int, ...]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix found (n from
        max_ngram down to min_ngram); () when no such suffix occurred before."""
        seq = self.tokens
        size = len(seq)
        if k <= 0 or size < 2:
            return ()
        for n in range(min(self.max_ngram, size - 1), max(1, min_ngram) - 1, -1):
            end = self._ends.get(tuple(seq[size - n :]))
            if end is not None:  # seq[end - n : end] equals the suffix, and end < size
                return tuple(seq[end : end + k])
        return ()
