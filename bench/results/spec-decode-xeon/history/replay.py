"""Replay a c=1 run's greedy replies through the drafters, with no model: how many tokens a step a lone sequence
would make with its own lookup alone (n-gram index of prompt + output, one-token matches up, K drafts every step,
as a free row does) and with llmkiln's DraftHistory beside it (runtime.draft_history, the scheduler's rule: used
where the own match is on one token or none; a history match on 2+ tokens, or any when the own found nothing),
the replies recorded in the order they were sent. The same replies for both, so the difference is the drafter's
alone (a live run's bf16 replies differ a little between settings: the drafts change which run computes a
token's KV).

    python bench/results/spec-decode-xeon/history/replay.py RUN/raw WORKLOAD [K]

RUN/raw: a spec_decode run's raw folder with `ovgenai-requests-WORKLOAD.json` (the prompts) and
`llmkiln-ngram-WORKLOAD.outputs.json` (the replies); raw/ folders are not committed.
"""

import json
import sys
from pathlib import Path

from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.ngram_drafts import NgramIndex

raw, workload = Path(sys.argv[1]), sys.argv[2]
K = int(sys.argv[3]) if len(sys.argv) > 3 else 8
requests = json.loads((raw / f"ovgenai-requests-{workload}.json").read_text())["levels"]["1"]
replies = json.loads((raw / f"llmkiln-ngram-{workload}.outputs.json").read_text())["1"]["output_ids"]


def replay(history: DraftHistory | None) -> tuple[float, int]:
    steps = tokens = 0
    for req in requests:
        prompt, reply = req["ids"], replies[str(req["index"])]
        own = NgramIndex(3)
        own.extend(prompt)
        pos = 0
        while pos < len(reply):
            drafts, n = own.match(K, 1)
            if history is not None and n <= 1:
                found, _ = history.match(own.tokens, K, 1 if not drafts else 2)
                drafts = found or drafts
            accepted = 0
            for j, t in enumerate(drafts):
                if pos + j >= len(reply) or reply[pos + j] != t:
                    break
                accepted += 1
            step = min(accepted + 1, len(reply) - pos)
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
