"""Requests grouped by longest common token prefix: the families of prompts that could share cached blocks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from llmkiln.lint.prefixes import common_prefix_len


@dataclass(frozen=True)
class PrefixCluster:
    """Requests whose sorted token sequences share at least `min_shared` tokens with a neighbour.

    `common_tokens` is the prefix every member shares; `median_best_tokens` the median of what each member
    shares with its closest other member (a cluster split by, say, a timestamp shows a small common prefix
    and a larger median)."""

    members: list[int]  # request indices in file order
    common_tokens: int
    median_best_tokens: int

    def reusable_tokens(self, tokens_per_block: int) -> int:
        """Whole blocks of the common prefix (what every member but the first can reuse at least)."""
        return self.common_tokens // tokens_per_block * tokens_per_block


def cluster_by_prefix(ids: Sequence[Sequence[int]], min_shared: int) -> list[PrefixCluster]:
    """Clusters of at least two requests, largest first."""
    order = sorted(range(len(ids)), key=lambda i: tuple(ids[i]))
    adjacent = [common_prefix_len(ids[a], ids[b]) for a, b in zip(order, order[1:], strict=False)]
    clusters: list[PrefixCluster] = []
    start = 0
    for pos in range(len(order)):
        end_of_run = pos == len(order) - 1 or adjacent[pos] < min_shared
        if not end_of_run:
            continue
        if pos > start:
            links = adjacent[start:pos]
            best = [
                max(adjacent[k - 1] if k > start else 0, adjacent[k] if k < pos else 0)
                for k in range(start, pos + 1)
            ]
            clusters.append(
                PrefixCluster(
                    members=sorted(order[start : pos + 1]),
                    common_tokens=min(links),
                    median_best_tokens=int(statistics.median(best)),
                )
            )
        start = pos + 1
    clusters.sort(key=lambda c: (-len(c.members), c.members[0]))
    return clusters
