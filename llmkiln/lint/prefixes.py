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
