"""Factories and a fake runner for the runtime tests (vLLM's create_scheduler()/create_requests() pattern)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from llmkiln.runtime.block_memory import PagedPools
from llmkiln.runtime.draft_acceptance import accept_drafts
from llmkiln.runtime.kv_blocks import BlockStore
from llmkiln.runtime.plan import SchedulerOutput
from llmkiln.runtime.profile import StepTrace
from llmkiln.runtime.request import Request, RequestTimings, SamplingParams, TokenEvent
from llmkiln.runtime.scheduler import Scheduler, SchedulerConfig

if TYPE_CHECKING:
    from llmkiln.runtime.plan import Runner

VOCAB = 97
EOS = 2


def next_token(tokens: list[int]) -> int:
    """The fake model: a deterministic function of the whole sequence (never EOS, so lengths are exact)."""
    h = 7
    for i, t in enumerate(tokens):
        h = (h * 31 + t * (i + 3)) % 1_000_003
    token = 3 + h % (VOCAB - 3)
    return token


def reference_generate(prompt: list[int], max_tokens: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
    return out


class FakeRunner:
    """Executes a SchedulerOutput on token lists instead of KV: slot s holds the token ids whose 'KV' it has.

    It checks that the plan is consistent (loads and chunks start inside the slot's tokens, decodes exactly at
    their end) and returns a one-hot logits row of `next_token(slot tokens)` for every sampled entry. A slot
    keeps its tokens after a request ends (the scheduler may start the next prompt on a resident prefix), so a
    load or chunk at `start` keeps the first `start` tokens and drops the rest.
    """

    batches_prefills_with_past = False
    mixes_decodes_with_prefills = False
    paged_kv = False
    verifies_drafts = False
    runtime_settings: dict[str, str] = {}
    block_memory = None

    def __init__(self, num_slots: int, num_blocks: int, tokens_per_block: int, max_len: int = 4096) -> None:
        self.num_slots = num_slots
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.vocab_size = VOCAB
        self.max_len = max_len
        self.slots: list[list[int]] = [[] for _ in range(num_slots)]
        self.blocks: dict[int, tuple[int, ...]] = {}
        self.steps: list[SchedulerOutput] = []
        self.prefill_tokens = 0

    def _logits(self, tokens: list[int]) -> np.ndarray:
        row = np.zeros(VOCAB, np.float32)
        row[next_token(tokens)] = 1.0
        return row

    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]:
        self.steps.append(plan)
        bs = self.tokens_per_block
        for load in plan.loads:
            slot = self.slots[load.slot]
            if len(slot) < load.start:
                raise RuntimeError(f"load into slot {load.slot} at {load.start} but it holds {len(slot)}")
            del slot[load.start :]
            slot.extend(self.blocks[load.block_id])
        out: dict[str, np.ndarray] = {}
        for chunk in plan.prefills:
            slot = self.slots[chunk.slot]
            if len(slot) < chunk.start:
                raise RuntimeError(f"chunk of {chunk.request_id} at {chunk.start}, slot holds {len(slot)}")
            del slot[chunk.start :]
            slot.extend(chunk.token_ids)
            self.prefill_tokens += len(chunk.token_ids)
            if chunk.sample:
                out[chunk.request_id] = self._logits(slot)
        for item in plan.decodes:
            slot = self.slots[item.slot]
            if len(slot) != item.position:
                raise RuntimeError(f"decode of {item.request_id} at {item.position}, slot holds {len(slot)}")
            slot.append(item.token_id)
            out[item.request_id] = self._logits(slot)
        for save in plan.saves:
            self.blocks[save.block_id] = tuple(self.slots[save.slot][save.start : save.start + bs])
            if len(self.blocks[save.block_id]) != bs:
                raise RuntimeError(f"save of a partial block from slot {save.slot}")
        if trace is not None:  # what the real runner records, without times: one run per chunk
            trace.loads, trace.saves = len(plan.loads), len(plan.saves)
            trace.prefills += [(1, len(c.token_ids), c.start, 0, (c.request_id,)) for c in plan.prefills]
            if plan.decodes:
                width = max(d.position for d in plan.decodes) + 1
                trace.decode = (len(plan.decodes), len(plan.decodes), width, 0)
        return out

    def expect_drafts(self, max_draft_len: int) -> bool:
        self.max_draft_len = max_draft_len
        return False  # no run padding: drafts are priced by the scheduler's learned cost

    def close(self) -> None:
        pass


class PagedFakeRunner:
    """A paged runner (`paged_kv`) on token lists: its pool is `num_blocks` blocks of `tokens_per_block` token
    ids, addressed only through the plan's block tables, like the OpenVINO runner's pools.

    Each sequence of a plan reads its context [0, start) through its table (every position must hold a token:
    a block the table names but nobody wrote is an error), writes its new tokens into the table's blocks, and
    gets the one-hot row of `next_token(context)`. So a wrong table, a shared block overwritten, or a block
    handed to two sequences at once shows up as a wrong token in the output. Reads happen before writes within a
    plan (one batched run).

    A decode with drafts (speculative decoding) writes its token and drafts and gets one row per written token:
    row j is the model after the context and the first j + 1 of them. `model` (default `next_token`) maps a
    sequence to its next token; `vocab_size` sets the logits' width (a small-vocabulary model for the tests
    that need drafts to match)."""

    batches_prefills_with_past = True
    mixes_decodes_with_prefills = True
    paged_kv = True
    verifies_drafts = True
    runtime_settings: dict[str, str] = {}

    def __init__(
        self,
        num_slots: int,
        num_blocks: int,
        tokens_per_block: int,
        model: Callable[[list[int]], int | np.ndarray] = next_token,
        vocab_size: int = VOCAB,
    ) -> None:
        self.num_slots = num_slots
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.model = model
        self.vocab_size = vocab_size
        self.pool = np.full((num_blocks, tokens_per_block), -1, np.int64)  # the "KV": token ids, -1 unwritten
        self.block_memory: PagedPools | None = PagedPools([self.pool], "token-ids")  # what NIXL moves
        self.steps: list[SchedulerOutput] = []
        self.prefill_tokens = 0

    def read(self, table: tuple[int, ...] | list[int], n: int) -> list[int]:
        bs = self.tokens_per_block
        if len(table) * bs < n:
            raise RuntimeError(f"block table of {len(table)} blocks cannot hold {n} tokens")
        out = [int(self.pool[table[p // bs], p % bs]) for p in range(n)]
        if any(t < 0 for t in out):
            raise RuntimeError("a sequence reads a position nobody wrote")
        return out

    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]:
        self.steps.append(plan)
        if plan.loads:
            raise RuntimeError("a paged runner gets no loads")
        for src, dst in plan.copies:  # copy-on-write, before the run
            self.pool[dst] = self.pool[src]
        seqs = [(c.request_id, c.token_ids, c.start, 1 if c.sample else 0) for c in plan.prefills]
        seqs += [(d.request_id, d.token_ids, d.position, len(d.token_ids)) for d in plan.decodes]
        contexts = {rid: self.read(plan.block_tables[rid], start) for rid, _, start, _ in seqs}
        self.prefill_tokens += sum(len(c.token_ids) for c in plan.prefills)
        bs, out = self.tokens_per_block, {}
        for rid, tokens, start, rows in seqs:
            table = plan.block_tables[rid]
            if len(table) * bs < start + len(tokens):
                raise RuntimeError(f"{rid}: table of {len(table)} blocks, writes up to {start + len(tokens)}")
            for i, t in enumerate(tokens):
                p = start + i
                self.pool[table[p // bs]][p % bs] = t
            seq = contexts[rid] + list(tokens)
            got = [self._row(seq[: len(seq) - rows + 1 + j]) for j in range(rows)]
            if got:
                out[rid] = got[0] if len(got) == 1 else np.stack(got)
        return out

    def _row(self, seq: list[int]) -> np.ndarray:
        value = self.model(seq)
        if isinstance(value, np.ndarray):  # the model's own logits row
            return value.astype(np.float32)
        row = np.zeros(self.vocab_size, np.float32)
        row[value] = 1.0
        return row

    def expect_drafts(self, max_draft_len: int) -> bool:
        self.max_draft_len = max_draft_len
        return False  # no run padding: drafts are priced by the scheduler's learned cost

    def close(self) -> None:
        pass


def make_paged_scheduler(num_blocks: int = 64, **overrides: Any) -> Scheduler:
    """make_scheduler's settings on a paged runner's KV: the manager holds every block."""
    config = SchedulerConfig.make(**_config_fields(overrides))
    return Scheduler(config, BlockStore(num_blocks, config.kv_cache.tokens_per_block), paged=True)


def _config_fields(overrides: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        max_batch_size=4,
        max_num_tokens=64,
        max_prefill_tokens=32,
        tokens_per_block=4,
        max_input_len=200,
        max_seq_len=256,
        eos_token_ids=(EOS,),
    )
    base.update(overrides)
    return base


def make_scheduler(num_blocks: int = 64, **overrides: Any) -> Scheduler:
    config = SchedulerConfig.make(**_config_fields(overrides))
    return Scheduler(config, BlockStore(num_blocks, config.kv_cache.tokens_per_block))


_ids = itertools.count()


def make_requests(
    n: int,
    prompt_len: int = 10,
    max_tokens: int = 5,
    prefix: list[int] | None = None,
    priorities: list[int] | None = None,
    seed: int = 0,
) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        body = [int(x) for x in rng.integers(3, VOCAB, prompt_len)]
        prompt = (prefix or []) + body
        out.append(
            Request(
                request_id=f"r{next(_ids)}",
                prompt_ids=prompt,
                params=SamplingParams(max_tokens=max_tokens),
                priority=priorities[i] if priorities else 0,
                timings=RequestTimings(arrival_ns=i),
            )
        )
    return out


def greedy(
    logits: dict[str, np.ndarray], drafts: dict[str, tuple[int, ...]] | None = None
) -> dict[str, int | list[int]]:
    """Argmax of each row; a decode with drafts gets what greedy verification emits (runtime.draft_acceptance)."""
    drafts = drafts or {}
    return {
        rid: accept_drafts(row, drafts[rid], SamplingParams()) if rid in drafts else int(np.argmax(row))
        for rid, row in logits.items()
    }


def apply_plan(
    scheduler: Scheduler, runner: FakeRunner | PagedFakeRunner, plan: SchedulerOutput, now_ns: int = 0
) -> list[tuple[Request, TokenEvent]]:
    """What the engine does with a plan: run it (the fake runner writes its saves too), update, publish saves."""
    drafts = {d.request_id: d.draft_ids for d in plan.decodes if d.draft_ids}
    events = scheduler.update_from_output(plan, greedy(runner.execute(plan), drafts), now_ns)
    scheduler.release_saves(plan.saves, written=True)
    return events


def run_to_completion(
    scheduler: Scheduler, runner: FakeRunner | PagedFakeRunner, max_steps: int = 10_000
) -> dict[str, list[int | None]]:
    """Drive schedule → execute → update until nothing is left; returns output ids per request."""
    outputs: dict[str, list[int | None]] = {}
    for step in range(max_steps):
        if not scheduler.has_work():
            return outputs
        plan = scheduler.schedule(now_ns=step)
        for request, ev in apply_plan(scheduler, runner, plan, now_ns=step):
            outputs.setdefault(request.request_id, []).append(ev.token_id)
    raise RuntimeError("scheduler did not finish")


def _conforms(runner: FakeRunner, paged: PagedFakeRunner) -> tuple[Runner, Runner]:
    """Never called: mypy checks the stand-in runners against the engine's Runner protocol."""
    return runner, paged
