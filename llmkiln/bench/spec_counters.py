"""Speculative decoding's counters around a benchmark level: the engine's spec_* metrics scraped from the
served model's /metrics (llmkiln_engine{metric="spec_..."}, runtime.metrics.EngineMetric; both front doors
publish them) before and after the level, the difference is the level's `LevelStats.speculative`."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Mapping, Sequence

from llmkiln.bench.stats import SpecStats
from llmkiln.errors import BadInput
from llmkiln.runtime.metrics import EngineMetric as M

COUNTERS = (
    M.SPEC_DRAFTED_TOKENS,
    M.SPEC_ACCEPTED_TOKENS,
    M.SPEC_VERIFICATIONS,
    M.SPEC_FREE_DRAFTED_TOKENS,
    M.SPEC_FREE_ACCEPTED_TOKENS,
    M.SPEC_HISTORY_DRAFTED_TOKENS,
    M.SPEC_HISTORY_ACCEPTED_TOKENS,
)
_LINE = re.compile(r'^llmkiln_engine\{[^}]*\bmetric="(spec_[a-z_]+)"[^}]*\}\s+(\S+)$')


def parse(text: str) -> dict[str, float]:
    """The spec_* counters in a Prometheus text page, summed over label sets (several models or workers)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m and m.group(1) in {str(c) for c in COUNTERS}:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def scrape(urls: Sequence[str], timeout_s: float = 10.0) -> dict[str, float]:
    """parse() of every URL, summed (one per worker); BadInput naming the URL that does not answer."""
    total: dict[str, float] = {}
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                text = r.read().decode("utf-8", "replace")
        except OSError as exc:
            raise BadInput(
                f"--metrics {url}: cannot read it ({exc}); give the served model's /metrics URL"
            ) from None
        for k, v in parse(text).items():
            total[k] = total.get(k, 0.0) + v
    return total


def level_delta(before: Mapping[str, float], after: Mapping[str, float]) -> SpecStats | None:
    """The level's speculation (None when the pages carry no spec_* counters: an engine of an older llmkiln)."""
    if not after:
        return None
    d = {str(c): int(after.get(str(c), 0.0) - before.get(str(c), 0.0)) for c in COUNTERS}
    drafted, accepted, verified, free_drafted, free_accepted, history_drafted, history_accepted = (
        d[str(c)] for c in COUNTERS
    )
    return SpecStats(
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        verifications=verified,
        free_drafted_tokens=free_drafted,
        free_accepted_tokens=free_accepted,
        history_drafted_tokens=history_drafted,
        history_accepted_tokens=history_accepted,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_length=accepted / verified if verified else None,
    )
