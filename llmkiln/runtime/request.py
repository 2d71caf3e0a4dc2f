"""Requests and their parameters: what a caller submits, what the scheduler tracks, what a stream yields.

Everything here is plain data. `Request` is the scheduler's per-sequence state (nano-vllm's `Sequence`); the
caller sees it through `RequestHandle` (handle.py). Timestamps are `time.time_ns()`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmkiln.errors import BadInput
from llmkiln.runtime.ngram_drafts import DraftAcceptance, NgramIndex

MAX_TEMPERATURE = 100.0
MAX_SPECULATIVE_TOKENS = 16  # drafts one decode may verify (a request's num_speculative_tokens)


class RequestRejected(BadInput):
    """`submit` refused the request at once (nothing was queued)."""


class QueueFull(RequestRejected):
    """The waiting queue holds scheduler.max_queue_size requests already."""


class PromptTooLong(RequestRejected):
    """The prompt exceeds limits.max_input_len, or prompt + max_tokens exceeds limits.max_seq_len."""


class BadRequestParams(RequestRejected):
    """A sampling parameter, the prompt, the priority or the request id is invalid."""


class FinishReason(enum.StrEnum):
    """Why a sequence ended."""

    STOP = "stop"  # an end-of-sequence or stop token was generated (it is the last token of the output)
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"  # the caller cancelled it
    ERROR = "error"  # the runner failed; the handle carries the message


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. temperature 0 is greedy; top_k 0 and top_p 1.0 disable those filters."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # speculative decoding (an engine whose recipe has a `speculative` section): drafted tokens per step for this
    # request, None = the recipe's max_draft_len, 0 = off for this request
    num_speculative_tokens: int | None = None

    def __post_init__(self) -> None:
        """The one validator of sampling settings: BadRequestParams (exit 2 on the CLI, a 400 when served)
        naming the first bad field and what is allowed. Messages never echo the value: served, they reach clients
        who should not see raw (possibly foreign) input echoed back."""
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise BadRequestParams("max_tokens must be an integer >= 1")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= float(t) <= MAX_TEMPERATURE:
            raise BadRequestParams(f"temperature must be a number in [0, {MAX_TEMPERATURE:g}] (0 = greedy)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < float(p) <= 1.0:
            raise BadRequestParams("top_p must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise BadRequestParams("top_k must be an integer >= 0 (0 = off)")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0
        ):
            raise BadRequestParams("seed must be a non-negative integer or None")
        for t_id in self.stop_token_ids:
            if not isinstance(t_id, int) or isinstance(t_id, bool) or t_id < 0:
                raise BadRequestParams("stop_token_ids: each must be a token id (an integer >= 0)")
        n = self.num_speculative_tokens
        if n is not None and (
            not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_SPECULATIVE_TOKENS
        ):
            raise BadRequestParams(
                f"num_speculative_tokens must be an integer in [0, {MAX_SPECULATIVE_TOKENS}] (0 = no speculation)"
            )

    def check(self, vocab_size: int) -> None:
        """The checks that need the model: stop token ids inside the vocabulary."""
        for t_id in self.stop_token_ids:
            if t_id >= vocab_size:
                raise BadRequestParams(f"stop_token_ids: each must be a token id in [0, {vocab_size})")


@dataclass
class RequestTimings:
    """Wall-clock stamps (time.time_ns()) of one request; None until the event happened."""

    arrival_ns: int
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None

    @property
    def ttft_ns(self) -> int | None:
        """Arrival to first token."""
        if self.first_token_ns is None:
            return None
        return self.first_token_ns - self.arrival_ns


@dataclass(frozen=True)
class TokenEvent:
    """One streamed token. The last event has finished=True; after a cancel or an error it carries no token."""

    token_id: int | None
    index: int
    finished: bool = False
    finish_reason: str | None = None


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Scheduler-side state of one sequence. Only the scheduler thread mutates it."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_seq: int = 0
    timings: RequestTimings = field(default_factory=lambda: RequestTimings(arrival_ns=0))
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    num_computed_tokens: int = 0  # tokens whose KV is in the slot
    num_cached_tokens: int = 0  # prompt tokens loaded from the prefix cache
    # slot runners: the cached prefix blocks it uses; paged runners: its whole block table (shared hits first)
    pinned_block_ids: list[int] = field(default_factory=list)
    offered: set[int] = field(default_factory=set)  # paged: table positions offered, not published yet
    reserved_blocks: int = 0  # paged: blocks promised at admission, not allocated yet
    num_saved_blocks: int = 0  # leading full prompt blocks already offered to the block store
    parent_hash: int | None = None  # chained hash of the last saved/hit block
    block_hashes: list[int] = field(default_factory=list)  # chained keys of the full prompt blocks, set once
    awaited_inflight_prefix: bool = False  # it waited for blocks another prompt was computing (scheduler)
    finish_reason: FinishReason | None = None
    # speculative decoding: the n-gram index of prompt + output (built at the first draft)
    drafter: NgramIndex | None = None
    acceptance: DraftAcceptance = field(
        default_factory=DraftAcceptance
    )  # per match class (runtime.ngram_drafts)
    draft_class: int = 0  # the match class of the drafts in flight
    draft_free: bool = False  # the drafts in flight ride free (a lone padded sequence's: no row cost)
    # the drafts in flight come from earlier requests' outputs (runtime.draft_history)
    draft_history: bool = False

    @property
    def slot_id(self) -> int:
        """The KV slot of a running request (a request without one here is a scheduler bug)."""
        assert self.slot is not None, f"request {self.request_id} holds no slot"
        return self.slot

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed_tokens >= len(self.prompt_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def last_token_id(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    def sort_key(self, policy: str) -> tuple[int, int]:
        """Admission order: fcfs by arrival; priority: higher first, ties by arrival."""
        if policy == "priority":
            return (-self.priority, self.arrival_seq)
        return (0, self.arrival_seq)
