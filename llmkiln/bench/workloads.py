"""Benchmark workloads: seeded request lists whose prompts have exact token lengths under the engine's tokenizer.

Workloads
- ``shared-prefix``: one (or a few: K, each request draws one at random) system prompts of exactly S tokens,
  each request appends a different user turn of U tokens (U drawn uniformly from a range). Models chat, agents and RAG, where every request repeats a
  long instruction block: the case prefix KV reuse is for.
- ``unique``: prompts that share nothing beyond the first word, lengths drawn from a range.
- ``mixed-long-short``: mostly short prompts with a long one every ``long_every`` requests (a few long among many
  short): the case chunked prefill is for (a long prefill must not stall the short requests behind it).
- ``chat-multiturn``: multi-turn chats after one long shared system prompt, rendered with the engine's chat
  template; turn t of a conversation is a byte-for-byte prefix of its turn t+1 (the prefix cache can reuse the
  previous turn's blocks, not only the system prompt's). See ``chat_multiturn``.
- ``jsonl``: recorded traffic, one JSON object per line: ``{"prompt": "...", "max_tokens": 64, "group": "x"}``
  (``text`` is accepted for ``prompt``; ``max_tokens`` and ``group`` are optional).

Token counts are content tokens: ``tokenizer.encode(text, add_special_tokens=False)``; the server adds its BOS.
The same seed and tokenizer always give the same prompts.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

from llmkiln.chat_template import PLAIN_TEMPLATE, render
from llmkiln.errors import BadInput
from llmkiln.jsonl import read_jsonl

WorkloadName = Literal["shared-prefix", "unique", "mixed-long-short", "jsonl", "chat-multiturn"]
WORKLOADS: tuple[str, ...] = ("shared-prefix", "unique", "mixed-long-short", "jsonl", "chat-multiturn")

# A plain-English vocabulary for synthetic prompts (lower case, so most words are one or two tokens).
_WORDS = (
    "the a an and or but if then when while because so that this these those it its they them their we our you "
    "your he she his her one two three four five six seven ten many few some every each other more most less "
    "time day night year week morning evening water fire stone clay wood metal glass paper cloth bread milk tea "
    "house room door window table chair bed lamp book letter map road river hill field forest garden town city "
    "market shop school kitchen oven kiln bowl cup plate pot jar box bag basket rope wheel cart boat ship bridge "
    "tower wall roof floor stair gate path bird cat dog fish horse cow sheep bee tree flower leaf seed root "
    "rain snow wind sun moon star cloud light shadow colour red blue green yellow white black brown small big "
    "long short old new young hot cold warm soft hard quick slow quiet loud bright dark happy sad kind brave "
    "make build carry open close find keep give take bring send read write count measure check test run walk "
    "stop start turn cook bake fill pour mix cut fold paint draw sing listen watch learn teach help ask answer "
    "request server engine token cache block batch queue prompt model answer question report number value list "
    "first second next last before after again always never often today tomorrow here there near far inside "
    "outside above below between around through under over into from with without about against along"
).split()

_SYSTEM_HEAD = "System: you are a careful assistant for a pottery workshop. Follow these notes.\n"
_USER_HEAD = "User {i}: "


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: the prompt text and how many tokens to generate."""

    index: int
    prompt: str
    max_tokens: int
    num_prompt_tokens: int  # content tokens (no special tokens) under the workload's tokenizer
    group: str  # "shared", "unique", "long", "short", or a jsonl group
    prefix_tokens: int = 0  # tokens shared with other requests (the system prompt), 0 when none
    system_chars: int = 0  # the prompt's first characters that are its system prompt (0: none)

    def split_system(self) -> tuple[str, str]:
        """(system prompt, the rest): how a chat API receives the prompt (system message, user message)."""
        return self.prompt[: self.system_chars], self.prompt[self.system_chars :]


