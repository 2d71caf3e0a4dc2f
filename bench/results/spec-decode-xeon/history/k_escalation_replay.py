"""Would a larger K pay while drafts are all accepted? A replay of a c=1 run's recorded replies (no model) with a
lone sequence drafting K1=8 (own lookup, then the history, as the scheduler does) and switching to K2 after a
verification that accepted all K1 drafts, back to K1 once one accepts fewer than K1; time from a cost model of the
padded run of 1 + K tokens: 11.5 ms + 0.17 ms a token up to 9 (Xeon: 9 tokens +1.35 ms over 1,
c1-profile/like_for_like.out), PER_HI a token beyond (0.8: runtime/run_padding.py's MAX_TOKENS measurements, 8
tokens 19.6 ms, 16 25.4, 24 33.2; 0.4 for a kinder case), and ~5 ms for each switch of the padded size
(bench/results/spec-decode-xeon/README.md, "K = 8 and padding to it": a changing size 17-20 ms against 12-15).

    PYTHONPATH=. python bench/results/spec-decode-xeon/history/k_escalation_replay.py RUN/raw grounded|open
"""

import sys
from pathlib import Path

from experiments.draft_replay import accepted, drafts, load
from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.ngram_drafts import NgramIndex

raw, workload = Path(sys.argv[1]), sys.argv[2]
run = load(raw, workload)
SWITCH_MS = 5.0


def cost_ms(tokens: int, per_hi: float) -> float:
    return 11.5 + min(tokens - 1, 8) * 0.17 + max(0, tokens - 9) * per_hi


def replay(k1: int, k2: int, per_hi: float) -> tuple[float, float, int]:
    """(tokens a second, tokens a step, switches)."""
    history = DraftHistory(16384)
    ms = 0.0
    tokens = steps = switches = 0
    for prompt, reply in run:
        own = NgramIndex(3)
        own.extend(prompt)
        pos, k = 0, k1
        while pos < len(reply):
            took = accepted(drafts(own, history, k), reply, pos)
            step = min(took + 1, len(reply) - pos)
            ms += cost_ms(1 + k, per_hi)
            steps += 1
            tokens += step
            own.extend(reply[pos : pos + step])
            pos += step
            nxt = k2 if (k == k1 and took == k1) or (k == k2 and took >= k1) else k1
            if nxt != k:
                switches += 1
                ms += SWITCH_MS
                k = nxt
        history.record(prompt, reply)
    return tokens / ms * 1000, tokens / steps, switches


for per_hi in (0.4, 0.8):
    base = replay(8, 8, per_hi)
    for k2 in (12, 16, 24):
        got = replay(8, k2, per_hi)
        print(
            f"{workload} per-token beyond 9: {per_hi} ms, K 8 -> {k2}: {got[0] / base[0]:.3f}x tokens/s "
            f"({got[1]:.2f} vs {base[1]:.2f} tokens a step, {got[2]} switches)"
        )
