"""What a drafted token costs on this machine, learned from the engine's own decode steps.

Speculative decoding pays while a draft's chance of being accepted outweighs the compute of verifying it. On a
memory-bound CPU decode (a small batch) a verified row costs little more than reading the weights once; as the
batch grows the step becomes compute-bound and each row costs a good share of a sequence's token (measured on
an AMD EPYC Zen 5, SmolLM2-135M bf16: a row adds ~3% of a token's cost alone, ~11% at batch 8). Those numbers
depend on the CPU, the model and the context, so they are measured, not written down: for each batch size the
engine keeps its last WINDOW pure decode steps, (verified draft rows, run time), and fits `ns = base + rows *
per_row` by least squares. A draft at depth i of a sequence whose drafts are accepted with probability p is worth
verifying when p**i >= `threshold(seqs)`: MARGIN times the row's cost in tokens of that batch,
per_row / (base / seqs).

The fit prices a row; it cannot see what else a verification costs (the logits of 1 + k rows, acceptance in
Python, the events of the accepted tokens) nor what the step does beside it. So each batch size also keeps the
yield of both kinds of pure decode step — time per token out, an exponential average over steps that verified
drafts and over steps that did not — and drafting stands aside at a batch size whose drafting steps yield less
than its plain ones (`speculates`). A look now and then at the kind not in use (EXPLORE_EVERY) keeps both fresh.
"""

from __future__ import annotations

import os
from collections import deque

from llmkiln.errors import BadInput

WINDOW = 64  # steps per batch size in the fit (recent ones: the context grows, the traffic changes)
MIN_STEPS = 8  # steps at a batch size, some with drafts and some with another number of rows, before a fit
DEFAULT_THRESHOLD = 0.1  # without a fit: a draft is worth it above 10% acceptance at its depth
MARGIN = 2.0  # a draft must be expected to bring twice its fitted cost: the fit on pure decode steps
# underestimates what a verification costs in a busy batch (mixed prefill runs, more events per step; measured:
# open chat at c = 4 and 8 lost 10% with the bare fit)
MARGIN_ENV = "LLMKILN_DRAFT_MARGIN"  # another margin, for A/B measurements
MAX_THRESHOLD = 1.0
# a threshold at or below this prices a row as free (a fit of ~0 ns a row: one sequence, its runs padded to a
# constant token count by runtime.run_padding): the scheduler then drafts from one-token matches too, whatever
# min_matching_ngram_size says (measured on SmolLM2 bf16, grounded c=1: 2.97 tokens a step and 141-147 tok/s with
# them, 2.36 and 115-129 without)
FREE_ROW = 0.05
YIELD_WEIGHT = 0.1  # the newest step's weight in the time-per-token averages
# steps at a batch size between two looks at the kind of step it does not use: drafting again soon after it stood
# aside (the traffic may have turned repetitive), a plain step rarely while drafting pays (each one gives up a gain)
EXPLORE_EVERY = {True: 16, False: 64}  # keyed by the kind looked at: drafting (True), plain (False)


class _Yield:
    """One batch size's time per token out, for steps that verified drafts and for plain steps (ns, None: none
    seen), and the steps since each kind last ran."""

    def __init__(self) -> None:
        self.ns_per_token: dict[bool, float | None] = {True: None, False: None}
        self.since: dict[bool, int] = {True: 0, False: 0}

    def add(self, drafted: bool, ns_per_token: float) -> None:
        old = self.ns_per_token[drafted]
        self.ns_per_token[drafted] = (
            ns_per_token if old is None else old + YIELD_WEIGHT * (ns_per_token - old)
        )
        self.since[drafted] = 0
        self.since[not drafted] += 1


def _line(points: deque[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares ns = base + rows * per_row over the window, (base, per_row ≥ 0); None when every step had
    the same row count. In closed form: it runs at every step of a speculating engine (numpy's polyfit took
    ~200 µs of a 15 ms step)."""
    n = len(points)
    sr = sum(r for r, _ in points)
    st = sum(t for _, t in points)
    mean_r, mean_t = sr / n, st / n
    var = sum((r - mean_r) ** 2 for r, _ in points)
    if var == 0:
        return None
    per_row = sum((r - mean_r) * (t - mean_t) for r, t in points) / var
    return (mean_t - per_row * mean_r, max(per_row, 0.0))


class DraftCost:
    """Per batch size, the fit of decode step time to the verified draft rows."""

    def __init__(self) -> None:
        self.margin = margin_from_env()  # MARGIN unless $LLMKILN_DRAFT_MARGIN says otherwise
        self._steps: dict[int, deque[tuple[int, float]]] = {}
        self._fits: dict[int, tuple[float, float] | None] = {}  # batch size -> (base ns, ns per row), cached
        self._yields: dict[int, _Yield] = {}

    def update(self, seqs: int, rows: int, ns: float, emitted: int | None = None) -> None:
        """One pure decode step: `seqs` sequences, `rows` drafted tokens verified, `ns` its run time, `emitted`
        the tokens it gave (seqs + accepted drafts; None: not counted, the yields are left as they are)."""
        window = self._steps.setdefault(seqs, deque(maxlen=WINDOW))
        window.append((rows, float(ns)))
        self._fits.pop(seqs, None)
        if emitted is not None and emitted > 0:
            self._yields.setdefault(seqs, _Yield()).add(rows > 0, float(ns) / emitted)

    def speculates(self, seqs: int) -> bool:
        """Whether a step of `seqs` sequences may draft: yes until both kinds of step were timed at that batch
        size, then while drafting steps take less time per token out than plain ones — and now and then
        (EXPLORE_EVERY) the kind not in use, so that its average follows the traffic."""
        y = self._yields.get(seqs)
        if y is None:
            return True
        spec, plain = y.ns_per_token[True], y.ns_per_token[False]
        if spec is None or plain is None:
            return True
        pays = spec < plain
        if y.since[not pays] >= EXPLORE_EVERY[not pays] - 1:  # one step in EXPLORE_EVERY
            return not pays
        return pays

    def fit(self, seqs: int) -> tuple[float, float] | None:
        """(base ns, ns per verified row) at this batch size; None until MIN_STEPS steps with at least two
        different row counts were seen there."""
        if seqs in self._fits:
            return self._fits[seqs]
        window = self._steps.get(seqs)
        out = None
        if window is not None and len(window) >= MIN_STEPS:
            out = _line(window)
        self._fits[seqs] = out
        return out

    def threshold(self, seqs: int) -> float:
        """The acceptance probability a draft needs at its depth in a step of `seqs` sequences: a row's cost in
        tokens of such a step (DEFAULT_THRESHOLD until that batch size has a fit)."""
        fit = self.fit(seqs)
        if fit is None or fit[0] <= 0 or seqs <= 0:
            return DEFAULT_THRESHOLD
        base, per_row = fit
        return float(min(MAX_THRESHOLD, self.margin * per_row / (base / seqs)))


def margin_from_env() -> float:
    """$LLMKILN_DRAFT_MARGIN (unset: MARGIN); BadInput for anything but a number ≥ 0."""
    raw = os.environ.get(MARGIN_ENV, "").strip()
    if not raw:
        return MARGIN
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise BadInput(f"${MARGIN_ENV}={raw!r}: give a number >= 0 (unset: {MARGIN})")
    return value
