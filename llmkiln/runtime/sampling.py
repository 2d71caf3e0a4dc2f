"""Token sampling over one logits row: greedy, temperature, top-k, top-p — a pure function with a seeded Generator.

The batching runtime samples every request's next token with it; the parameters are validated once, by
SamplingParams.check (runtime/request.py). temperature == 0 means greedy (argmax, lowest id on ties); top_k == 0
and top_p == 1.0 disable those filters.
"""

from __future__ import annotations

import numpy as np


def make_rng(seed: int | None) -> np.random.Generator:
    """A numpy Generator; a given seed makes sampling reproducible."""
    return np.random.default_rng(seed)


TOP_P_TOLERANCE = 1e-9


def sample_token(
    logits: np.ndarray,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    rng: np.random.Generator | None = None,
) -> int:
    """Pick the next token id from one row of logits (shape [vocab])."""
    if temperature == 0.0 or top_k == 1:  # argmax of the float32 row: the same id, no float64 copy
        return int(np.argmax(logits))
    probs = token_distribution(logits, temperature, top_p, top_k)
    rng = rng if rng is not None else make_rng(None)
    return int(rng.choice(probs.size, p=probs))


def token_distribution(
    logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> np.ndarray:
    """The distribution `sample_token` draws from at temperature > 0 (float64 [vocab], sums to 1): softmax of
    logits / temperature, cut to the top_k ids and to the smallest set whose mass reaches top_p."""
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    scaled = row / temperature
    if 0 < top_k < scaled.size:
        kth = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - np.max(scaled))
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # keep the smallest prefix whose mass reaches top_p (always at least one token); the tolerance absorbs
        # the last-bit rounding of exp/cumsum, which differs between CPUs' libm paths (0.5 + 0.3 summed to
        # 0.8 - 1.1e-16 on an AMD EPYC Zen 5 and kept a third token)
        keep = int(np.searchsorted(cumulative, top_p - TOP_P_TOLERANCE, side="left")) + 1
        mask = np.zeros_like(probs, dtype=bool)
        mask[order[:keep]] = True
        probs = np.where(mask, probs, 0.0)
        probs /= probs.sum()
    return probs
