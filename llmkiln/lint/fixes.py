"""Text edits that make shared parts byte-identical: move dynamic content out, no literal BOS, a separator the
tokenizer does not merge across (a line break instead of trailing spaces). Each takes a shared part's text and
returns the edited text (plus what was moved out)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmkiln.lint.dynamic import Span

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CLAUSE_START = re.compile(r"[,;]\s*")
_CLAUSE_END = re.compile(r"[,;:][ \t]*")


def _units(text: str, spans: Sequence[Span]) -> list[tuple[int, int]]:
    """[start, end) of the clause around each span: within its sentence (a line without sentence ends is one
    sentence), from after the last ',' or ';' before it to the first ',', ';' or ':' after it ("Request id
    X:", "Current time: X", "Hello Alice!"); merged, in order."""
    out: list[tuple[int, int]] = []
    for s in spans:
        lo = text.rfind("\n", 0, s.start) + 1
        nl = text.find("\n", s.end)
        hi = len(text) if nl < 0 else nl + 1
        lo = max([lo] + [m.end() for m in _SENTENCE_END.finditer(text, lo, hi) if m.end() <= s.start])
        hi = min([hi] + [m.end() for m in _SENTENCE_END.finditer(text, s.end, hi)])
        lo = max([lo] + [m.end() for m in _CLAUSE_START.finditer(text, lo, s.start)])
        stop = _CLAUSE_END.search(text, s.end, hi)
        if stop is not None:
            hi = stop.end()
        if out and lo < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def move_out(text: str, spans: Sequence[Span]) -> tuple[str, str]:
    """(text without the lines/sentences holding the spans, those lines/sentences, each ending in a newline)."""
    units = _units(text, sorted(spans, key=lambda s: s.start))
    kept, moved, pos = [], [], 0
    for lo, hi in units:
        kept.append(text[pos:lo])
        piece = text[lo:hi].strip()
        if piece:
            moved.append(piece + "\n")
        pos = hi
        while pos < len(text) and text[pos] in " \t":
            pos += 1
    kept.append(text[pos:])
    return "".join(kept), "".join(moved)


def strip_bos(text: str, bos_text: str) -> str:
    """text without literal BOS strings (and whitespace between them) at its start."""
    if not bos_text:
        return text
    out = text
    while out.lstrip().startswith(bos_text):
        out = out.lstrip()[len(bos_text) :]
    return out


def with_separator(text: str) -> str:
    """text ending in a line break instead of trailing spaces (or with one added), so the tokenizer cannot merge
    its last token with what follows."""
    body = text.rstrip(" \t")
    return body if body.endswith("\n") else body + "\n"
