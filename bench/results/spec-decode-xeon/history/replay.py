"""Replay a c=1 run's greedy replies through the drafters, with no model: how many tokens a step a lone sequence
would make with its own lookup alone (n-gram index of prompt + output, one-token matches up, K drafts every step,
as a free row does) and with llmkiln's DraftHistory beside it (the scheduler's rule, `DraftHistory.instead_of`),
the replies recorded in the order they were sent. The same replies for both, so the difference is the drafter's
alone (a live run's bf16 replies differ a little between settings: the drafts change which run computes a
token's KV).

    PYTHONPATH=. python bench/results/spec-decode-xeon/history/replay.py RUN/raw WORKLOAD [K]

RUN/raw: a spec_decode run's raw folder (experiments.draft_replay.load); raw/ folders are not committed.
"""

import sys
from pathlib import Path

from experiments.draft_replay import accepted, drafts, load
from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.ngram_drafts import NgramIndex

raw, workload = Path(sys.argv[1]), sys.argv[2]
K = int(sys.argv[3]) if len(sys.argv) > 3 else 8
run = load(raw, workload)


def replay(history: DraftHistory | None) -> tuple[float, int]:
    steps = tokens = 0
    for prompt, reply in run:
        own = NgramIndex(3)
        own.extend(prompt)
        pos = 0
        while pos < len(reply):
            step = min(accepted(drafts(own, history, K), reply, pos) + 1, len(reply) - pos)
            own.extend(reply[pos : pos + step])
            pos += step
            steps += 1
            tokens += step
        if history is not None:
            history.record(prompt, reply)
    return tokens / steps, steps


for name, history in (("own lookup", None), ("own + history", DraftHistory(16384))):
    per_step, steps = replay(history)
    print(f"{workload} K={K} {name}: {per_step:.3f} tokens a step ({steps} steps)")
