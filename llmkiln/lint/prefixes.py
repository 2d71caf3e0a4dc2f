"""Longest common prefixes, fast: slice comparisons run in C, so a prefix of n items costs n/64 of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

S = TypeVar("S", str, Sequence[int])

_STEP = 64


def common_prefix_len(a: S, b: S, start: int = 0) -> int:
    """Length of the longest common prefix of a and b (both str, or both sequences of ints), checking from
    `start` on (the caller knows the first `start` items agree)."""
    n = min(len(a), len(b))
    i = start
    while i + _STEP <= n and a[i : i + _STEP] == b[i : i + _STEP]:
        i += _STEP
    lo, hi = i, min(i + _STEP, n)  # the first difference lies in [lo, hi]
    while lo < hi:  # binary search: largest m with a[i:m] == b[i:m]
        mid = (lo + hi + 1) // 2
        if a[i:mid] == b[i:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def best_neighbour_prefix(items: Sequence[S]) -> tuple[list[int], list[int]]:
    """For each item: the longest prefix it shares with any other item, and that other item's index (-1 when
    alone). Sorting puts the best partner next to each item, so only neighbours are compared."""
    order = sorted(range(len(items)), key=lambda i: tuple(items[i]))
    best = [0] * len(items)
    partner = [-1] * len(items)
    for a, b in zip(order, order[1:], strict=False):
        n = common_prefix_len(items[a], items[b])
        if n >= best[a]:
            best[a], partner[a] = n, b
        if n >= best[b]:
            best[b], partner[b] = n, a
    return best, partner
