"""Iteration-level scheduler: pure Python, never touches arrays.

Each `schedule()` returns a `SchedulerOutput` plan for one runner step: prefix-cache loads into slots, prefill
chunks, one decode token for every sequence whose prompt is done, and block saves into the prefix store. The
engine runs the plan, samples one token for every prefill chunk that ends a prompt and every decode, and hands
the token ids back through `update_from_output()`, which appends them, retires finished sequences at once and
frees their slots and pins. The plan's saves are written after that (off the TTFT path) and published with
`release_saves()`, the one path from an offered block to a visible one. A request's block hashes are computed
once, when it is added (`Request.block_hashes`).

Budget of a step: `max_num_tokens` tokens; decodes (1 each) first, then the chunks of prompts already running,
then admissions in policy order while slots and budget last. A chunk is at most `max_prefill_tokens` tokens when
chunked prefill is on (`max_prefill_tokens_decoding` while sequences decode); with it off a prompt is prefilled
whole. Static batching admits only when nothing runs, once `max_batch_size` requests wait or the oldest has
waited `static_batch_timeout_ms`.

Long prompts (more left than that cap) go first come, first served: each brings the cap's worth of tokens to the
step, and the oldest of them takes what the long ones brought, as much as it needs (up to `max_prefill_tokens`),
before the next one gets any; a long prompt with nothing left for it waits, not admitted, and shorter prompts
behind it go ahead. A step holds the prompt tokens it held when each long prompt took one cap (a lone long prompt
among decodes still takes one cap: their stall stays bounded), but the first of several long prompts is done in a
fraction of the steps instead of all of them finishing together (2 Intel Xeon cores, 1550-1700-token prompts
that share nothing, c=8, in-process: TTFT p50 -16..-39%, bench/results/cpu-speed-xeon/unique-cold).
$LLMKILN_LONG_PROMPTS_FCFS=0 shares the tokens out a cap per prompt instead (A/B measurements). With
`decoding_cap_needs_short_prompts` the cap while decoding applies only while short prompts are about: once none
of the last `SHORT_PROMPT_WINDOW` admitted prompts had at most the cap to compute, prompts take up to
`max_prefill_tokens` a step (a stream of long prompts gets vLLM's and OpenVINO GenAI's big runs; one short prompt
admitted brings the cap back).

A waiting prompt whose next uncached blocks a running prompt is computing (a burst on a system prompt nobody has
cached yet) is passed over until they are written, then starts on them as cache hits: the prefix is computed
once, not once per request of the burst (both modes; prompts that share nothing go ahead meanwhile).

TTFT-first (`scheduler.ttft_first`, stall-free batching in the Sarathi-Serve / vLLM sense, but with prefill
ahead): a step is either one prefill run or one decode batch. Prefill goes first while no running request's
time per output token, (its next token's projected time − its first token's time) / tokens after the first,
would exceed `tpot_slo_ms` if this prefill ran before its next decode; the projection uses the engine's running
estimates of step costs (`StepCosts`). When it would, the step decodes every running sequence instead, and the
step after a forced decode prefills regardless, so prompts never starve (worst case: decode and prefill steps
alternate, as in the decode-first mode). One run per step lets each prompt's first token out as soon as its
own prefill is done. The run is picked among running prompts and admittable waiting ones: fewest chunks left
first (ties in policy order), so one-chunk prompts go first and a prompt just over a chunk does not wait for all
of a long one's chunks (a long prompt waits while shorter ones keep coming); prompts without a cached prefix
that fit one chunk are batched into one run up to `max_prefill_tokens` tokens. A runner that runs decode rows and prefill
chunks in one call (`mixes_decodes_with_prefills`: the OpenVINO and torch runners) gets every running sequence's
decode token in each prefill run as well (mixed steps): decoding advances every step, at the run's pace, and
the TPOT bound still decides whether a run goes ahead.

Speculative decoding (`config.speculative`, method ngram; a runner that `verifies_drafts`): a decoding
sequence's item carries up to max_draft_len drafted tokens (runtime.ngram_drafts: what followed the first
earlier occurrence of its suffix), verified in the same run; `update_from_output` then takes the accepted
drafts and the model's next token (1 to k+1 tokens, runtime.draft_acceptance) and the KV of rejected drafts is
simply overwritten by the next step (their positions lie past the sequence's computed tokens, in blocks of its
own). Drafts count against the step's max_num_tokens; none while more than `speculative.max_concurrency`
sequences decode. Below that, each sequence drafts the longest k whose last draft is still worth its row: p^k
(p: the sequence's own per-draft acceptance, decayed over its verifications) at least what a verified row costs
in tokens of this batch, learned from the engine's decode steps (runtime.draft_cost: nearly free on a small
memory-bound batch, a good share of a token once the batch is compute-bound). A sequence whose p is too low for
even one draft drafts nothing, and its estimate relaxes toward the prior step by step until it tries again
(back-off). So text that does not repeat pays little, and a large batch drafts only what is likely accepted.
Where a verified row costs nothing (a lone sequence whose runs the runner pads to 1 + max_draft_len, runtime.
run_padding; `lone_drafts_free`, from the runner's `expect_drafts`), it drafts whatever its lookup found, from
one-token matches up, at every step, as GenAI's prompt lookup does: not learned, and no standing aside. With
`speculative.history_tokens`, such a sequence whose own lookup matched on one token or nothing drafts from the
outputs of earlier requests instead (runtime.draft_history: their most frequent continuation of its last
tokens), and the finished requests' outputs are recorded there.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmkiln import recipe as recipe_schema
from llmkiln.env_switch import env_switch
from llmkiln.recipe_trtllm import Speculative
from llmkiln.runtime.draft_cost import FREE_ROW, DraftCost
from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.kv_blocks import BlockStore
from llmkiln.runtime.ngram_drafts import NgramIndex, match_class
from llmkiln.runtime.plan import BlockCopy, DecodeItem, PrefillChunk, SchedulerOutput, StepCosts
from llmkiln.runtime.request import FinishReason, Request, RequestStatus, TokenEvent

# A waiting prompt whose next uncached blocks a running prompt is computing now (a burst of requests on a system
# prompt not cached yet) waits for them instead of computing them a second time: written, they are cache hits. The
# common prefix must be at least this many tokens; $LLMKILN_INFLIGHT_PREFIX_WAIT=0 turns it off (A/B measurements).
INFLIGHT_PREFIX_MIN_TOKENS = 64
# 0: a lone sequence's drafts are priced by draft_cost's fit too (A/B measurements; read by the engine)
LONE_DRAFTS_FREE_ENV = "LLMKILN_LONE_DRAFTS_FREE"
INFLIGHT_PREFIX_ENV = "LLMKILN_INFLIGHT_PREFIX_WAIT"
# 0: every prompt of a step takes at most a cap (max_prefill_tokens[_decoding]) in turn, long ones sharing the step
LONG_PROMPTS_FCFS_ENV = "LLMKILN_LONG_PROMPTS_FCFS"
# scheduler.decoding_cap_needs_short_prompts: the admitted prompts looked at (their tokens left to compute)
SHORT_PROMPT_WINDOW = 16


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings: the recipe's typed scheduler, kv_cache, limits and speculative sections (their
    defaults are the recipe schema's, nowhere else) plus the model's end-of-sequence ids."""

    scheduler: recipe_schema.Scheduler
    kv_cache: recipe_schema.KvCache
    limits: recipe_schema.Limits
    eos_token_ids: tuple[int, ...] = ()
    speculative: Speculative | None = None

    @classmethod
    def from_recipe(
        cls, recipe: recipe_schema.Recipe, eos_token_ids: tuple[int, ...] = ()
    ) -> SchedulerConfig:
        return cls(recipe.scheduler, recipe.kv_cache, recipe.limits, tuple(eos_token_ids), recipe.speculative)

    @classmethod
    def make(
        cls,
        eos_token_ids: tuple[int, ...] = (),
        speculative: Speculative | Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> SchedulerConfig:
        """Settings by field name (tests, tools): each goes to the recipe section that owns it, validated there;
        `speculative`: the recipe's section (or its fields)."""
        spec = Speculative(**speculative) if isinstance(speculative, Mapping) else speculative
        sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        for key, value in fields.items():
            owner = next((name for name, model in _SECTIONS.items() if key in model.model_fields), None)
            if owner is None:
                raise TypeError(
                    f"SchedulerConfig.make: no recipe field {key!r} in scheduler, kv_cache or limits"
                )
            sections[owner][key] = value
        return cls(
            recipe_schema.Scheduler(**sections["scheduler"]),
            recipe_schema.KvCache(**sections["kv_cache"]),
            recipe_schema.Limits(**sections["limits"]),
            tuple(eos_token_ids),
            spec,
        )


_SECTIONS: dict[str, type[recipe_schema.Strict]] = {
    "scheduler": recipe_schema.Scheduler,
    "kv_cache": recipe_schema.KvCache,
    "limits": recipe_schema.Limits,
}


class Scheduler:
    """Owns the waiting queue, the running slots and the KV cache manager's pins.

    `paged`: the runner keeps all KV in the manager's blocks (`Runner.paged_kv`, the OpenVINO runner): each running
    request holds a block table (`Request.pinned_block_ids`: cached prefix blocks shared by pinning, then blocks
    of its own, allocated as it grows into them out of the worst case `reserve`d at admission), the plan carries
    the tables (`SchedulerOutput.block_tables`) and no loads; a save then just publishes a prompt block the
    request wrote in place. Otherwise (onnxruntime's contiguous slots) cached blocks are copied into a slot
    (`loads`) and completed prompt blocks out of it (`saves`), and a free slot's resident prefix is reused."""

    def __init__(
        self, config: SchedulerConfig, block_store: BlockStore | None = None, paged: bool = False
    ) -> None:
        self.config = config
        self.block_store = block_store if config.kv_cache.prefix_reuse else None
        if paged and block_store is None:
            raise ValueError("a paged runner's scheduler needs the KV cache manager (block_store)")
        self.pool = block_store if paged else None  # paged: the manager of every block of KV
        self.waiting: list[Request] = []  # sorted by policy key
        self.slots: list[Request | None] = [None] * config.scheduler.max_batch_size
        self._free_slots: set[int] = set(range(config.scheduler.max_batch_size))
        # Prompt tokens whose KV a free slot still holds from its last request (prefill-computed or loaded):
        # a new prompt sharing a prefix with it starts there, with no block copies at all.
        self._resident: list[list[int]] = [[] for _ in range(config.scheduler.max_batch_size)]
        self.requests: dict[str, Request] = {}
        self._arrivals = 0
        self.num_admitted = 0
        self.queue_ns_total = 0
        self._forced_decode = False  # ttft_first: the last step was a decode forced by the TPOT bound
        # waiting prompts wait for blocks a running prompt is computing (INFLIGHT_PREFIX_MIN_TOKENS); how many did
        self.await_inflight_prefix = env_switch(INFLIGHT_PREFIX_ENV, True)
        self.long_prompts_fcfs = env_switch(LONG_PROMPTS_FCFS_ENV, True)
        # tokens left to compute of the last admitted prompts (scheduler.decoding_cap_needs_short_prompts)
        self._admitted_rest: deque[int] = deque(maxlen=SHORT_PROMPT_WINDOW)
        self.num_inflight_prefix_waits = 0
        # Set by the engine from its runner (`batches_prefills_with_past`): a TTFT-first prefill run may then hold
        # several prompts with a past (a cached or resident prefix), up to max_prefill_tokens, in one engine call.
        # Off for onnxruntime's GroupQueryAttention, which takes a past only at batch 1.
        self.batch_past_prefills = False
        # Set by the engine from its runner (`mixes_decodes_with_prefills`): a TTFT-first prefill run then also
        # carries every running sequence's decode token (one engine call for both: the decode rows add a few rows
        # to the run's products): a prefill run no longer stalls decoding; the TPOT bound still applies (a run too
        # long for it gives way to a plain decode step).
        self.mix_decodes = False
        # speculative decoding: drafted / accepted tokens and verifications (decodes that carried drafts) so far
        self.num_drafted_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verifications = 0
        # of those, the drafts that rode free (rows priced under FREE_ROW: a lone sequence's padded runs), where a
        # low acceptance costs nothing (kiln diagnose judges the acceptance of the others)
        self.num_free_drafted_tokens = 0
        self.num_free_accepted_tokens = 0
        # of the free ones, those drafted from earlier requests' outputs (speculative.history_tokens)
        self.num_history_drafted_tokens = 0
        self.num_history_accepted_tokens = 0
        spec = config.speculative
        self.draft_history = DraftHistory(spec.history_tokens) if spec and spec.history_tokens else None
        self.draft_cost = (
            DraftCost()
        )  # what a verified draft costs here (the engine feeds it its decode steps)
        # Set by the engine from its runner (`expect_drafts`): a lone decoding sequence's runs are padded to
        # 1 + max_draft_len tokens whatever it drafts, so its drafts cost nothing by construction: it drafts all
        # its lookup finds, from one-token matches up, at every step, as GenAI's prompt lookup does, and its
        # runs keep one shape. Not learned: the fit of draft_cost sees the shape changes of a sequence that
        # drafts now and then (a 1-token run after 9-token ones pays ~5 ms), prices a row at ~3 ms and cuts the
        # drafts, which makes the shape wander more (measured, open chat c=1: a third of the steps verified
        # drafts, 1.45-1.51 tokens a step against GenAI's 1.66-1.74). $LLMKILN_LONE_DRAFTS_FREE=0 (read by the
        # engine, for A/B measurements): priced by the fit like any batch.
        self.lone_drafts_free = False

    # ------------------------------------------------------------------ state
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return sum(1 for r in self.slots if r is not None)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def has_work(self) -> bool:
        return bool(self.waiting) or self.num_running > 0

    def running(self) -> list[Request]:
        return [r for r in self.slots if r is not None]

    def add_request(self, request: Request) -> None:
        """Queue a request (validated by the caller). Ties in the policy key keep arrival order."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        request.arrival_seq = self._arrivals
        self._arrivals += 1
        if self.block_store is not None and not request.block_hashes:
            # computed once per request (vLLM's Request.block_hashes): lookups and saves reuse them
            n_full = request.num_prompt_tokens // self.config.kv_cache.tokens_per_block
            request.block_hashes = self.block_store.block_keys(request.prompt_ids, n_full)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        policy = self.config.scheduler.policy
        bisect.insort(self.waiting, request, key=lambda r: r.sort_key(policy))

    def abort(self, request_id: str, now_ns: int = 0) -> Request | None:
        """Cancel: remove from the queue or free its slot and pins now. None if unknown or finished."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return None
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        self._finish(request, FinishReason.CANCELLED, now_ns)
        return request

    def next_wakeup_ns(self) -> int | None:
        """Static batching: when the oldest waiting request's batch timeout expires (None if not waiting)."""
        if self.config.scheduler.batching != "static" or not self.waiting or self.num_running:
            return None
        oldest = min(r.timings.arrival_ns for r in self.waiting)
        return oldest + self.config.scheduler.static_batch_timeout_ms * 1_000_000

    # ------------------------------------------------------------------ planning
    def schedule(self, now_ns: int = 0, costs: StepCosts | None = None) -> SchedulerOutput:
        if self.config.scheduler.ttft_first:
            out = self._schedule_ttft_first(now_ns, costs or StepCosts())
        else:
            out = self._schedule_budget(now_ns)
        if self.pool is not None:
            for rid in [c.request_id for c in out.prefills] + [d.request_id for d in out.decodes]:
                out.block_tables[rid] = tuple(self.requests[rid].pinned_block_ids)
        return out

    def _schedule_budget(self, now_ns: int) -> SchedulerOutput:
        cfg = self.config
        out = SchedulerOutput()
        budget = cfg.scheduler.max_num_tokens
        running = sorted(self.running(), key=lambda r: r.arrival_seq)
        # prompt chunks may join this run (any running prompt or waiting request): a lone decode's drafts are
        # then not free (the run is no small padded one)
        prompts = bool(self.waiting) or any(not r.prefill_done for r in running)
        self._plan_decodes([r for r in running if r.prefill_done], out, with_prompts=prompts)
        budget -= out.num_tokens
        limit = self._run_limit(bool(out.decodes))
        chunked = cfg.scheduler.chunked_prefill
        pool = self._long_prompt_pool(running, limit) if chunked and self.long_prompts_fcfs else None

        def take(request: Request, rest: int) -> int:
            """The request's chunk this step: a cap, or for a long prompt (first come, first served) the pool."""
            nonlocal pool
            if pool is None or rest <= limit:
                return min(budget, limit)
            size = min(budget, rest, pool)
            pool -= size
            return size

        for r in running:
            if not r.prefill_done and budget > 0:
                size = take(r, r.num_prompt_tokens - r.num_computed_tokens)
                if size > 0:
                    budget -= self._plan_chunk(r, size, out)
        if self._may_admit(now_ns):
            inflight = self._inflight_keys(running)
            i = 0
            while i < len(self.waiting) and self._free_slots:
                if chunked and budget <= 0:
                    break
                request = self.waiting[i]
                hits = self._lookup(request)
                if self._awaits_inflight(request, hits, inflight):
                    i += 1  # the next ones may go ahead: this one is admitted once those blocks are written
                    continue
                if not self._fits(request, hits, self.pool.num_available if self.pool else 0):
                    break
                remaining = request.num_prompt_tokens - self._admission_start(request, hits)
                if not chunked and remaining > budget and not out.is_empty:
                    break
                size = take(request, remaining)
                if size <= 0:
                    i += 1  # a long prompt the older ones left no tokens for: it waits, shorter ones may go
                    continue
                self.waiting.pop(i)
                self._admit(request, hits, now_ns, out)
                budget -= self._plan_chunk(request, size, out)
                if inflight is not None:
                    inflight.update(request.block_hashes)
        out.decodes.sort(key=lambda d: d.slot)
        return out

    def _schedule_ttft_first(self, now_ns: int, costs: StepCosts) -> SchedulerOutput:
        """One prefill run, or one decode batch when the TPOT bound says so (see the module docstring)."""
        out = SchedulerOutput()
        running = sorted(self.running(), key=lambda r: r.arrival_seq)
        decoding = [r for r in running if r.prefill_done]
        limit = self._run_limit(bool(decoding))
        picked = self._pick_prefill_run(running, limit)
        if picked and decoding and not self._forced_decode:
            tokens = sum(n for _, _, n in picked)
            projected = now_ns + tokens * costs.prefill_ns_per_token + costs.decode_ns
            slo_ns = self.config.scheduler.tpot_slo_ms * 1e6
            first = [r.timings.first_token_ns for r in decoding]
            late = any(
                t is not None and (projected - t) / len(r.output_ids) > slo_ns
                for r, t in zip(decoding, first, strict=True)
            )
            if late:
                picked = []
        if not picked:
            self._forced_decode = bool(decoding) and self._has_prefill_work(running)
            self._plan_decodes(decoding, out)
            out.decodes.sort(key=lambda d: d.slot)
            return out
        self._forced_decode = False
        # admit (pin every picked prompt's hits) before any block is taken for this step: taking one may evict an
        # unpinned cached block, and the hits were looked up before
        for request, hits, _ in picked:
            if request.status is RequestStatus.WAITING:
                self.waiting.remove(request)
                self._admit(request, hits, now_ns, out)
        if self.mix_decodes:  # the decode tokens ride in the prefill run (same projected time as above)
            self._plan_decodes(decoding, out, with_prompts=True)
            out.decodes.sort(key=lambda d: d.slot)
        for request, _, _ in picked:
            self._plan_chunk(request, limit, out)
        return out

    def _long_prompt_pool(self, running: list[Request], limit: int) -> int:
        """The tokens this step's long prompts (more than `limit` left) take together: `limit` for each running one
        and for each waiting one that a free slot could take (its whole prompt counted: cached blocks are looked up
        only when it is admitted)."""
        n = sum(
            1 for r in running if not r.prefill_done and r.num_prompt_tokens - r.num_computed_tokens > limit
        )
        n += sum(1 for r in self.waiting[: len(self._free_slots)] if r.num_prompt_tokens > limit)
        return n * limit

    def _run_limit(self, decoding: bool) -> int:
        """The most prompt tokens one step's prefill may take: max_prefill_tokens, or while sequences decode
        max_prefill_tokens_decoding when set (it bounds their stall; an idle engine takes whole chunks)."""
        cfg = self.config.scheduler
        cap = cfg.max_prefill_tokens_decoding
        if cap is None or not decoding:
            return cfg.max_prefill_tokens
        if cfg.decoding_cap_needs_short_prompts and self._only_long_prompts(cap):
            return cfg.max_prefill_tokens
        return cap

    def _only_long_prompts(self, cap: int) -> bool:
        """A stream of long prompts: the last SHORT_PROMPT_WINDOW admitted all had more than `cap` to compute."""
        rests = self._admitted_rest
        return len(rests) == rests.maxlen and min(rests) > cap

    def _has_prefill_work(self, running: list[Request]) -> bool:
        return any(not r.prefill_done for r in running) or bool(self.waiting and self._free_slots)

    def _pick_prefill_run(self, running: list[Request], limit: int) -> list[tuple[Request, list[int], int]]:
        """The prefill run of a TTFT-first step: [(request, cached block hits, tokens)], nothing planned yet.

        Candidates: running prompts, then waiting ones that would get a free slot (policy order). Those with the
        fewest chunks left go first (shortest remaining prefill first, counted in chunks: a prompt just over one
        chunk does not wait for all of a long one's). A candidate with a past (a later chunk or a cached prefix)
        runs alone; one without a past is batched with the next such candidates while `max_prefill_tokens` lasts. With
        `batch_past_prefills` (a runner that batches prompts on a past), candidates whose rest fits one chunk are
        batched whatever their past, while `max_prefill_tokens` lasts. `limit` (`_run_limit`) stands for
        max_prefill_tokens in all of this."""
        cfg = self.config.scheduler
        chunk = limit if cfg.chunked_prefill else None
        cands: list[tuple[Request, list[int], int, int]] = []  # (request, hits, start, rest)
        for r in running:
            if not r.prefill_done:
                cands.append((r, [], r.num_computed_tokens, r.num_prompt_tokens - r.num_computed_tokens))
        available = self.pool.num_available if self.pool is not None else 0
        inflight = self._inflight_keys(running)
        slots = len(self._free_slots)
        for r in self.waiting:
            if slots <= 0:
                break
            hits = self._lookup(r)
            if self._awaits_inflight(r, hits, inflight):
                continue
            if not self._fits(r, hits, available):
                break  # admission order holds: the next ones wait too
            if self.pool is not None:
                available -= self._blocks_taken(r, hits)
            start = self._admission_start(r, hits)
            cands.append((r, hits, start, r.num_prompt_tokens - start))
            slots -= 1
            if inflight is not None:  # a later prompt on the same prefix waits for this one
                inflight.update(r.block_hashes)
        if not cands:
            return []
        # stable sort: fewest chunks left first (a prompt finishing in one chunk before multi-chunk ones, a prompt of
        # two chunks before the 15 left of a long one's), otherwise the order above
        cands.sort(key=lambda c: 0 if chunk is None else -(-c[3] // chunk))
        first, hits, start, rest = cands[0]
        size = rest if chunk is None else min(rest, chunk)
        picked = [(first, hits, size)]
        with_past = self.batch_past_prefills
        if (start > 0 and not with_past) or size < rest:
            return picked
        budget = limit - size
        for r, h, st, n in cands[1:]:
            if (st == 0 or with_past) and n <= budget and (chunk is None or n <= chunk):
                picked.append((r, h, n))
                budget -= n
        return picked

    def _may_admit(self, now_ns: int) -> bool:
        cfg = self.config
        if cfg.scheduler.batching != "static":
            return True
        if self.num_running or not self.waiting:
            return False
        if len(self.waiting) >= cfg.scheduler.max_batch_size:
            return True
        wake = self.next_wakeup_ns()
        return wake is not None and now_ns >= wake

    def _inflight_keys(self, running: list[Request]) -> set[int] | None:
        """Keys of the prompt blocks running prompts are still computing (None: waiting for them is off, or no
        prompt waits)."""
        if self.block_store is None or not self.await_inflight_prefix or not self.waiting:
            return None
        keys: set[int] = set()
        for r in running:
            if not r.prefill_done:
                keys.update(r.block_hashes)
        return keys

    def _awaits_inflight(self, request: Request, hits: list[int], inflight: set[int] | None) -> bool:
        """The request's next uncached blocks are being computed by a running prompt (chained keys: equal keys mean
        the whole prefix is equal), and that common prefix is at least INFLIGHT_PREFIX_MIN_TOKENS: it waits."""
        if not inflight:
            return False
        bs = self.config.kv_cache.tokens_per_block
        first = self._admission_start(request, hits) // bs
        gain = 0
        for key in request.block_hashes[first:]:
            if key not in inflight:
                break
            gain += 1
        # nothing in flight to wait for, or a short common run (computed again rather than waited for)
        if gain == 0 or (first + gain) * bs < INFLIGHT_PREFIX_MIN_TOKENS:
            return False
        if not request.awaited_inflight_prefix:
            request.awaited_inflight_prefix = True
            self.num_inflight_prefix_waits += 1
        return True

    def _lookup(self, request: Request) -> list[int]:
        if self.block_store is None:
            return []
        return self.block_store.lookup_keys(
            request.block_hashes, request.prompt_ids, request.num_prompt_tokens - 1
        )

    # ------------------------------------------------------------------ paged KV: reservations and block tables
    def _worst_case_blocks(self, request: Request) -> int:
        """Blocks the request can fill before it ends (its prompt and max_tokens outputs, within max_seq_len)."""
        tokens = min(request.num_prompt_tokens + request.params.max_tokens, self.config.limits.max_seq_len)
        return -(-tokens // self.config.kv_cache.tokens_per_block)

    def _blocks_taken(self, request: Request, hits: list[int]) -> int:
        """Available blocks admitting the request takes: its reservation, and cached hits no one pins yet."""
        assert self.pool is not None
        unpinned = sum(1 for b in hits if self.pool.blocks[b].ref_count == 0)
        return max(0, self._worst_case_blocks(request) - len(hits)) + unpinned

    def _fits(self, request: Request, hits: list[int], available: int) -> bool:
        return self.pool is None or self._blocks_taken(request, hits) <= available

    def _grow(self, request: Request, end: int) -> None:
        """Paged: extend the request's block table to cover tokens [0, end). A block that will hold a whole prompt
        block is offered under its chained key (the request writes its KV in place; it is published once complete,
        `_plan_saves`), unless that prefix is stored or being written already; every other one is private."""
        pool, bs = self.pool, self.config.kv_cache.tokens_per_block
        assert pool is not None
        table = request.pinned_block_ids
        while len(table) * bs < end:
            i = len(table)
            block_id = None
            if self.block_store is not None and (i + 1) * bs <= request.num_prompt_tokens:
                parent = request.block_hashes[i - 1] if i else None
                tokens = request.prompt_ids[i * bs : (i + 1) * bs]
                _, block_id = pool.offer(parent, tokens, key=request.block_hashes[i], reserved=True)
                if block_id is not None:
                    pool.pin([block_id])  # the table's pin; the offer's ends with commit (or _finish)
                    request.offered.add(i)
            if block_id is None:
                block_id = pool.allocate(reserved=True)
            if block_id is None:  # the reservation guarantees a block: a bookkeeping bug
                raise RuntimeError(f"request {request.request_id}: no KV block within its reservation")
            request.reserved_blocks -= 1
            table.append(block_id)

    def _copy_on_write(self, request: Request, hits: list[int], out: SchedulerOutput) -> int:
        """Paged, at admission: the prompt tokens after its whole-block hits that a stored block chained to the
        last hit also starts with (`BlockStore.partial_match`), at most up to the prompt's last token. That block
        is copied into the request's own next block (planned in `out.copies`, pinned until the step ran) and the
        prefill starts after them. Returns how many tokens it saves (0: none)."""
        store, pool = self.block_store, self.pool
        if store is None or pool is None:
            return 0
        bs = self.config.kv_cache.tokens_per_block
        start = len(hits) * bs
        limit = min(bs, request.num_prompt_tokens - 1 - start)
        if limit <= 0:
            return 0
        parent = request.block_hashes[len(hits) - 1] if hits else None
        src, n = store.partial_match(parent, request.prompt_ids[start : start + limit])
        if src is None or n <= 0:
            return 0
        if pool.blocks[src].ref_count == 0 and pool.num_available < 1:
            return 0  # pinning it would eat into the reservations
        pool.pin([src])
        self._grow(request, start + 1)
        out.copies.append((src, request.pinned_block_ids[len(hits)]))
        return n

    def _release_copies(self, out: SchedulerOutput) -> None:
        if out.copies and self.pool is not None:
            self.pool.unpin([src for src, _ in out.copies])
            out.copies = []

    def _plan_decodes(
        self, decoding: list[Request], out: SchedulerOutput, with_prompts: bool = False
    ) -> None:
        """One decode item per decoding sequence, with drafts where speculation is on and the step's max_num_tokens
        leaves room for them (decodes of earlier arrivals draft first). `with_prompts`: prompt chunks may share
        the run."""
        spec = self.config.speculative
        spare = 0
        # a lone sequence in a run of its own, padded to 1 + max_draft_len anyway: its drafts are free, it always
        # drafts (no learned price, no standing aside); beside prompt tokens its rows cost like any
        free = len(decoding) == 1 and self.lone_drafts_free and not with_prompts
        if (
            spec is not None
            and (spec.max_concurrency is None or len(decoding) <= spec.max_concurrency)
            and (free or self.draft_cost.speculates(len(decoding)))
        ):
            spare = max(0, self.config.scheduler.max_num_tokens - len(decoding))
        if not spare:
            worth = 1.0
        elif free:
            worth = 0.0
        else:
            worth = self.draft_cost.threshold(len(decoding))
        for r in decoding:
            drafts = self._drafts(r, spare, worth, free) if spare else ()
            spare -= len(drafts)
            out.decodes.append(self._decode_item(r, drafts))

    def _drafts(self, request: Request, spare: int, worth: float, padded: bool = False) -> tuple[int, ...]:
        """Up to the request's draft length of n-gram drafts, within what its max_tokens / max_seq_len and its
        KV reservation allow (all accepted plus the model's token must still fit). `padded`: a lone sequence in
        a run of its own, padded to 1 + max_draft_len (its rows free by construction, not by a learned price)."""
        spec = self.config.speculative
        assert spec is not None
        k = request.params.num_speculative_tokens
        k = spec.max_draft_len if k is None else k
        room = min(
            request.params.max_tokens - len(request.output_ids),
            self.config.limits.max_seq_len - request.num_tokens,
        )
        k = min(k, spare, room - 1)
        if k <= 0:
            return ()
        index = request.drafter
        if index is None:
            index = request.drafter = NgramIndex(spec.max_matching_ngram_size)
            index.extend(request.prompt_ids)
        index.extend(request.output_ids[len(index) - request.num_prompt_tokens :])
        # where a verified row costs nothing (one padded sequence: runtime.run_padding), a one-token match is
        # worth its row too, as GenAI's prompt lookup drafts at every step
        shortest = 1 if worth <= FREE_ROW else spec.min_matching_ngram_size
        drafts, n = index.match(k, shortest)
        # earlier replies where the own lookup found little; only in a padded run: a learned price under
        # FREE_ROW (a memory-bound batch) is not nothing, and these drafts are mostly wrong
        better = (
            self.draft_history.instead_of(drafts, n, index.tokens, k)
            if padded and self.draft_history is not None
            else None
        )
        request.draft_history = better is not None
        if better is not None:
            drafts, n = better
        if not drafts:
            return ()
        cls = match_class(n)
        # a free row drafts whatever matched, as GenAI's prompt lookup does: the run is padded to that size anyway
        k = len(drafts) if worth <= FREE_ROW else _draft_length(request.acceptance.p(cls), len(drafts), worth)
        if (
            k <= 0
        ):  # not worth a row now: the estimate relaxes toward the prior, so the sequence tries again later
            request.acceptance.relax(cls)
            return ()
        request.draft_class = cls
        request.draft_free = worth <= FREE_ROW
        return drafts[:k]

    def _decode_item(self, request: Request, drafts: tuple[int, ...] = ()) -> DecodeItem:
        position = request.num_computed_tokens
        if self.pool is not None:
            self._grow(request, position + 1 + len(drafts))
        return DecodeItem(request.request_id, request.slot_id, request.last_token_id(), position, drafts)

    def _best_slot(self, request: Request) -> tuple[int, int]:
        """(free slot, prompt tokens it still holds for this request): the longest resident prefix wins, then the
        lowest slot. At most num_prompt_tokens - 1 (one token must be computed to get logits). Paged runners keep
        no resident prefix (the blocks stay cached in the manager instead)."""
        kv = self.config.kv_cache
        reuse = kv.prefix_reuse and kv.slot_reuse and self.pool is None
        limit = request.num_prompt_tokens - 1 if reuse else 0
        best, best_n = -1, -1
        for slot in sorted(self._free_slots):
            n = _common_prefix(self._resident[slot], request.prompt_ids, limit)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def _admission_start(self, request: Request, hits: list[int]) -> int:
        """Where the request's prefill would start if admitted now (cached blocks or a resident prefix)."""
        resident = self._best_slot(request)[1] if self._free_slots else 0
        return max(resident, len(hits) * self.config.kv_cache.tokens_per_block)

    def _admit(self, request: Request, hits: list[int], now_ns: int, out: SchedulerOutput) -> None:
        slot, resident = self._best_slot(request)
        self._free_slots.discard(slot)
        self._resident[slot] = []  # until this request's prompt is computed there
        bs = self.config.kv_cache.tokens_per_block
        request.slot = slot
        self.slots[slot] = request
        request.status = RequestStatus.RUNNING
        request.timings.first_scheduled_ns = now_ns
        self.num_admitted += 1
        self.queue_ns_total += max(0, now_ns - request.timings.arrival_ns)
        out.admitted.append(request.request_id)
        cached = len(hits) * bs
        if self.pool is not None:  # paged: the hits start the block table, the rest is reserved
            self.pool.pin(hits)
            request.pinned_block_ids = list(hits)
            need = max(0, self._worst_case_blocks(request) - len(hits))
            if not self.pool.reserve(need):  # _fits said yes on this thread: a bookkeeping bug
                raise RuntimeError(f"request {request.request_id}: {need} KV blocks not available")
            request.reserved_blocks = need
            cached += self._copy_on_write(request, hits, out)
        elif hits and self.block_store is not None:
            # Every hit block is pinned while the request runs, so a prefix in use is never evicted and is
            # refreshed in the LRU when released (the KV router sees it stay); blocks the slot already holds need
            # no copy, the rest are copied in.
            loaded = hits[resident // bs :]
            self.block_store.pin(hits)
            request.pinned_block_ids = list(hits)
            for i, block_id in enumerate(loaded, start=len(hits) - len(loaded)):
                out.loads.append(BlockCopy(block_id, slot, i * bs, request.block_hashes[i]))
            request.parent_hash = self.block_store.blocks[hits[-1]].key
        request.num_cached_tokens = max(resident, cached)
        if self.block_store is not None:
            self.block_store.record_lookup(request.num_prompt_tokens, request.num_cached_tokens)
        request.num_computed_tokens = request.num_cached_tokens
        request.num_saved_blocks = len(hits)
        self._admitted_rest.append(request.num_prompt_tokens - request.num_computed_tokens)

    def _plan_chunk(self, request: Request, budget: int, out: SchedulerOutput) -> int:
        """Plan the next prefill chunk of a running request; returns the tokens it uses."""
        cfg = self.config
        start = request.num_computed_tokens
        remaining = request.num_prompt_tokens - start
        size = (
            min(remaining, cfg.scheduler.max_prefill_tokens, budget)
            if cfg.scheduler.chunked_prefill
            else remaining
        )
        if size <= 0:
            return 0
        end = start + size
        if self.pool is not None:
            self._grow(request, end)
        chunk = PrefillChunk(
            request.request_id,
            request.slot_id,
            start,
            tuple(request.prompt_ids[start:end]),
            end == request.num_prompt_tokens,
        )
        out.prefills.append(chunk)
        self._plan_saves(request, end, out)
        return size

    def _plan_saves(self, request: Request, computed: int, out: SchedulerOutput) -> None:
        """Offer every prompt block that is complete once `computed` tokens are in the slot."""
        store = self.block_store
        if store is None:
            return
        bs = self.config.kv_cache.tokens_per_block
        while (request.num_saved_blocks + 1) * bs <= min(computed, request.num_prompt_tokens):
            i = request.num_saved_blocks
            if self.pool is not None:  # paged: the block the request writes is the one published
                request.num_saved_blocks += 1
                if i in request.offered:
                    request.offered.discard(i)
                    written = request.pinned_block_ids[i]
                    out.saves.append(BlockCopy(written, request.slot_id, i * bs, request.block_hashes[i]))
                continue
            key, block_id = store.offer(
                request.parent_hash, request.prompt_ids[i * bs : (i + 1) * bs], key=request.block_hashes[i]
            )
            request.parent_hash = key
            request.num_saved_blocks += 1
            if block_id is not None:
                out.saves.append(BlockCopy(block_id, request.slot_id, i * bs, key))

    # ------------------------------------------------------------------ results
    def update_from_output(
        self, out: SchedulerOutput, sampled: Mapping[str, int | Sequence[int]], now_ns: int = 0
    ) -> list[tuple[Request, TokenEvent]]:
        """Apply a step's sampled tokens; returns the token events (finished sequences are retired). A decode with
        drafts brings its verification's tokens (the accepted drafts, then the model's: 1 to k+1); their KV is
        computed for all but the last, like one plain decode's.

        The plan's block saves are not published here: the caller writes them (after this step's tokens are out)
        and then calls `release_saves` — the one path from an offered block to a visible one."""
        self._release_copies(out)  # the step ran: the copies' sources may go
        events: list[tuple[Request, TokenEvent]] = []
        for chunk in out.prefills:
            request = self.requests[chunk.request_id]
            request.num_computed_tokens += len(chunk.token_ids)
            if chunk.sample:
                got = sampled[chunk.request_id]
                token = got if isinstance(got, int) else _single(got, chunk.request_id)
                events.append((request, self._append(request, token, now_ns)))
        for item in out.decodes:
            request = self.requests[item.request_id]
            got = sampled[item.request_id]
            tokens = [got] if isinstance(got, int) else list(got)
            if not 1 <= len(tokens) <= 1 + len(item.draft_ids):
                raise ValueError(
                    f"decode of {item.request_id} with {len(item.draft_ids)} drafts got {len(tokens)} tokens"
                )
            if item.draft_ids:
                self._count_verification(request, len(item.draft_ids), len(tokens) - 1)
            request.num_computed_tokens += len(tokens)
            for token in tokens:
                event = self._append(request, token, now_ns)
                events.append((request, event))
                if event.finished:
                    break
        return events

    def _count_verification(self, request: Request, drafted: int, accepted: int) -> None:
        self.num_verifications += 1
        self.num_drafted_tokens += drafted
        self.num_accepted_tokens += accepted
        if request.draft_free:
            self.num_free_drafted_tokens += drafted
            self.num_free_accepted_tokens += accepted
        if request.draft_history:
            # not the sequence's own lookup: its acceptance estimate stays its own text's
            self.num_history_drafted_tokens += drafted
            self.num_history_accepted_tokens += accepted
            return
        request.acceptance.record(request.draft_class, drafted, accepted)

    def release_saves(self, saves: list[BlockCopy], written: bool) -> None:
        """The caller wrote a plan's saves (after `update_from_output`): publish the blocks (`commit`), or free
        them when the write failed. Every offered block ends here or in `abandon`."""
        if self.block_store is None or not saves:
            return
        ids = [s.block_id for s in saves]
        if written:
            self.block_store.commit(ids)
        else:
            self.block_store.unpin(ids)

    def abandon(self, out: SchedulerOutput, now_ns: int = 0) -> list[Request]:
        """The runner failed on this plan: release its offered blocks and fail every running request."""
        if self.block_store is not None and out.saves:
            self.block_store.unpin([s.block_id for s in out.saves])
        self._release_copies(out)
        failed = self.running()
        for request in failed:
            self._finish(request, FinishReason.ERROR, now_ns)
        self._resident = [[] for _ in self._resident]  # what the failed run left in the slots is unknown
        return failed

    def _append(self, request: Request, token_id: int, now_ns: int) -> TokenEvent:
        cfg, params = self.config, request.params
        request.output_ids.append(int(token_id))
        if request.timings.first_token_ns is None:
            request.timings.first_token_ns = now_ns
        reason = None
        if (not params.ignore_eos and token_id in cfg.eos_token_ids) or token_id in params.stop_token_ids:
            reason = FinishReason.STOP
        elif len(request.output_ids) >= params.max_tokens or request.num_tokens >= cfg.limits.max_seq_len:
            reason = FinishReason.LENGTH
        if reason is not None:
            self._finish(request, reason, now_ns)
        return TokenEvent(
            int(token_id), len(request.output_ids) - 1, reason is not None, reason.value if reason else None
        )

    def _finish(self, request: Request, reason: FinishReason, now_ns: int) -> None:
        if self.draft_history is not None and request.output_ids:
            self.draft_history.record(request.prompt_ids, request.output_ids)
        if request.slot is not None:
            if self.pool is None:
                computed = min(request.num_computed_tokens, request.num_prompt_tokens)
                self._resident[request.slot] = request.prompt_ids[:computed]
            self.slots[request.slot] = None
            self._free_slots.add(request.slot)
            request.slot = None
        store = self.pool or self.block_store
        if store is not None:
            # offered prompt blocks never completed (a cancel mid-prompt): their offer's pin, then the table's
            store.unpin([request.pinned_block_ids[i] for i in sorted(request.offered)])
            if request.pinned_block_ids:
                store.unpin(request.pinned_block_ids)
            if request.reserved_blocks:
                store.unreserve(request.reserved_blocks)
        request.offered.clear()
        request.reserved_blocks = 0
        request.pinned_block_ids = []
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.timings.finish_ns = now_ns
        self.requests.pop(request.request_id, None)


def _draft_length(p: float, k: int, worth: float) -> int:
    """Speculative decoding's draft length: the longest n <= k whose last draft is still accepted with
    probability >= worth (p^n under the per-draft acceptance p; worth: a verified row's cost in tokens of this
    batch, runtime.draft_cost)."""
    n = 0
    while n < k and p ** (n + 1) >= worth:
        n += 1
    return n


def _single(tokens: Sequence[int], request_id: str) -> int:
    if len(tokens) != 1:
        raise ValueError(f"the prefill of {request_id} got {len(tokens)} tokens, not one")
    return int(tokens[0])


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b, at most `limit` (bisection over C-speed list comparisons)."""
    lo, hi = 0, max(0, min(len(a), len(b), limit))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
