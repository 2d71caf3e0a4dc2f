"""Content that changes from request to request: timestamps, dates, times, UUIDs, ids, counters.

`find_spans` marks every candidate; whether a candidate is *dynamic* is decided by comparing requests (a fixed
date in every system prompt is harmless, one that changes per request defeats the cache). User names and other
free-text substitutions have no pattern: `alignment.py` finds them as short differing runs between otherwise
equal prompts. `MaskedText` replaces the candidates with placeholders so that prompts from one template compare
equal, and maps positions back to the original text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

_MONTH = r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
_WEEKDAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*,?\s+"

# Ordered: the first alternative that matches at a position wins (most specific first).
_PATTERNS: tuple[tuple[str, str], ...] = (
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    (
        "timestamp",
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?(?:Z|UTC|[+-]\d{2}:?\d{2}))?",
    ),
    ("timestamp", r"\b1[5-9]\d{8}(?:\d{3})?\b"),  # Unix seconds / milliseconds (2017-2033)
    ("date", r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b"),
    ("date", rf"\b(?:{_WEEKDAY})?{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b"),
    ("date", rf"\b(?:{_WEEKDAY})?\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?,?\s+\d{{4}}\b"),
    ("time", r"\b\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?"),
    ("id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"),
    ("id", r"\b(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z][A-Za-z0-9]*[_-]?[A-Za-z0-9_-]{4,}\b"),
    ("counter", r"\b\d+\b"),
)
_KINDS = [kind for kind, _ in _PATTERNS]
_RE = re.compile("|".join(f"(?P<k{i}>{p})" for i, (_, p) in enumerate(_PATTERNS)))

KIND_NAMES = {
    "uuid": "UUIDs",
    "timestamp": "timestamps",
    "date": "dates",
    "time": "times of day",
    "id": "random ids",
    "counter": "counters",
    "name": "user names",
    "text": "varying words",
}
DYNAMIC_KINDS = frozenset(KIND_NAMES)
# Spelling kinds (normalized_spans): what a whitespace run or a literal BOS counts as when prompts are compared.
_REPLACEMENT = {"space": " ", "newline": "\n", "edge": "", "bos": ""}
_ODD_WHITESPACE = re.compile(r"\s*\n\s*|[ \t\f\v]{2,}|[\t\f\v\r]")


@dataclass(frozen=True)
class Span:
    """[start, end) of a candidate in a text, and what it looks like."""

    start: int
    end: int
    kind: str


_DIGITS = re.compile(r"\d+")
_WINDOW = 40  # every pattern holds a digit and reaches at most this far from it (a weekday and month name)


def _windows(text: str) -> list[tuple[int, int]]:
    """Merged [lo, hi) windows around the digits, widened to whitespace so no match is cut."""
    out: list[tuple[int, int]] = []
    for m in _DIGITS.finditer(text):
        lo = max(0, m.start() - _WINDOW)
        hi = min(len(text), m.end() + _WINDOW)
        while lo > 0 and not text[lo - 1].isspace():
            lo -= 1
        while hi < len(text) and not text[hi].isspace():
            hi += 1
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def find_spans(text: str) -> list[Span]:
    """Every timestamp / date / time / UUID / id / number in text, left to right, not overlapping.

    Every pattern needs a digit, so the (slow) combined pattern runs only in windows around digits: prose
    without digits costs one scan for digits."""
    out: list[Span] = []
    for lo, hi in _windows(text):
        for m in _RE.finditer(text, lo, hi):
            if out and m.start() < out[-1].end:
                continue
            group = m.lastgroup or "k0"
            out.append(Span(m.start(), m.end(), _KINDS[int(group[1:])]))
    return out


def _whitespace_spans(text: str, bos_text: str) -> list[Span]:
    """Leading/trailing whitespace and literal BOS strings (dropped), other whitespace runs that are not a
    single space or a single line break (made one)."""
    out: list[Span] = []
    pos = 0
    while True:  # leading whitespace and BOS literals
        m = re.match(r"\s+", text[pos:])
        if m:
            out.append(Span(pos, pos + m.end(), "edge"))
            pos += m.end()
        elif bos_text and text.startswith(bos_text, pos):
            out.append(Span(pos, pos + len(bos_text), "bos"))
            pos += len(bos_text)
        else:
            break
    body_end = len(text.rstrip())
    for m in _ODD_WHITESPACE.finditer(text, pos, body_end):
        kind = "newline" if "\n" in m.group() else "space"
        if m.group() != _REPLACEMENT[kind]:
            out.append(Span(m.start(), m.end(), kind))
    if body_end < len(text) and body_end >= pos:
        out.append(Span(body_end, len(text), "edge"))
    return out


def normalized_spans(text: str, bos_text: str = "") -> list[Span]:
    """Dynamic candidates plus whitespace and BOS spellings: masking them all makes prompts from one template
    compare equal however they were spelled."""
    merged: list[Span] = []
    for s in sorted(find_spans(text) + _whitespace_spans(text, bos_text), key=lambda s: (s.start, -s.end)):
        if merged and s.start < merged[-1].end:
            continue
        merged.append(s)
    return merged


def placeholder(kind: str) -> str:
    return _REPLACEMENT.get(kind, f"\x00{kind}\x00")


class MaskedText:
    """`text` with each span replaced by its placeholder (`placeholder(kind)`); `original(pos)` maps back."""

    def __init__(self, text: str, spans: list[Span]) -> None:
        self.source = text
        self.spans = spans
        parts: list[str] = []
        self._masked_starts: list[int] = []  # start of each segment in the masked text
        self._orig_starts: list[int] = []  # start of the same segment in the original
        self._is_span: list[bool] = []
        pos = masked = 0
        for s in spans:
            if s.start > pos:
                self._add(masked, pos, False)
                parts.append(text[pos : s.start])
                masked += s.start - pos
            rep = placeholder(s.kind)
            self._add(masked, s.start, True)
            parts.append(rep)
            masked += len(rep)
            pos = s.end
        self._add(masked, pos, False)
        parts.append(text[pos:])
        self.text = "".join(parts)

    def _add(self, masked: int, orig: int, is_span: bool) -> None:
        self._masked_starts.append(masked)
        self._orig_starts.append(orig)
        self._is_span.append(is_span)

    def original(self, pos: int, before_dropped: bool = False) -> int:
        """The original position of masked position `pos`; inside a placeholder, the span's start (two texts
        that differ inside placeholders differ in the span's kind: the span is not shared). Dropped spans (empty
        placeholders) at `pos` are skipped, unless `before_dropped` (for the start of a range)."""
        k = bisect.bisect_right(self._masked_starts, pos) - 1
        while before_dropped and k > 0 and self._masked_starts[k - 1] == pos:
            k -= 1
        if self._is_span[k]:
            return self._orig_starts[k]
        return self._orig_starts[k] + (pos - self._masked_starts[k])
