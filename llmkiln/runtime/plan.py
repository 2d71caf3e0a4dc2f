"""One engine step's plan (what the scheduler decides) and the Runner protocol (what executes it).

The scheduler (runtime.scheduler) writes a `SchedulerOutput`; a runner (runtime.runner.OnnxRunner,
runtime.openvino_runner.OpenVinoPagedRunner, the tests' fakes) executes it and returns logits rows. Runners import
this module, never the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from llmkiln.runtime.block_memory import BlockMemory
    from llmkiln.runtime.profile import StepTrace


@dataclass(frozen=True)
class BlockCopy:
    """Copy block `block_id` of the prefix store to/from tokens [start, start + tokens_per_block) of `slot`.
    `key`: the block's chained hash (its content: every token up to its end), so a runner may keep and share
    what it loaded (0: unknown)."""

    block_id: int
    slot: int
    start: int
    key: int = 0


def block_runs(copies: Sequence[BlockCopy], tokens_per_block: int) -> list[tuple[int, int, list[int]]]:
    """(slot, start, block ids) for each run of consecutive blocks of one slot, in plan order: what a runner
    moves in one copy."""
    runs: list[tuple[int, int, list[int]]] = []
    for c in copies:
        if runs and runs[-1][0] == c.slot and runs[-1][1] + len(runs[-1][2]) * tokens_per_block == c.start:
            runs[-1][2].append(c.block_id)
        else:
            runs.append((c.slot, c.start, [c.block_id]))
    return runs


@dataclass(frozen=True)
class PrefillChunk:
    """Run `token_ids` at positions [start, start + len) of `slot`; `sample`: this chunk ends the prompt."""

    request_id: str
    slot: int
    start: int
    token_ids: tuple[int, ...]
    sample: bool


@dataclass(frozen=True)
class DecodeItem:
    """Run one token at `position` of `slot` and sample the next. With `draft_ids` (speculative decoding, a runner
    that `verifies_drafts`): run the token and the drafts at positions [position, position + 1 + len(drafts)) and
    return a logits row for each of them (runtime.draft_acceptance verifies them)."""

    request_id: str
    slot: int
    token_id: int
    position: int
    draft_ids: tuple[int, ...] = ()

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The tokens this decode runs: the last token, then the drafts."""
        return (self.token_id, *self.draft_ids)


@dataclass(frozen=True)
class StepCosts:
    """The engine's running estimates of what a step costs (ns), for the TTFT-first decisions."""

    prefill_ns_per_token: float = 0.0
    decode_ns: float = 0.0

    def learned(self, plan: SchedulerOutput, elapsed_ns: int, weight: float = 0.25) -> StepCosts:
        """These estimates after a step that ran `plan` in `elapsed_ns`: exponential averages (`weight`: the
        newest step's) of a prefill step's time per token and a decode step's time, from pure steps only."""
        if plan.prefills and not plan.decodes:
            per_token = elapsed_ns / plan.num_tokens
            old = self.prefill_ns_per_token
            return StepCosts(per_token if not old else old + weight * (per_token - old), self.decode_ns)
        if plan.decodes and not plan.prefills:
            old = self.decode_ns
            return StepCosts(
                self.prefill_ns_per_token, elapsed_ns if not old else old + weight * (elapsed_ns - old)
            )
        return self


@dataclass
class SchedulerOutput:
    """One step's plan, executed in this order: loads (or, paged, copies), prefills, decodes, saves."""

    loads: list[BlockCopy] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[DecodeItem] = field(default_factory=list)
    saves: list[BlockCopy] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    # paged runners: each planned sequence's block table, covering every token up to this step's end
    block_tables: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # paged runners, before anything else: copy block src into block dst (copy-on-write of a partly shared block)
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.prefills) + sum(1 + len(d.draft_ids) for d in self.decodes)

    @property
    def is_empty(self) -> bool:
        return not (self.prefills or self.decodes)

    def sampled_request_ids(self) -> list[str]:
        """Requests the engine must sample a token for, in plan order."""
        return [c.request_id for c in self.prefills if c.sample] + [d.request_id for d in self.decodes]


class Runner(Protocol):
    """What the engine needs from a runner, capabilities declared (not probed).

    `batches_prefills_with_past`: a TTFT-first prefill run may batch prompts that start on a past (onnxruntime's
    GroupQueryAttention cannot: False there). `mixes_decodes_with_prefills`: the running sequences' decode tokens
    ride in those runs too. `paged_kv`: the runner's KV is the manager's `num_blocks` blocks, addressed by the plan's
    block tables (no slot memory, no loads; saves only publish); otherwise a slot runner: `num_blocks` is its prefix
    store, moved by the plan's loads and saves. `verifies_drafts`: a decode may carry drafted tokens
    (`DecodeItem.draft_ids`) and the runner returns [1 + drafts, vocab] logits for it (speculative decoding;
    onnxruntime's GroupQueryAttention cannot run several tokens on a past at batch > 1: False there).

    `execute` returns, per sampled request, its logits row ([vocab]), or for a decode with drafts its rows."""

    num_slots: int
    num_blocks: int
    vocab_size: int
    batches_prefills_with_past: bool
    mixes_decodes_with_prefills: bool
    paged_kv: bool
    verifies_drafts: bool

    @property
    def runtime_settings(self) -> Mapping[str, str]:
        """What it runs with, by name (the CPU, precision, threads, ...), for the engine's report and /metrics."""
        ...

    @property
    def block_memory(self) -> BlockMemory | None:
        """The blocks' bytes, for a KV transfer (None: no such memory)."""
        ...

    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]: ...

    def expect_drafts(self, max_draft_len: int) -> bool:
        """Speculative decoding is on (a runner that `verifies_drafts`): decodes carry up to this many drafts.
        True when the runner pads a lone sequence's runs to 1 + max_draft_len tokens whatever it drafted (its
        drafts then cost nothing: the scheduler drafts all a lookup finds)."""
        ...

    def close(self) -> None: ...
