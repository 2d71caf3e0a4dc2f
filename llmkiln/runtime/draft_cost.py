"""What a drafted token costs on this machine, learned from the engine's own decode steps.

Speculative decoding pays while a draft's chance of being accepted outweighs the compute of verifying it. On a
memory-bound CPU decode (a small batch) a verified row costs little more than reading the weights once; as the
batch grows the step becomes compute-bound and each row costs nearly what a sequence's token does (measured on
an AMD EPYC Zen 5, SmolLM2-135M bf16: a row adds ~2% of a token's cost at batch 2, ~25% at batch 8). Those
numbers depend on the CPU and the model, so they are measured, not written down: every pure decode step is a
sample `ns = fixed + seqs * per_seq + rows * per_row` (rows: the drafted tokens verified), fitted by recursive
least squares with forgetting (recent steps count most: the batch and the context change). A draft at depth i of
a sequence whose drafts are accepted with probability p is worth verifying when p**i >= `threshold(seqs)`, the
row's cost in tokens of that batch: per_row / ((fixed + seqs * per_seq) / seqs).
"""

from __future__ import annotations

import numpy as np

FORGET = 0.98  # weight of the past per step (about the last 50 steps count)
MIN_SAMPLES = 8  # steps with drafts before the fit is trusted
DEFAULT_THRESHOLD = 0.1  # until then: a draft is worth it above 10% acceptance at its depth
MAX_THRESHOLD = 1.0


class DraftCost:
    """The fit of decode step time to (sequences, verified draft rows)."""

    def __init__(self) -> None:
        self._p = np.eye(3) * 1e6  # inverse covariance of [fixed, per_seq, per_row]
        self._w = np.zeros(3)
        self.samples = 0  # steps with drafts seen

    def update(self, seqs: int, rows: int, ns: float) -> None:
        """One pure decode step: `seqs` sequences, `rows` drafted tokens verified, `ns` its run time."""
        x = np.array([1.0, float(seqs), float(rows)])
        px = self._p @ x
        gain = px / (FORGET + x @ px)
        self._w = self._w + gain * (ns - x @ self._w)
        self._p = (self._p - np.outer(gain, px)) / FORGET
        if rows:
            self.samples += 1

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """(fixed, per sequence, per draft row) in ns."""
        return float(self._w[0]), float(self._w[1]), float(self._w[2])

    def threshold(self, seqs: int) -> float:
        """The acceptance probability a draft needs at its depth in a step of `seqs` sequences: a row's cost in
        tokens of such a step (DEFAULT_THRESHOLD until MIN_SAMPLES steps with drafts were seen)."""
        if self.samples < MIN_SAMPLES or seqs <= 0:
            return DEFAULT_THRESHOLD
        fixed, per_seq, per_row = self.coefficients
        token = (fixed + seqs * per_seq) / seqs
        if token <= 0:
            return DEFAULT_THRESHOLD
        return float(min(MAX_THRESHOLD, max(0.0, per_row / token)))
