"""Verification of drafted tokens: which drafts the target model accepts, and the token after them.

A decode with drafts d_0..d_{k-1} runs k+1 tokens (the last token, then the drafts) in one pass and gets k+1
logits rows: row j is the model's next-token distribution after d_{j-1} (row 0: after the last token).

- Greedy (temperature 0): d_j is accepted while it equals row j's argmax; the first row whose argmax differs
  gives the token emitted instead, and when all k are accepted row k gives one more. The output is exactly what
  plain greedy decoding would produce (the same argmax of the same rows).
- Sampling: rejection sampling (Leviathan et al. 2023; vLLM's and TensorRT-LLM's rejection sampler) with a
  deterministic draft (the n-gram drafter proposes one token, q = one-hot): d_j is accepted with probability
  p_j(d_j), where p_j is the distribution `sample_token` would draw from at row j (temperature, top_k, top_p);
  on a rejection the emitted token is drawn from p_j without d_j, renormalised (max(p - q, 0)); all accepted,
  the extra token is drawn from p_k. Each emitted token then has exactly the distribution plain sampling gives
  it (the random stream differs, so a seeded request's tokens differ from a run without drafts).

Always at least one token comes out: a verification never does worse than the plain decode step it replaces.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.sampling import make_rng, sample_token, token_distribution


def accept_drafts(
    rows: np.ndarray, drafts: Sequence[int], params: SamplingParams, rng: np.random.Generator | None = None
) -> list[int]:
    """The tokens a verification emits: the accepted drafts, then one token from the model (1 to k+1 tokens).
    `rows`: [len(drafts) + 1, vocab] logits."""
    if rows.ndim != 2 or rows.shape[0] != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} logits rows, got shape {rows.shape}")
    greedy = params.temperature == 0.0 or params.top_k == 1
    out: list[int] = []
    if greedy:
        targets = np.argmax(rows, axis=-1)
        for j, d in enumerate(drafts):
            if int(targets[j]) != d:
                out.append(int(targets[j]))
                return out
            out.append(d)
        out.append(int(targets[len(drafts)]))
        return out
    rng = rng if rng is not None else make_rng(None)
    for j, d in enumerate(drafts):
        probs = token_distribution(rows[j], params.temperature, params.top_p, params.top_k)
        p = float(probs[d])
        if p > 0.0 and rng.random() < p:
            out.append(d)
            continue
        rest = probs.copy()
        rest[d] = 0.0
        total = rest.sum()
        if total <= 0.0:  # p(d) was 1 up to rounding: d is the only possible token
            out.append(d)
            continue
        out.append(int(rng.choice(rest.size, p=rest / total)))
        return out
    out.append(sample_token(rows[len(drafts)], params.temperature, params.top_p, params.top_k, rng))
    return out
