"""Drafts from earlier requests: what most often followed a sequence's last tokens in the outputs the engine
finished before (recipe `speculative.history_tokens`).

The second draft source of n-gram speculation (runtime.ngram_drafts is the first: the sequence's own prompt and
output). A chat model's replies share their phrasing across requests ("Here are some", list markers, closing
lines) that a reply's own earlier text does not hold yet; SuffixDecoding (Oliaro et al., 2024; vLLM's `suffix`
method) drafts from such a cross-request store, by frequency. Here: for every n-gram (1 ≤ n ≤ HISTORY_NGRAM) of
the recorded outputs, how often each token followed it; a draft walks from the sequence's last tokens, taking
at each step the most frequent follower of the longest suffix known, up to k tokens.

Used where a verified row is free (a lone sequence whose runs are padded: the scheduler) and the sequence's own
lookup matched on one token or nothing: on SmolLM2-135M-Instruct, 48 greedy replies replayed in order, tokens a
step 1.39 → 1.55 on open chat and 2.99 → 3.10 on grounded tasks (bench/results/spec-decode-xeon/history/).
Drafts are verified as any: the output is unchanged (greedy token for token; sampling keeps its distribution).
What it discloses: like a prefix cache, a reply that resembles earlier replies comes faster.

Bounded: the oldest recorded outputs are forgotten (their counts taken back) beyond `max_tokens`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

# the longest suffix looked up in the history (4 and 8 drafted alike on SmolLM2's replies: 1.547 / 1.551 tokens
# a step on open chat; the store grows with it)
HISTORY_NGRAM = 4


class DraftHistory:
    """The follower counts of every n-gram of the outputs recorded, most recent `max_tokens` tokens."""

    def __init__(self, max_tokens: int, max_ngram: int = HISTORY_NGRAM) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_tokens = max_tokens
        self.max_ngram = max_ngram
        # n-gram -> {follower: count}: plain dicts of ints, which Python's cycle collector leaves untracked (45k
        # Counters for 16k tokens made a full collection 3.6 ms dearer; these add nothing to it)
        self._followers: dict[tuple[int, ...], dict[int, int]] = {}
        self._recorded: deque[tuple[int, tuple[int, ...]]] = deque()  # (lead length, lead + output) a reply
        self.num_tokens = 0  # output tokens held

    def __len__(self) -> int:
        return self.num_tokens

    def record(self, context: Sequence[int], output: Sequence[int]) -> None:
        """A finished request's output, after the last tokens of its prompt (`context`: the n-grams a reply
        starts from); forgets the oldest outputs beyond max_tokens."""
        if not output:
            return
        lead = tuple(int(t) for t in context[-self.max_ngram :])
        seq = lead + tuple(int(t) for t in output)
        self._count(seq, len(lead), +1)
        self._recorded.append((len(lead), seq))
        self.num_tokens += len(seq) - len(lead)
        while self.num_tokens > self.max_tokens and len(self._recorded) > 1:
            start, old = self._recorded.popleft()
            self._count(old, start, -1)
            self.num_tokens -= len(old) - start

    def _count(self, seq: tuple[int, ...], start: int, delta: int) -> None:
        followers, top = self._followers, self.max_ngram
        for i in range(max(start, 1), len(seq)):
            t = seq[i]
            for n in range(1, min(top, i) + 1):
                key = seq[i - n : i]
                c = followers.get(key)
                if c is None:
                    c = followers[key] = {}
                left = c.get(t, 0) + delta
                if left > 0:
                    c[t] = left
                else:
                    c.pop(t, None)
                    if not c:
                        del followers[key]

    def instead_of(
        self, own: tuple[int, ...], own_n: int, tail: Sequence[int], k: int
    ) -> tuple[tuple[int, ...], int] | None:
        """Drafts to use instead of the sequence's own lookup (`own`, matched on `own_n` tokens), or None: only
        where the own lookup matched on one token or nothing, and then a history match on 2+ tokens, or any when
        the own found nothing."""
        if own_n > 1:
            return None
        found, n = self.match(tail, k, 1 if not own else 2)
        return (found, n) if found else None

    def match(self, tail: Sequence[int], k: int, min_ngram: int = 1) -> tuple[tuple[int, ...], int]:
        """(up to k drafts continuing `tail`, the length of the suffix the first one matched on; 0: none). Each
        draft is the most frequent follower of the longest suffix (max_ngram down to min_ngram) of the tail and
        the drafts so far; the walk stops where no suffix is known."""
        ctx = [int(t) for t in tail[-self.max_ngram :]]
        drafts: list[int] = []
        first = 0
        lo = max(1, min_ngram)
        while len(drafts) < k:
            for n in range(min(self.max_ngram, len(ctx)), lo - 1, -1):
                c = self._followers.get(tuple(ctx[len(ctx) - n :]))
                if c:
                    token = max(c.items(), key=lambda kv: kv[1])[0]
                    break
            else:
                break
            if not drafts:
                first = n
            drafts.append(token)
            ctx.append(token)
        return tuple(drafts), first
