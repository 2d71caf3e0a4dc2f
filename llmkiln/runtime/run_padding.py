"""Keep a small run's token count steady: OpenVINO's CPU plugin pays for every change of it.

The OpenVINO runner's graph has dynamic shapes; an infer whose token count differs from the previous one's
re-derives the shapes and buffers of every node first. Measured on an AMD EPYC Zen 5 (2 cores, SmolLM2-135M bf16,
one sequence on a 143-token past; `python -m experiments.openvino_run_shapes`): 15.3 ms a step at a constant 1 or
5 tokens, 18.7 ms when the count wanders between 1 and 5 as speculative drafts come and go (+22%); a separate infer
request per shape did not help (a separate compilation does: the runner's prompt graph), and a change of the rows asked for (`logits_indices`) or of the number of
sequences costs nothing. A few extra tokens do cost nothing on a memory-bound step (the weights are read once
whatever the rows: 16.0 ms for 1 token, 16.3 for 4, 18.5 for 8), so a run a few tokens short of the recent ones
is padded to their count: OpenVINO GenAI's prompt lookup pads its candidates to a constant count for the same
reason ("avoid shape checking and increasing the amount of computation when the shape changes").

`RunPadding.pad(n)` says how many tokens to add to a run of n: up to the largest count among the last WINDOW runs
that is at most LIMIT more and at most MAX_TOKENS in all (small runs only: beyond that a token costs what a change
does; a prefill run's hundreds never count; once no run of WINDOW reached a count, it steps down). The runner adds
them as a sequence of its own in a block no request owns, with no logits row: the real sequences' outputs are
untouched (tests/runtime/test_openvino_runner.py checks the logits).
`$LLMKILN_RUN_PADDING=N` sets the limit (0 turns it off), for measuring with and without.

With speculative decoding (`for_drafts(k)`, called by the engine with the recipe's max_draft_len) one sequence's
run has 1 to k + 1 tokens, and its count changes with every match found or missed: the limit becomes at least k
and a padded run may have k + 1 tokens, so a lone drafting sequence runs at a steady k + 1 as GenAI's prompt lookup
does. Measured on the Intel Xeon with AMX (SmolLM2 bf16, one sequence on a 300-token past, median of 24 runs): a
steady 1, 5 or 9 tokens 12-15 ms, the count changing among 1-9 17-20 ms, 1 token + 4 of padding alternating with 5
real ones 12.5-13 ms (bench/results/spec-decode-xeon/README.md, "K = 8 and padding to it").
"""

from __future__ import annotations

import os
from collections import deque

from llmkiln.errors import BadInput

ENV = "LLMKILN_RUN_PADDING"  # tokens (0: off), for A/B measurements; unset: LIMIT
LIMIT = 4  # tokens added at most
# the most tokens a padded run may have: up to here an extra token costs nothing (1 -> 15.6, 4 -> 16.6, 8 -> 19.6
# ms), beyond it ~0.8 ms a token (16 -> 25.4, 24 -> 33.2), as much as the change it would spare; measured too: at
# 8 sequences with drafts (16-40 tokens) padding made the drafting steps dearer and speculation stood aside
MAX_TOKENS = 8
WINDOW = 8  # runs


class RunPadding:
    """The token counts of the last WINDOW runs (before padding: a count not seen for WINDOW runs is let go)."""

    def __init__(
        self, limit: int = LIMIT, window: int = WINDOW, max_tokens: int = MAX_TOKENS, fixed: bool = False
    ) -> None:
        """`fixed`: limit and max_tokens were set by the environment, and for_drafts leaves them."""
        if limit < 0 or window < 1:
            raise ValueError(f"limit must be >= 0 and window >= 1, got {limit}, {window}")
        self.limit = limit
        self.max_tokens = max_tokens
        self._recent: deque[int] = deque(maxlen=window)
        self.padded_runs = 0
        self.padding_tokens = 0
        self.fixed = fixed

    def for_drafts(self, max_draft_len: int) -> bool:
        """Speculation drafts up to `max_draft_len` tokens a sequence: pad a one-sequence run up to 1 + that.
        True when a lone sequence's runs are then padded to 1 + max_draft_len (its drafts ride free)."""
        if not self.fixed and self.limit > 0:
            self.limit = max(self.limit, max_draft_len)
            self.max_tokens = max(self.max_tokens, max_draft_len + 1)
        return self.limit >= max_draft_len and self.max_tokens >= max_draft_len + 1

    def describe(self) -> str:
        """The runner's `run_padding` setting, as reported."""
        return f"up to {self.limit} tokens, runs of {self.max_tokens} at most"

    def pad(self, n: int) -> int:
        """Tokens to add to a run of n tokens (0: run as is); records the run."""
        top = min(n + self.limit, self.max_tokens)
        target = max((c for c in self._recent if n < c <= top), default=n)
        extra = target - n
        self._recent.append(n)
        if extra:
            self.padded_runs += 1
            self.padding_tokens += extra
        return extra


# tokens a padded run may have in all (unset: MAX_TOKENS), for A/B measurements
MAX_ENV = "LLMKILN_RUN_PADDING_MAX"


def from_env() -> RunPadding:
    """RunPadding with $LLMKILN_RUN_PADDING's limit (unset: LIMIT) and $LLMKILN_RUN_PADDING_MAX's run size (unset:
    MAX_TOKENS); BadInput for anything but a count."""
    raw = os.environ.get(ENV, "").strip()
    raw_max = os.environ.get(MAX_ENV, "").strip()
    for name, value in ((ENV, raw), (MAX_ENV, raw_max)):
        if value and not value.isdigit():
            raise BadInput(f"${name}={value!r}: give a token count (${ENV}=0 turns padding off)")
    return RunPadding(
        limit=int(raw) if raw else LIMIT,
        max_tokens=int(raw_max) if raw_max else MAX_TOKENS,
        fixed=bool(raw or raw_max),
    )
