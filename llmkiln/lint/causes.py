"""The causes that break prefix sharing, each found from the requests and turned into a concrete fix.

Each detector returns a Proposal: the finding's text, the requests it hits, and how to apply the fix — edited
requests (what `--fix` writes) or a recipe change (a chat template without bos_token, smaller blocks) — so the
hit rate after the fix is computed by the same simulation, never estimated.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmkiln.lint.clusters import cluster_by_prefix
from llmkiln.lint.dynamic import KIND_NAMES, MaskedText, Span, find_spans
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.findings import Cause
from llmkiln.lint.fixes import move_out, strip_bos, with_separator
from llmkiln.lint.prefixes import common_prefix_len
from llmkiln.lint.requests import PromptRequest
from llmkiln.lint.shared_part import rebuild
from llmkiln.lint.view import RequestView

MAX_EXAMPLES = 3


@dataclass
class Proposal:
    """A finding before its hit rate after the fix is computed."""

    cause: Cause
    severity: str
    title: str
    detail: str
    indices: list[int]
    fix: str
    examples: list[str] = field(default_factory=list)
    recipe_field: str | None = None
    fixed: list[PromptRequest] | None = None  # the whole request list with this fix applied
    bos_text: str | None = None  # render chat templates with this bos_token instead
    tokens_per_block: int | None = None
    unlimited: bool = False


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def _line_of(text: str, span: Span) -> str:
    lo = text.rfind("\n", 0, span.start) + 1
    hi = text.find("\n", span.end)
    return text[lo : len(text) if hi < 0 else hi].strip()


def _groups(views: Sequence[RequestView]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, v in enumerate(views):
        if v.part.text:
            groups[v.key].append(i)
    return {k: m for k, m in groups.items() if len(m) > 1}


# ---------------------------------------------------------------------------------------------------------------
def dynamic_content(requests: Sequence[PromptRequest], views: Sequence[RequestView]) -> Proposal | None:
    """Values that differ between requests of one template inside its shared part."""
    variable: dict[int, list[Span]] = defaultdict(list)
    kinds: Counter[str] = Counter()
    examples: list[str] = []
    for members in _groups(views).values():
        n = len(views[members[0]].dynamic)
        if n == 0 or any(len(views[m].dynamic) != n for m in members):
            continue
        for k in range(n):
            values = {
                views[m].part.text[views[m].dynamic[k].start : views[m].dynamic[k].end] for m in members
            }
            if len(values) < 2:
                continue
            kind = views[members[0]].dynamic[k].kind
            kinds[kind] += len(members)
            for m in members:
                variable[m].append(views[m].dynamic[k])
            if len(examples) < MAX_EXAMPLES:
                first = views[members[0]]
                span = first.dynamic[k]
                examples.append(
                    f"{KIND_NAMES[kind]}: {len(values)} values, e.g. line {requests[members[0]].lineno}: "
                    f"{_short(_line_of(first.part.text, span))}"
                )
    if not variable:
        return None
    fixed = list(requests)
    for i, spans in variable.items():
        new_text, moved = move_out(views[i].part.text, spans)
        fixed[i] = rebuild(requests[i], views[i].part, new_text, moved)
    what = ", ".join(f"{KIND_NAMES[k]} ({n} requests)" for k, n in kinds.most_common())
    where = "system prompt" if any(views[i].part.where == "system" for i in variable) else "prefix"
    return Proposal(
        "dynamic-content",
        "breaks-sharing",
        f"dynamic content inside the shared {where}: {what}",
        "each request's shared part differs from the others' at these values, so the cached prefix ends "
        "at the first of them",
        sorted(variable),
        "move the lines holding these values after the shared part (to the start of the user turn): "
        "`--fix OUT` does it",
        examples,
        fixed=fixed,
    )


# ---------------------------------------------------------------------------------------------------------------
def _shown(masked: str) -> str:
    return re.sub("\x00([a-z]+)\x00", r"<\1>", masked)


def _spelling(text: str, bos_text: str) -> str:
    body = strip_bos(text, bos_text)
    return MaskedText(body, find_spans(body)).text


def _respell(template: RequestView, member: RequestView, bos_text: str) -> str:
    """The template's spelling with the member's dynamic values (and the member's own leading BOS literal)."""
    t = template.part.text
    out, pos = [], 0
    for ts, ms in zip(template.dynamic, member.dynamic, strict=True):
        out.append(t[pos : ts.start])
        out.append(member.part.text[ms.start : ms.end])
        pos = ts.end
    out.append(t[pos:])
    text = "".join(out)
    own = member.part.text
    bos_prefix = own[: len(own) - len(strip_bos(own, bos_text))]
    return bos_prefix + strip_bos(text, bos_text)


def whitespace_variants(
    requests: Sequence[PromptRequest], views: Sequence[RequestView], bos_text: str
) -> Proposal | None:
    """Shared parts of one template spelled with different whitespace (trailing newline, double spaces, ...)."""
    fixed = list(requests)
    hit: list[int] = []
    examples: list[str] = []
    for members in _groups(views).values():
        spellings = {m: _spelling(views[m].part.text, bos_text) for m in members}
        counts = Counter(spellings.values())
        if len(counts) < 2:
            continue
        target = counts.most_common(1)[0][0]
        template = views[next(m for m in members if spellings[m] == target)]
        for m in members:
            if spellings[m] == target or len(views[m].dynamic) != len(template.dynamic):
                continue
            hit.append(m)
            fixed[m] = rebuild(requests[m], views[m].part, _respell(template, views[m], bos_text))
            if len(examples) < MAX_EXAMPLES:
                k = common_prefix_len(spellings[m], target)
                examples.append(
                    f"line {requests[m].lineno}: {_short(_shown(spellings[m][max(0, k - 20) : k + 20]), 80)} where "
                    f"{counts[target]} others have {_short(_shown(target[max(0, k - 20) : k + 20]), 80)}"
                )
    if not hit:
        return None
    return Proposal(
        "whitespace-variants",
        "breaks-sharing",
        f"whitespace variants of one shared part in {len(hit)} requests",
        "the same template is spelled with different whitespace (trailing newline or spaces, blank lines, "
        "double spaces, \\r\\n); each spelling tokenizes differently, so the variants share nothing past it",
        sorted(hit),
        "spell the shared part one way: `--fix OUT` rewrites each variant to the most common spelling "
        "(build prompts from one constant, strip() user-supplied template text)",
        examples,
        fixed=fixed,
    )


# ---------------------------------------------------------------------------------------------------------------
def _own_text(request: PromptRequest) -> str:
    if request.messages is None:
        return request.prompt or ""
    return request.messages[0][1] if request.messages and request.messages[0][0] == "system" else ""


def _strip_own_bos(request: PromptRequest, bos_text: str) -> PromptRequest:
    if request.messages is None:
        return request.with_prompt(strip_bos(request.prompt or "", bos_text))
    msgs = list(request.messages)
    msgs[0] = (msgs[0][0], strip_bos(msgs[0][1], bos_text))
    return request.with_messages(msgs)


def bos_causes(
    requests: Sequence[PromptRequest],
    texts: Sequence[str],
    ids: Sequence[Sequence[int]],
    encoder: PromptEncoder,
) -> list[Proposal]:
    """Literal BOS strings in the requests (variants when only some have them). A chat template's own
    bos_token is not one: rendered chat prompts are tokenized without adding special tokens again."""
    out: list[Proposal] = []
    bos = encoder.bos_text
    if not bos or encoder.bos_id is None:
        return out
    literal = [i for i, r in enumerate(requests) if strip_bos(_own_text(r), bos) != _own_text(r)]
    if literal:
        mixed = len(literal) < len(requests)
        fixed = list(requests)
        for i in literal:
            fixed[i] = _strip_own_bos(requests[i], bos)
        counts = Counter(encoder.leading_bos(ids[i]) for i in literal)
        out.append(
            Proposal(
                "bos-variants" if mixed else "duplicated-bos",
                "breaks-sharing" if mixed else "warning",
                f"{len(literal)} requests start with a literal {bos!r}"
                + (f" and {len(requests) - len(literal)} do not" if mixed else ""),
                f"the tokenizer adds BOS itself, so these prompts start with {max(counts)} BOS tokens"
                + (": the two kinds of prompt share no prefix at all" if mixed else ""),
                literal,
                f"drop the leading {bos!r} from the prompt text (the server's tokenizer adds it): "
                "`--fix OUT` does it",
                [
                    f"line {requests[i].lineno}: {_short(_own_text(requests[i]))}"
                    for i in literal[:MAX_EXAMPLES]
                ],
                fixed=fixed,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
def join_tokenization(
    requests: Sequence[PromptRequest],
    views: Sequence[RequestView],
    texts: Sequence[str],
    ids: Sequence[Sequence[int]],
    encoder: PromptEncoder,
) -> Proposal | None:
    """The shared part's last tokens merge with the text after it, so the tokens shared end earlier."""
    rendered: dict[int, tuple[str, bool]] = {}
    for i, (req, v) in enumerate(zip(requests, views, strict=True)):
        if not v.part.text or v.whole:
            continue
        head = encoder.render_system_part(req, texts[i]) if req.is_chat else v.part.text
        if head:
            rendered[i] = (head, encoder.adds_special_tokens(req))
    encoded: dict[tuple[str, bool], list[int]] = {}
    for flag in (True, False):  # most requests of a template have the same head
        distinct = [t for t, f in dict.fromkeys(rendered.values()) if f == flag]
        encoded.update(
            {(t, flag): ids for t, ids in zip(distinct, encoder.encode_texts(distinct, flag), strict=True)}
        )
    heads = {i: encoded[key] for i, key in rendered.items()}
    hit: list[int] = []
    examples: list[str] = []
    for i, head_ids in heads.items():
        k = common_prefix_len(head_ids, ids[i])
        if k < len(head_ids):
            hit.append(i)
            if len(examples) < MAX_EXAMPLES:
                tok = encoder.tokenizer
                alone = [tok.id_to_token(t) for t in head_ids[k:]]
                joined = [tok.id_to_token(t) for t in ids[i][k : k + len(alone) + 1]]
                examples.append(
                    f"line {requests[i].lineno}: the shared part ends in {alone} alone but the prompt has "
                    f"{joined} there ({len(head_ids) - k} token(s) lost)"
                )
    if not hit:
        return None
    fixed = list(requests)
    for i in hit:
        fixed[i] = rebuild(requests[i], views[i].part, with_separator(views[i].part.text))
    return Proposal(
        "join-tokenization",
        "breaks-sharing",
        f"tokenization at the join between the shared part and the rest differs in {len(hit)} requests",
        "the tokenizer merges the shared part's last characters with the text that follows, so its last "
        "token depends on each request's own text and the shared token prefix ends before it",
        hit,
        "end the shared part with a line break instead of trailing spaces (a token the tokenizer does not "
        "merge across): `--fix OUT` does it",
        examples,
        fixed=fixed,
    )


# ---------------------------------------------------------------------------------------------------------------
def short_shared_part(ids: Sequence[Sequence[int]], tokens_per_block: int) -> Proposal | None:
    """Requests that share a prefix shorter than one block: nothing of it can ever be reused."""
    min_shared = max(2, min(8, tokens_per_block // 2))
    short = [c for c in cluster_by_prefix(ids, min_shared) if c.common_tokens < tokens_per_block]
    if not short:
        return None
    shortest = min(c.common_tokens for c in short)
    new_bs = 1 << (shortest.bit_length() - 1)
    members = sorted(i for c in short for i in c.members)
    detail = "; ".join(
        f"{len(c.members)} requests share {c.common_tokens} tokens" for c in short[:MAX_EXAMPLES]
    )
    return Proposal(
        "short-shared-part",
        "breaks-sharing",
        f"shared prefixes shorter than one block ({tokens_per_block} tokens) in {len(members)} requests",
        f"{detail}: only whole blocks are cached, so these prefixes are never reused",
        members,
        f"lower kv_cache.tokens_per_block to {new_bs}, or lengthen the shared part to at least "
        f"{tokens_per_block} tokens (move fixed instructions from the user turns into it)",
        recipe_field="kv_cache.tokens_per_block",
        tokens_per_block=new_bs,
    )
