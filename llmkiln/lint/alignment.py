"""How far each request's text agrees with its closest other request, looking past short substitutions.

Texts are compared masked (dynamic.MaskedText), so a different timestamp does not end the agreement. A
difference that no pattern covers — a user name, a customer's city — is found as a *slot*: after the first
difference both texts continue identically for at least RESYNC_CHARS characters within MAX_SLOT_CHARS of it
("Hello Alice, you are ..." vs "Hello Bob, you are ..."). Slots are reported in original coordinates with the
kind "name" (capitalized words) or "text".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmkiln.lint.dynamic import MaskedText, Span
from llmkiln.lint.prefixes import common_prefix_len

RESYNC_CHARS = 24
MAX_SLOT_CHARS = 40
MAX_SLOTS = 8
_NAME = re.compile(r"^[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*){0,3}$")


@dataclass
class Agreement:
    """What one request shares with its best partner: up to `end` (original coordinates), with `slots`."""

    end: int = 0
    slots: list[Span] = field(default_factory=list)


def _word_start(text: str, pos: int) -> int:
    while pos > 0 and (text[pos - 1].isalnum() or text[pos - 1] in "_'’"):
        pos -= 1
    return pos


def _resync(a: str, b: str, p: int) -> tuple[int, int] | None:
    """(i, j): a[p+i:] and b[p+j:] agree again for RESYNC_CHARS characters; the smallest i first."""
    for i in range(MAX_SLOT_CHARS + 1):
        needle = a[p + i : p + i + RESYNC_CHARS]
        if len(needle) < RESYNC_CHARS:
            return None
        j = b.find(needle, p, p + MAX_SLOT_CHARS + RESYNC_CHARS)
        if j >= 0 and (i > 0 or j > p):
            if "\n" in a[p : p + i] or "\n" in b[p:j] or "\x00" in a[p : p + i] + b[p:j]:
                return None
            return i, j - p
    return None


def _kind(values: Sequence[str]) -> str:
    vals = [v.strip(" ,.;:") for v in values if v.strip()]
    return "name" if vals and all(_NAME.match(v) for v in vals) else "text"


def agree(a: MaskedText, b: MaskedText) -> tuple[Agreement, Agreement]:
    """How far a and b agree (masked), with the slots bridged on the way."""
    ta, tb = a.text, b.text
    pa = pb = 0
    slots_a: list[Span] = []
    slots_b: list[Span] = []
    while True:
        n = common_prefix_len(ta[pa:], tb[pb:])
        pa, pb = pa + n, pb + n
        if pa >= len(ta) or pb >= len(tb) or len(slots_a) >= MAX_SLOTS:
            break
        back = min(pa - _word_start(ta, pa), pb - _word_start(tb, pb))
        sa, sb = pa - back, pb - back
        found = _resync(ta[sa:], tb[sb:], 0)
        if found is None:
            break
        i, j = found
        kind = _kind([ta[sa : sa + i], tb[sb : sb + j]])
        slots_a.append(Span(a.original(sa, True), a.original(sa + i), kind))
        slots_b.append(Span(b.original(sb, True), b.original(sb + j), kind))
        pa, pb = sa + i, sb + j
    return Agreement(a.original(pa), slots_a), Agreement(b.original(pb), slots_b)


def best_agreements(texts: Sequence[MaskedText]) -> list[Agreement]:
    """Each text's agreement with its sorted neighbours (the longer one; slots of both)."""
    order = sorted(range(len(texts)), key=lambda i: texts[i].text)
    out = [Agreement() for _ in texts]
    for x, y in zip(order, order[1:], strict=False):
        ax, ay = agree(texts[x], texts[y])
        for idx, ag in ((x, ax), (y, ay)):
            cur = out[idx]
            if ag.end > cur.end:
                cur.end = ag.end
            known = {(s.start, s.end) for s in cur.slots}
            cur.slots.extend(s for s in ag.slots if (s.start, s.end) not in known and s.end <= cur.end)
    return out
