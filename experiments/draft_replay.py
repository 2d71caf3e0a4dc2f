"""Replays of a c=1 spec_decode run's recorded greedy replies through llmkiln's drafters, no model
(bench/results/spec-decode-xeon/history: replay.py, k_escalation_replay.py): the run's prompts and replies, a lone
padded sequence's drafts (its own lookup from one-token matches up, then the history's where it beats them: the
scheduler's rule, `DraftHistory.instead_of`), and how many of them a reply accepts."""

from __future__ import annotations

import json
from pathlib import Path

from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.ngram_drafts import NgramIndex


def load(raw: Path, workload: str) -> list[tuple[list[int], list[int]]]:
    """(prompt, reply) of each request in the order sent; `raw`: the run's raw folder with
    `ovgenai-requests-WORKLOAD.json` (the prompts) and `llmkiln-ngram-WORKLOAD.outputs.json` (the replies)."""
    requests = json.loads((raw / f"ovgenai-requests-{workload}.json").read_text())["levels"]["1"]
    replies = json.loads((raw / f"llmkiln-ngram-{workload}.outputs.json").read_text())["1"]["output_ids"]
    return [(r["ids"], replies[str(r["index"])]) for r in requests]


def drafts(own: NgramIndex, history: DraftHistory | None, k: int) -> tuple[int, ...]:
    """A lone padded sequence's drafts: its own lookup's, or the history's instead where they beat them."""
    found, n = own.match(k, 1)
    better = history.instead_of(found, n, own.tokens, k) if history is not None else None
    return better[0] if better is not None else found


def accepted(proposed: tuple[int, ...], reply: list[int], pos: int) -> int:
    """How many of the drafts proposed at `pos` the reply agrees with, from the first."""
    n = 0
    for j, t in enumerate(proposed):
        if pos + j >= len(reply) or reply[pos + j] != t:
            break
        n += 1
    return n
