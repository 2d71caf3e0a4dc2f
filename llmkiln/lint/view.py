"""A request list seen as text: each request's shared part, its spelling-free key and its dynamic spans.

Two passes over the texts (raw prompts, or the system message of chat requests):
1. texts are masked (dynamic values, whitespace spellings and literal BOS replaced by placeholders) and each is
   compared with its sorted neighbours, bridging short substitutions: these become slots (user names, ...);
2. texts are masked again with the slots, sorted, and cut into runs of neighbours that share at least
   MIN_SHARED_CHARS masked characters. A run is one template: its common masked prefix, cut back to a line
   break, is the shared part of every member (the whole system message for chat requests).
No tokenization here: this is the cheap half of the analysis, rebuilt after every fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmkiln.lint.alignment import best_agreements
from llmkiln.lint.dynamic import DYNAMIC_KINDS, MaskedText, Span, normalized_spans
from llmkiln.lint.prefixes import common_prefix_len
from llmkiln.lint.requests import PromptRequest
from llmkiln.lint.shared_part import SharedPart, shared_part, snap_end

MIN_SHARED_CHARS = 16


@dataclass(frozen=True)
class RequestView:
    """One request's shared part; `key` is equal for requests of one template however spelled and whatever
    their dynamic values; `dynamic` are the candidate spans (patterns and slots) inside the shared part, in
    order (requests with one key have as many)."""

    part: SharedPart
    key: str
    dynamic: list[Span]
    whole: bool  # the shared part is the whole text the request was compared on


def _alignment_text(request: PromptRequest) -> str:
    if request.messages is None:
        return request.prompt or ""
    if request.messages and request.messages[0][0] == "system":
        return request.messages[0][1]
    return ""


def _with_slots(spans: list[Span], slots: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in sorted(spans + slots, key=lambda s: (s.start, -s.end)):
        if not out or s.start >= out[-1].end:
            out.append(s)
    return out


def _masked_end(m: MaskedText, n: int) -> int:
    """A masked prefix length cut back to just after its last line break (the whole text stays whole)."""
    return n if n >= len(m.text) else snap_end(m.text, n)


def _run_ends(masked: Sequence[MaskedText], raw: Sequence[bool]) -> list[int]:
    """Masked length of each raw text's shared part: the common prefix of its run (0 outside runs)."""
    idx = [i for i in range(len(masked)) if raw[i]]
    order = sorted(idx, key=lambda i: masked[i].text)
    ends = [0] * len(masked)
    links = [
        common_prefix_len(masked[a].text, masked[b].text) for a, b in zip(order, order[1:], strict=False)
    ]
    start = 0
    for pos in range(len(order)):
        if pos < len(links) and links[pos] >= MIN_SHARED_CHARS:
            continue
        if pos > start:
            common = min(links[start:pos])
            for k in order[start : pos + 1]:
                ends[k] = _masked_end(masked[k], common)
        start = pos + 1
    return ends


def build_view(requests: Sequence[PromptRequest], bos_text: str) -> list[RequestView]:
    """The view of every request."""
    texts = [_alignment_text(r) for r in requests]
    spans = [normalized_spans(t, bos_text) for t in texts]
    first = [MaskedText(t, s) for t, s in zip(texts, spans, strict=True)]
    agreements = best_agreements(first)
    masked = [
        MaskedText(t, _with_slots(s, ag.slots)) if ag.slots else m
        for t, s, ag, m in zip(texts, spans, agreements, first, strict=True)
    ]
    raw = [r.messages is None for r in requests]
    ends = _run_ends(masked, raw)
    out = []
    for req, text, m, end in zip(requests, texts, masked, ends, strict=True):
        if req.messages is not None:
            end = len(m.text)
        elif end == len(m.text) and "\x00" in m.text[m.text.rfind("\n") + 1 :]:
            end = m.text.rfind("\n") + 1  # the varying last line is the request's own part, not shared
        part = shared_part(req, m.original(end) if end < len(m.text) else len(text))
        n = len(part.text)
        dynamic = [s for s in m.spans if s.kind in DYNAMIC_KINDS and s.end <= n]
        key = m.text[:end] if n else ""
        out.append(RequestView(part, f"{part.where}\x01{key}", dynamic, whole=n == len(text)))
    return out