@dataclass(frozen=True)
class Workload:
    """A named, seeded list of requests plus the parameters that made it (recorded in reports)."""

    name: str
    seed: int
    params: dict[str, Any]
    requests: list[BenchRequest] = field(repr=False)

    def describe(self) -> dict[str, Any]:
        """Name, seed and parameters (for the report; prompts are not included)."""
        return {"name": self.name, "seed": self.seed, "params": dict(self.params)}


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of a synthetic workload (token counts are content tokens)."""

    name: str = "shared-prefix"
    num_requests: int = 16
    seed: int = 0
    output_tokens: int = 64
    # output tokens per request drawn uniformly from output_tokens ± output_spread (own random stream: the prompts
    # do not change). 0: every request the same length — a closed loop then runs in lockstep waves (all requests
    # start and end together, so no decode ever waits behind a prompt); a spread breaks the waves.
    output_spread: int = 0
    # shared-prefix
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (50, 200)
    num_system_prompts: int = 1
    # unique
    prompt_tokens: tuple[int, int] = (1550, 1700)
    # mixed-long-short
    long_tokens: int = 2048
    short_tokens: tuple[int, int] = (32, 128)
    long_every: int = 8
    # jsonl
    jsonl_path: str | None = None
    # chat-multiturn (also system_tokens, user_tokens): conversations interleaved per round, user turns each
    num_conversations: int = 12
    num_turns: int = 4
    assistant_tokens: int = 40  # the canned reply after each user turn but the last
    chat_template: str | None = None  # the engine's (EngineDir.chat_template()); None: PLAIN_TEMPLATE

    def params(self) -> dict[str, Any]:
        """The parameters relevant to this workload, for the report."""
        d = asdict(self)
        keep = {
            "shared-prefix": ("system_tokens", "user_tokens", "num_system_prompts"),
            "unique": ("prompt_tokens",),
            "mixed-long-short": ("long_tokens", "short_tokens", "long_every"),
            "jsonl": ("jsonl_path",),
            "chat-multiturn": (
                "system_tokens",
                "user_tokens",
                "assistant_tokens",
                "num_conversations",
                "num_turns",
            ),
        }[self.name]
        out = {k: (list(d[k]) if isinstance(d[k], tuple) else d[k]) for k in keep}
        if self.name == "chat-multiturn":  # the template itself is long: its hash names it
            template = self.chat_template or PLAIN_TEMPLATE
            out["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest()[:16]
        out["output_tokens"] = self.output_tokens
        if self.output_spread:
            out["output_spread"] = self.output_spread
        out["num_requests"] = self.num_requests
        return out


def parse_range(text: str, what: str) -> tuple[int, int]:
    """'50-200' -> (50, 200); '64' -> (64, 64). Raises BadInput naming `what`."""
    parts = str(text).split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if lo <= 0 or hi < lo:
        raise BadInput(
            f"{what}: {text!r} is not a token count or range; give N or MIN-MAX with 0 < MIN <= MAX"
        )
    return lo, hi


# ---------------------------------------------------------------------------------------------------------------
# Exact-length text


def count_tokens(tok: Tokenizer, text: str) -> int:
    """Content tokens of `text` (no special tokens)."""
    return len(tok.encode(text, add_special_tokens=False).ids)


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def fit_text(tok: Tokenizer, head: str, target: int, rng: random.Random, lead: str = "") -> str:
    """A suffix such that ``head + suffix`` has exactly ``len(ids(head)) + target`` tokens and starts with ids(head).

    The suffix is ``lead`` followed by random words; the word count is found by bisection, then one-token
    fillers make up the rest. Raises BadInput when no such suffix exists (e.g. `lead` alone is longer).
    """
    head_ids = _ids(tok, head)
    goal = len(head_ids) + target
    words = [rng.choice(_WORDS) for _ in range(max(8, target * 2))]

    def text_for(k: int) -> str:
        return head + lead + " ".join(words[:k])

    def n(k: int) -> int:
        return len(_ids(tok, text_for(k)))

    if n(0) > goal and lead:  # the label does not fit a very short turn: words only
        return fit_text(tok, head, target, rng)
    if n(0) > goal:
        raise BadInput(f"cannot build a prompt of {target} tokens: its fixed part {lead!r} is already longer")
    while n(len(words)) < goal:  # rare: very short words; extend the pool
        words += [rng.choice(_WORDS) for _ in range(target)]
    lo, hi = 0, len(words)  # n(lo) <= goal < ... ; find the largest k with n(k) <= goal
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n(mid) <= goal:
            lo = mid
        else:
            hi = mid - 1
    text = text_for(lo)
    text = _pad(tok, text, goal, rng)
    ids = _ids(tok, text)
    if len(ids) != goal or ids[: len(head_ids)] != head_ids:
        raise BadInput(
            f"the tokenizer does not allow a prompt of exactly {target} tokens after a {len(head_ids)}-token prefix "
            f"(got {len(ids) - len(head_ids)}); try another --seed"
        )
    return text[len(head) :]


_FILLERS = (" a", " the", " and", " of", ".", ",", " I", " it", " to")


def _pad(tok: Tokenizer, text: str, goal: int, rng: random.Random, tail: str = "") -> str:
    """Append one-token fillers to `text` until ``text + tail`` has `goal` tokens (each adds exactly one)."""
    current = len(_ids(tok, text + tail))
    while current < goal:
        for filler in rng.sample(_FILLERS, len(_FILLERS)):
            n = len(_ids(tok, text + filler + tail))
            if n == current + 1:
                text, current = text + filler, n
                break
        else:
            raise BadInput(
                f"cannot pad a prompt to exactly {goal} tokens with this tokenizer; try another --seed"
            )
    return text


# ---------------------------------------------------------------------------------------------------------------
# Workloads


def _draw(rng: random.Random, span: tuple[int, int]) -> int:
    return rng.randint(span[0], span[1])


def shared_prefix(tok: Tokenizer, spec: WorkloadSpec) -> list[BenchRequest]:
    """System prompt(s) of exactly `system_tokens` + user turns of `user_tokens` (drawn per request)."""
    rng = random.Random(spec.seed)
    systems = []
    for s in range(spec.num_system_prompts):
        head = _SYSTEM_HEAD if s == 0 else f"System {s}: " + _SYSTEM_HEAD
        if count_tokens(tok, head) >= spec.system_tokens:
            head = ""
        systems.append(head + fit_text(tok, head, spec.system_tokens - count_tokens(tok, head), rng) + "\n")
    # NOTE: the trailing newline is part of the system prompt; re-fit so the whole block is exactly S tokens.
    systems = [_exact(tok, s, spec.system_tokens, rng) for s in systems]
    out = []
    # NOTE: with several system prompts each request draws one (seeded) rather than cycling through them, so
    # that a round-robin router does not line up with the prompts by accident.
    pick = random.Random(spec.seed + 1)
    for i in range(spec.num_requests):
        k = pick.randrange(len(systems)) if len(systems) > 1 else 0
        system = systems[k]
        u = _draw(rng, spec.user_tokens)
        user = fit_text(tok, system, u, rng, lead=_USER_HEAD.format(i=i))
        group = "shared" if len(systems) == 1 else f"system-{k}"
        out.append(
            BenchRequest(
                i,
                system + user,
                spec.output_tokens,
                spec.system_tokens + u,
                group,
                spec.system_tokens,
                system_chars=len(system),
            )
        )
    return out


def _exact(tok: Tokenizer, text: str, target: int, rng: random.Random) -> str:
    """Trim words from the end of `text` (keeping its final line break) to at most `target` tokens, then pad."""
    body, nl = (text[:-1], "\n") if text.endswith("\n") else (text, "")
    while count_tokens(tok, body + nl) > target and " " in body:
        body = body.rsplit(" ", 1)[0]
    padded = _pad(tok, body, target, rng, tail=nl) + nl
    if count_tokens(tok, padded) != target:
        raise BadInput(
            f"cannot build a system prompt of exactly {target} tokens with this tokenizer; try another --seed"
        )
    return padded


def unique(tok: Tokenizer, spec: WorkloadSpec) -> list[BenchRequest]:
    """Prompts with no shared prefix (each starts with its own random words)."""
    rng = random.Random(spec.seed)
    out = []
    for i in range(spec.num_requests):
        n = _draw(rng, spec.prompt_tokens)
        text = fit_text(tok, "", n, rng)
        out.append(BenchRequest(i, text, spec.output_tokens, n, "unique"))
    return out


def mixed_long_short(tok: Tokenizer, spec: WorkloadSpec) -> list[BenchRequest]:
    """Short prompts, with one long prompt every `long_every` requests (the first is at index long_every // 2)."""
    if spec.long_every < 2:
        raise BadInput(f"long_every must be at least 2 (one long among several short), got {spec.long_every}")
    rng = random.Random(spec.seed)
    out = []
    for i in range(spec.num_requests):
        is_long = i % spec.long_every == spec.long_every // 2
        n = spec.long_tokens if is_long else _draw(rng, spec.short_tokens)
        text = fit_text(tok, "", n, rng)
        out.append(BenchRequest(i, text, spec.output_tokens, n, "long" if is_long else "short"))
    return out


def from_jsonl(tok: Tokenizer | None, spec: WorkloadSpec) -> list[BenchRequest]:
    """Recorded requests from a JSONL file, cycled (in file order) to `num_requests`."""
    if spec.jsonl_path is None:
        raise BadInput("workload jsonl needs --from-jsonl FILE")
    path = Path(spec.jsonl_path)
    if not path.is_file():
        raise BadInput(
            f'--from-jsonl {path}: no such file; give a JSONL file with one {{"prompt": ...}} per line'
        )
    rows = []
    for lineno, obj in read_jsonl(path):
        prompt = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise BadInput(f"{path}:{lineno}: needs a non-empty string field 'prompt' (or 'text')")
        max_tokens = obj.get("max_tokens", spec.output_tokens)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
            raise BadInput(
                f"{path}:{lineno}: field 'max_tokens' must be a positive integer, got {max_tokens!r}"
            )
        rows.append((prompt, max_tokens, str(obj.get("group", "jsonl"))))
    if not rows:
        raise BadInput(f"{path}: no requests in the file")
    out = []
    for i in range(spec.num_requests):
        prompt, max_tokens, group = rows[i % len(rows)]
        n = count_tokens(tok, prompt) if tok is not None else 0
        out.append(BenchRequest(i, prompt, max_tokens, n, group))
    return out


# chat-multiturn

_CHAT_SYSTEM_HEAD = (
    "You are a careful assistant for a pottery workshop. Answer the visitor's questions briefly, using the "
    "workshop notes below.\n\nWorkshop notes:\n"
)
_CHAT_USER_HEAD = "Question {t}: "
_CHAT_REPLY_HEAD = "Here is what the notes say. "


def _sentence(rng: random.Random) -> str:
    """One plain sentence of 6 to 14 vocabulary words: capitalized, ending in a full stop."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
    return words[0].capitalize() + " " + " ".join(words[1:]) + "."


def _prose(tok: Tokenizer, head: str, target: int, rng: random.Random) -> str:
    """`head` followed by sentences, exactly `target` tokens in all (head included, when it fits)."""
    if count_tokens(tok, head) >= target:
        head = ""
    text = head
    while count_tokens(tok, text) < target:
        text += ("" if not text or text.endswith((" ", "\n")) else " ") + _sentence(rng)
    return _exact(tok, text, target, rng)


@dataclass(frozen=True)
class ChatConversation:
    """One conversation of chat-multiturn: user turns and the canned assistant reply after each of them."""

    users: list[str]
    replies: list[str]  # replies[t] follows users[t]; the last one is never sent (the model's turn)

    def messages(self, system: str, turn: int) -> list[dict[str, str]]:
        """[system, user_1, assistant_1, ..., user_turn] (turn counts from 1)."""
        out = [{"role": "system", "content": system}]
        for t in range(turn):
            if t:
                out.append({"role": "assistant", "content": self.replies[t - 1]})
            out.append({"role": "user", "content": self.users[t]})
        return out


def chat_conversations(
    tok: Tokenizer, spec: WorkloadSpec, num_conversations: int
) -> tuple[str, list[ChatConversation]]:
    """chat-multiturn's message contents: the system prompt (exactly `system_tokens` tokens) and
    `num_conversations` conversations of `num_turns` user turns (each drawn from `user_tokens`) and canned replies
    (exactly `assistant_tokens` each); token counts are of each content on its own."""
    rng = random.Random(spec.seed)
    system = _prose(tok, _CHAT_SYSTEM_HEAD, spec.system_tokens, rng)
    convs = []
    for _ in range(num_conversations):
        users, replies = [], []
        for t in range(spec.num_turns):
            users.append(_prose(tok, _CHAT_USER_HEAD.format(t=t + 1), _draw(rng, spec.user_tokens), rng))
            replies.append(_prose(tok, _CHAT_REPLY_HEAD, spec.assistant_tokens, rng))
        convs.append(ChatConversation(users, replies))
    return system, convs


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def chat_multiturn(tok: Tokenizer, spec: WorkloadSpec) -> list[BenchRequest]:
    """Multi-turn chats after one shared system prompt, each request one turn of one conversation.

    One system prompt of ~`system_tokens` tokens of plain sentences (exactly that many as a message content); each
    conversation has `num_turns` user turns of `user_tokens` tokens (drawn per turn) with a canned assistant reply
    of `assistant_tokens` tokens after each. The request for turn t of a conversation is the chat [system, user_1,
    assistant_1, ..., user_t] rendered with `chat_template` (add_generation_prompt=True), so turn t's prompt text is
    a byte-for-byte prefix of turn t+1's: the prefix cache can reuse the previous turn's blocks, as in a real chat.
    The replies are fixed text drawn from the seed, not what the model answered: the model's own reply is not fed
    back (it would make the prompts depend on the server, and the baseline and optimized runs differ).

    Order: rounds of `num_conversations` fresh conversations, each round interleaved turn by turn (all its turn-1
    requests, then all its turn-2 requests, ...), so that with more conversations than the concurrency a turn is
    sent after the previous turn of its conversation has finished; the list is cut at `num_requests` (give a
    multiple of num_conversations × num_turns for whole rounds). Group: "turn-{t}". prefix_tokens: the tokens of the
    rendered system message (shared by every request); system_chars: its characters. The prompts are chat-rendered
    text for a completion endpoint (Triton's text_input, /completions), not for --api chat.
    """
    for what, value in (
        ("num_conversations", spec.num_conversations),
        ("num_turns", spec.num_turns),
        ("assistant_tokens", spec.assistant_tokens),
        ("system_tokens", spec.system_tokens),
    ):
        if value <= 0:
            raise BadInput(f"chat-multiturn: {what} must be positive, got {value}")
    template = spec.chat_template or PLAIN_TEMPLATE
    per_round = spec.num_conversations * spec.num_turns
    rounds = -(-spec.num_requests // per_round)
    system, convs = chat_conversations(tok, spec, rounds * spec.num_conversations)
    head = render(template, [{"role": "system", "content": system}], add_generation_prompt=False)
    head_ids = _ids(tok, head)
    out: list[BenchRequest] = []
    for r in range(rounds):
        for t in range(1, spec.num_turns + 1):
            for conv in convs[r * spec.num_conversations : (r + 1) * spec.num_conversations]:
                if len(out) == spec.num_requests:
                    return out
                prompt = render(template, conv.messages(system, t), add_generation_prompt=True)
                if not prompt.startswith(head):
                    raise BadInput(
                        "chat-multiturn: the chat template does not render the system message as the prompt's "
                        "first part; give a template that puts it first"
                    )
                ids = _ids(tok, prompt)
                out.append(
                    BenchRequest(
                        len(out),
                        prompt,
                        spec.output_tokens,
                        len(ids),
                        f"turn-{t}",
                        _common_prefix(head_ids, ids),
                        system_chars=len(head),
                    )
                )
    return out


_BUILDERS = {
    "shared-prefix": shared_prefix,
    "unique": unique,
    "mixed-long-short": mixed_long_short,
    "chat-multiturn": chat_multiturn,
}


def build_workload(tok: Tokenizer | None, spec: WorkloadSpec) -> Workload:
    """The workload `spec.name` with `spec.num_requests` requests (synthetic ones need a tokenizer)."""
    if spec.name not in WORKLOADS:
        raise BadInput(f"unknown workload {spec.name!r}; choose one of: {', '.join(WORKLOADS)}")
    if spec.num_requests <= 0:
        raise BadInput(f"number of requests must be positive, got {spec.num_requests}")
    if spec.output_tokens <= 0:
        raise BadInput(f"output tokens must be positive, got {spec.output_tokens}")
    if not 0 <= spec.output_spread < spec.output_tokens:
        raise BadInput(
            f"output spread {spec.output_spread}: give 0 to {spec.output_tokens - 1} (output tokens "
            f"{spec.output_tokens} ± spread must stay positive)"
        )
    if spec.name == "jsonl":
        return Workload(spec.name, spec.seed, spec.params(), from_jsonl(tok, spec))
    if tok is None:
        raise BadInput(
            f"workload {spec.name!r} builds prompts of exact token lengths: give --tokenizer (engine folder)"
        )
    return Workload(spec.name, spec.seed, spec.params(), _spread(_BUILDERS[spec.name](tok, spec), spec))


def _spread(requests: list[BenchRequest], spec: WorkloadSpec) -> list[BenchRequest]:
    """Each request's max_tokens drawn from output_tokens ± output_spread (unchanged when the spread is 0)."""
    if not spec.output_spread:
        return requests
    rng = random.Random(f"output-spread:{spec.seed}")
    lo, hi = spec.output_tokens - spec.output_spread, spec.output_tokens + spec.output_spread
    return [replace(r, max_tokens=rng.randint(lo, hi)) for r in requests]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """tokenizer.json from an engine/model folder or the file itself."""
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise BadInput(
            f"--tokenizer {p}: no tokenizer.json there; give an engine folder or a tokenizer.json file"
        )
    try:
        return Tokenizer.from_file(str(f))
    except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
        raise BadInput(f"--tokenizer {f}: not a tokenizers JSON file ({exc})") from None
