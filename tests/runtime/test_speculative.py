"""Speculative decoding on the runtime: n-gram drafts, verification in the step's run, exact greedy output,
the sampled output distribution kept (rejection sampling), the KV manager's blocks all given back."""

from __future__ import annotations

import numpy as np
import pytest

from llmkiln.errors import BadInput, RecipeError
from llmkiln.recipe import load_recipe
from llmkiln.runtime.draft_acceptance import accept_drafts
from llmkiln.runtime.draft_cost import DraftCost, _Yield
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.metrics import EngineMetric
from llmkiln.runtime.ngram_drafts import NgramIndex
from llmkiln.runtime.request import BadRequestParams, Request, RequestTimings, SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig
from tests.runtime.conftest import (
    EOS,
    FakeRunner,
    PagedFakeRunner,
    make_paged_scheduler,
    run_to_completion,
)

BS = 4
NGRAM = {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3}


# ---------------------------------------------------------------------------------------------- the drafter
def test_the_drafts_follow_the_first_earlier_occurrence_of_the_longest_suffix():
    idx = NgramIndex(3)
    idx.extend([5, 6, 7, 8, 9, 1, 6, 7, 3, 4, 6, 7])
    # suffix (6, 7): earlier at 1-2 (then 8 9 1 6) and at 6-7 (then 3 4 6 7): the first wins
    assert idx.propose(4) == (8, 9, 1, 6)
    assert idx.propose(2) == (8, 9)
    idx.extend([8])  # suffix (6, 7, 8): only at 1-3, followed by 9 1 6 7
    assert idx.propose(3) == (9, 1, 6)
    idx.extend([2])  # (7, 8, 2), (8, 2), (2): never before
    assert idx.propose(4) == ()
    assert idx.propose(0) == ()


def test_an_index_grown_token_by_token_drafts_as_one_built_at_once():
    rng = np.random.default_rng(3)
    seq = [int(x) for x in rng.integers(0, 6, 300)]
    whole, grown = NgramIndex(2), NgramIndex(2)
    whole.extend(seq)
    for t in seq:
        grown.extend([t])
    assert whole.propose(5) == grown.propose(5) != ()
    grown.extend([1, 2])
    assert len(grown) == 302


def test_a_draft_near_the_end_is_what_there_is():
    idx = NgramIndex(2)
    idx.extend([1, 2, 1, 2])  # (1, 2) at 0-1, followed by 1 2 only
    assert idx.propose(5) == (1, 2)


# ---------------------------------------------------------------------------------------------- verification
def _rows(*argmaxes: int, vocab: int = 8) -> np.ndarray:
    rows = np.zeros((len(argmaxes), vocab), np.float32)
    for i, t in enumerate(argmaxes):
        rows[i, t] = 1.0
    return rows


def test_greedy_verification_takes_drafts_while_they_are_the_argmax():
    greedy = SamplingParams()
    assert accept_drafts(_rows(3, 4, 5), (3, 4), greedy) == [3, 4, 5]  # all, then the model's next
    assert accept_drafts(_rows(3, 1, 5), (3, 4), greedy) == [3, 1]  # the first wrong draft: the model's token
    assert accept_drafts(_rows(2, 4, 5), (3, 4), greedy) == [2]  # none: one token, as a plain decode
    with pytest.raises(ValueError, match="2 drafts need 3 logits rows"):
        accept_drafts(_rows(1, 2), (3, 4), greedy)


def test_a_request_can_turn_speculation_off_or_down_but_not_beyond_the_cap():
    assert SamplingParams(num_speculative_tokens=0).num_speculative_tokens == 0
    with pytest.raises(BadRequestParams, match="num_speculative_tokens must be an integer in"):
        SamplingParams(num_speculative_tokens=17)
    with pytest.raises(BadRequestParams, match="num_speculative_tokens"):
        SamplingParams(num_speculative_tokens=True)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- scheduler
V = 11


def cycle_model(seq: list[int]) -> int:
    """A model that repeats the last 5 tokens (so n-gram drafts are right), except after token 9: then 10."""
    if seq[-1] == 9:
        return 10
    return seq[-5] if len(seq) >= 5 else 3


def _generate_plain(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = cycle_model(seq)
        out.append(t)
        seq.append(t)
    return out


def _requests(prompts: list[list[int]], max_tokens: int, **params) -> list[Request]:
    return [
        Request(f"s{i}", p, SamplingParams(max_tokens=max_tokens, **params), timings=RequestTimings(i))
        for i, p in enumerate(prompts)
    ]


def _one_sequence_cost(row_cost: float) -> DraftCost:
    """A DraftCost that has seen 50 steps of 1 sequence: 10 ms, and row_cost of that per verified row."""
    cost = DraftCost()
    for _ in range(50):
        cost.update(1, 4, 10e6 + 4 * row_cost * 10e6)
        cost.update(1, 0, 10e6)
    return cost


def _drafting_yields_less(cost: DraftCost, *batch_sizes: int) -> DraftCost:
    """cost, with learned yields that put drafting aside at these batch sizes (2 ms a token out with drafts, 1 ms
    without)."""
    for seqs in batch_sizes:
        cost._yields[seqs] = _Yield()
        cost._yields[seqs].add(True, 2e6)
        cost._yields[seqs].add(False, 1e6)
    return cost


def _run(scheduler, runner, requests) -> dict[str, list[int | None]]:
    for r in requests:
        scheduler.add_request(r)
    return run_to_completion(scheduler, runner, max_steps=1000)


@pytest.mark.parametrize("ttft_first", [False, True])
def test_speculative_greedy_output_is_plain_greedy_output_and_every_block_comes_back(ttft_first):
    prompts = [[3, 4, 5, 6, 7] * 3, [4, 5, 6, 7, 8, 4, 5], [5, 6, 7, 8, 9, 5, 6, 7], [8, 3, 8, 3, 8, 3, 8]]
    sched = make_paged_scheduler(
        num_blocks=80, speculative=NGRAM, ttft_first=ttft_first, max_seq_len=64, max_input_len=32
    )
    pool = sched.pool
    assert pool is not None
    free_before = pool.num_available
    runner = PagedFakeRunner(4, 80, BS, model=cycle_model, vocab_size=V)
    out = _run(sched, runner, _requests(prompts, 21, ignore_eos=True))
    assert [out[f"s{i}"] for i in range(4)] == [_generate_plain(p, 21) for p in prompts]
    drafted = [d for plan in runner.steps for d in plan.decodes if d.draft_ids]
    assert drafted, "no decode carried drafts"
    assert sched.num_accepted_tokens > 0 and sched.num_drafted_tokens > sched.num_accepted_tokens
    steps = sum(1 for plan in runner.steps if plan.decodes)
    assert steps < 4 * 20  # fewer decode steps than tokens: drafts were accepted
    assert pool.num_available == free_before  # no block, pin or reservation left behind
    assert pool.num_pinned == 0


def test_drafts_never_run_past_max_tokens_and_an_accepted_eos_ends_the_sequence():
    sched = make_paged_scheduler(num_blocks=40, speculative=NGRAM, max_seq_len=64, max_input_len=32)
    runner = PagedFakeRunner(4, 40, BS, model=cycle_model, vocab_size=V)
    out = _run(sched, runner, _requests([[3, 4, 5, 6, 7] * 2], 7, ignore_eos=True))
    assert out["s0"] == _generate_plain([3, 4, 5, 6, 7] * 2, 7)
    for plan in runner.steps:
        for d in plan.decodes:
            assert d.position + 1 + len(d.draft_ids) <= 10 + 7  # never KV past prompt + max_tokens
    # EOS (2) inside the accepted drafts: the sequence ends at it
    eos_prompt = [3, 4, EOS, 6, 7, 3, 4, EOS, 6, 7, 3]
    sched = make_paged_scheduler(num_blocks=40, speculative=NGRAM, max_seq_len=64, max_input_len=32)
    runner = PagedFakeRunner(4, 40, BS, model=cycle_model, vocab_size=V)
    out = _run(sched, runner, _requests([eos_prompt], 10))
    assert out["s0"] == [4, EOS]
    assert sched.pool is not None and sched.pool.num_pinned == 0


def test_no_drafts_above_max_concurrency_nor_for_a_request_that_turns_them_off():
    prompts = [[3, 4, 5, 6, 7] * 2] * 3
    sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"max_concurrency": 2})
    runner = PagedFakeRunner(4, 80, BS, model=cycle_model, vocab_size=V)
    _run(sched, runner, _requests(prompts, 12, ignore_eos=True))
    for plan in runner.steps:
        if len(plan.decodes) > 2:
            assert not any(d.draft_ids for d in plan.decodes)
    sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM)
    runner = PagedFakeRunner(4, 80, BS, model=cycle_model, vocab_size=V)
    out = _run(sched, runner, _requests(prompts[:1], 12, ignore_eos=True, num_speculative_tokens=0))
    assert out["s0"] == _generate_plain(prompts[0], 12)
    assert not any(d.draft_ids for plan in runner.steps for d in plan.decodes)


def test_a_sequence_whose_drafts_fail_backs_off():
    """A model whose text repeats one token and nothing else (3, x1, 3, x2, ...): after each 3 the drafter proposes
    what followed an earlier 3, always wrong. Where a row costs 0.15 of a token (0.3 with the margin) the
    sequence's acceptance estimate falls below that after a few misses and it stops drafting, trying one draft
    again now and then (its estimate relaxes toward the prior); where rows are nearly free it keeps drafting one."""

    def alternates(seq: list[int]) -> int:
        return 10 + len(seq) // 2 if seq[-1] == 3 else 3

    def drafting_steps(row_cost: float) -> int:
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM, max_seq_len=128, max_input_len=64)
        sched.draft_cost = _one_sequence_cost(row_cost)
        runner = PagedFakeRunner(4, 80, BS, model=alternates, vocab_size=100)
        _run(sched, runner, _requests([[5, 6, 7, 8]], 60, ignore_eos=True))
        assert sched.num_accepted_tokens == 0 < sched.num_drafted_tokens
        return sum(1 for plan in runner.steps for d in plan.decodes if d.draft_ids)

    assert drafting_steps(0.15) <= 10  # (twice 0.15: 0.3 per row) of 59 decode steps, about 30 with a match
    assert drafting_steps(0.005) >= 25


def test_one_token_matches_draft_where_a_verified_row_is_free():
    """min_matching_ngram_size 2 keeps one-token matches out where a row costs something; where the fit prices a
    row as free (runtime.draft_cost.FREE_ROW: one padded sequence) they draft too. The prompt ends in a token that
    occurred before, its two-token suffix never did."""

    def first_decode_drafts(row_cost: float) -> tuple[int, ...]:
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"min_matching_ngram_size": 2})
        sched.draft_cost = _one_sequence_cost(row_cost)
        runner = PagedFakeRunner(4, 80, BS, model=cycle_model, vocab_size=V)
        out = _run(sched, runner, _requests([[3, 8, 7, 6, 3]], 6, ignore_eos=True))
        assert out["s0"] == _generate_plain([3, 8, 7, 6, 3], 6)
        return next(d.draft_ids for plan in runner.steps for d in plan.decodes)

    assert first_decode_drafts(0.15) == ()
    assert first_decode_drafts(0.0) != ()


def test_a_free_row_drafts_everything_its_lookup_found():
    """Where a row is free (one padded sequence: a row under FREE_ROW of a token) a sequence drafts all its lookup
    found, whatever its acceptance estimate (GenAI's prompt lookup does the same); where a row costs something,
    p^n decides. The first decode's suffix (9, 3) never occurred, its last token did: a one-token match (prior
    acceptance 0.4) proposing 8, 7, 6, 9."""

    def first_decode_drafts(row_cost: float) -> tuple[int, ...]:
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"min_matching_ngram_size": 1})
        sched.draft_cost = _one_sequence_cost(row_cost)
        runner = PagedFakeRunner(4, 80, BS, model=lambda seq: 3, vocab_size=V)
        _run(sched, runner, _requests([[3, 8, 7, 6, 9]], 8, ignore_eos=True))
        return next(d.draft_ids for plan in runner.steps for d in plan.decodes)

    assert first_decode_drafts(0.02) == (
        8,
        7,
        6,
        9,
    )  # threshold 0.04: free (p^n would stop at 3: 0.4^4 < 0.04)
    assert first_decode_drafts(0.15) == (8,)  # threshold 0.3: 0.4 >= 0.3 > 0.4^2


def test_a_lone_sequence_on_a_padding_runner_drafts_everything_at_every_step():
    """A runner that pads a lone sequence's runs to 1 + max_draft_len (`expect_drafts` says so: the OpenVINO
    runner) makes its drafts free by construction: the scheduler drafts all the lookup found, from one-token
    matches, whatever the learned fit says a row costs and even where the learned yields would stand aside; with
    two sequences the fit decides again. Same prompt as above: a one-token match proposing 8, 7, 6, 9."""

    def decode_drafts(free: bool, prompts: list[list[int]]) -> list[tuple[int, ...]]:
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"min_matching_ngram_size": 2})
        # threshold 0.3: p^n cuts, one-token matches stay out; and the yields stand aside
        sched.draft_cost = _drafting_yields_less(_one_sequence_cost(0.15), 1, 2)
        sched.lone_drafts_free = free
        runner = PagedFakeRunner(4, 80, BS, model=lambda seq: 3, vocab_size=V)
        _run(sched, runner, _requests(prompts, 8, ignore_eos=True))
        counted.update(free=sched.num_free_drafted_tokens, drafted=sched.num_drafted_tokens)
        return [d.draft_ids for plan in runner.steps for d in plan.decodes]

    counted: dict[str, int] = {}

    assert decode_drafts(True, [[3, 8, 7, 6, 9]])[0] == (8, 7, 6, 9)
    assert counted["free"] == counted["drafted"] > 0  # counted as free drafts (kiln diagnose leaves them)
    assert all(decode_drafts(True, [[3, 8, 7, 6, 9]])[1:])  # every step found a match and drafted it
    assert decode_drafts(False, [[3, 8, 7, 6, 9]])[0] == ()  # the learned yields stand aside
    assert not any(decode_drafts(True, [[3, 8, 7, 6, 9], [3, 8, 7, 6, 9]]))  # two sequences: learned


@pytest.mark.parametrize("ttft_first", [False, True])
def test_a_lone_sequence_beside_prompt_chunks_drafts_at_the_learned_price(ttft_first):
    """Its drafts are free only in a run of its own (padded); beside another request's prompt chunks its rows cost
    like any (the run is no small padded one), so the learned price decides — here: no drafts. Once the prompt is
    done (one output token, then it finishes) the lone sequence drafts again."""
    sched = make_paged_scheduler(
        num_blocks=120,
        speculative=NGRAM | {"min_matching_ngram_size": 2},
        max_prefill_tokens=8,
        max_num_tokens=16,
        ttft_first=ttft_first,
    )
    sched.draft_cost = _drafting_yields_less(_one_sequence_cost(0.15), 1)
    sched.lone_drafts_free = True
    # TTFT-first: the decode rides in the prefill run (the OpenVINO runner's way)
    sched.mix_decodes = ttft_first
    runner = PagedFakeRunner(4, 120, BS, model=lambda seq: 3, vocab_size=V)
    long = [4, 5, 6, 7, 8] * 10  # 50 tokens: several chunks of 8
    reqs = _requests([[3, 8, 7, 6, 9]], 24, ignore_eos=True) + [
        Request("s1", long, SamplingParams(max_tokens=1), timings=RequestTimings(1))
    ]
    _run(sched, runner, reqs)
    beside = [d.draft_ids for p in runner.steps if p.prefills for d in p.decodes if d.request_id == "s0"]
    alone = [d.draft_ids for p in runner.steps if not p.prefills for d in p.decodes]
    assert beside and not any(beside)  # s0 decoded beside s1's chunks, never drafting
    # alone: drafts at every step (the last one has no room left: max_tokens)
    assert alone and all(alone[:-1])


def test_the_engine_tells_the_scheduler_whether_a_lone_sequences_drafts_are_free(monkeypatch):
    from llmkiln.runtime.scheduler import LONE_DRAFTS_FREE_ENV

    config = SchedulerConfig.make(speculative=NGRAM, max_batch_size=2, tokens_per_block=BS)
    runner = PagedFakeRunner(2, 40, BS)
    assert LLMEngine(config, runner).scheduler.lone_drafts_free is False  # the fake runner does not pad
    monkeypatch.setattr(runner, "expect_drafts", lambda k: True)
    monkeypatch.delenv(LONE_DRAFTS_FREE_ENV, raising=False)
    assert LLMEngine(config, runner).scheduler.lone_drafts_free is True
    monkeypatch.setenv(LONE_DRAFTS_FREE_ENV, "0")  # for A/B measurements: priced by the fit
    assert LLMEngine(config, runner).scheduler.lone_drafts_free is False
    monkeypatch.setenv(LONE_DRAFTS_FREE_ENV, "maybe")
    with pytest.raises(BadInput, match=LONE_DRAFTS_FREE_ENV):
        LLMEngine(config, runner)


def test_the_engine_tells_its_runner_the_draft_length():
    config = SchedulerConfig.make(
        speculative=NGRAM | {"max_draft_len": 6}, max_batch_size=2, tokens_per_block=BS
    )
    runner = PagedFakeRunner(2, 40, BS)
    LLMEngine(config, runner)
    assert runner.max_draft_len == 6


def test_drafts_stay_inside_the_steps_token_budget():
    sched = make_paged_scheduler(num_blocks=120, speculative=NGRAM, max_num_tokens=6, max_prefill_tokens=6)
    runner = PagedFakeRunner(4, 120, BS, model=cycle_model, vocab_size=V)
    _run(sched, runner, _requests([[3, 4, 5, 6, 7] * 2] * 4, 10, ignore_eos=True))
    assert all(plan.num_tokens <= 6 for plan in runner.steps if not plan.prefills)


def test_an_engine_whose_runner_cannot_verify_drafts_refuses_speculation():
    config = SchedulerConfig.make(speculative=NGRAM, max_batch_size=2, tokens_per_block=BS)
    with pytest.raises(BadInput, match="cannot verify drafted tokens"):
        LLMEngine(config, FakeRunner(2, 16, BS))


# ---------------------------------------------------------------------------------------------- sampling
VS = 4
# next-token distribution after each token: a Markov chain on 4 tokens, most likely the cycle 0 -> 1 -> 2 -> 3
P = np.array([np.roll([0.1, 0.55, 0.25, 0.1], i) for i in range(VS)])


def markov_logits(seq: list[int]) -> np.ndarray:
    return np.log(P[seq[-1]]).astype(np.float32)


def _sampled_outputs(
    speculative: bool, n: int, tokens: int
) -> tuple[list[tuple[int, ...]], dict[str, float]]:
    config = SchedulerConfig.make(
        speculative=NGRAM if speculative else None,
        max_batch_size=32,
        max_num_tokens=256,
        max_prefill_tokens=64,
        tokens_per_block=BS,
        max_input_len=32,
        max_seq_len=64,
        max_queue_size=n,
    )
    runner = PagedFakeRunner(32, 32 * 8 + 16, BS, model=markov_logits, vocab_size=VS)
    prompt = [0, 1, 2, 3] * 3 + [0]  # drafts: 1 2 3 0 (the chain's likeliest path)
    with LLMEngine(config, runner).start() as engine:
        handles = [
            engine.submit(prompt, SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True))
            for i in range(n)
        ]
        outs = [tuple(h.result(timeout=60)) for h in handles]
        metrics = engine.metrics()
    return outs, metrics


def _expected(tokens: int) -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(tokens):
        probs = {
            seq + (t,): p * float(P[seq[-1] if seq else 0][t]) for seq, p in probs.items() for t in range(VS)
        }
    return probs


def _chi_square(outs: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> tuple[float, int]:
    """Pearson's statistic over the outcomes expected >= 5 times, the rest pooled in one cell; (stat, dof)."""
    n = len(outs)
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        counts[o] = counts.get(o, 0) + 1
    big = [s for s, p in expected.items() if p * n >= 5]
    stat = sum((counts.get(s, 0) - expected[s] * n) ** 2 / (expected[s] * n) for s in big)
    rest_p = 1.0 - sum(expected[s] for s in big)
    rest_n = n - sum(counts.get(s, 0) for s in big)
    stat += (rest_n - rest_p * n) ** 2 / (rest_p * n)
    return stat, len(big)


def _chi2_quantile(dof: int, z: float = 3.719) -> float:
    """The chi-square quantile at the standard normal's z (3.719: 1 - 1e-4), Wilson-Hilferty (within 1% here)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * a**0.5) ** 3


def test_rejection_sampling_keeps_the_output_distribution():
    """4000 seeded requests at temperature 1 on a 4-token Markov model, 4 tokens each, with n-gram drafts (up to 2
    per verification): the 256 outcomes' frequencies fit the chain's exact probabilities (chi-square, p > 1e-4),
    as those of plain sampling do — and drafts were both accepted and rejected."""
    expected = _expected(4)
    spec, metrics = _sampled_outputs(True, 4000, 4)
    assert 0 < metrics[EngineMetric.SPEC_ACCEPTED_TOKENS] < metrics[EngineMetric.SPEC_DRAFTED_TOKENS]
    assert metrics[EngineMetric.SPEC_VERIFICATIONS] > 1000
    plain, _ = _sampled_outputs(False, 4000, 4)
    for outs in (spec, plain):
        stat, dof = _chi_square(outs, expected)
        assert stat < _chi2_quantile(dof), (stat, dof)
    # the test can fail: drafts accepted a little too often skew the outcomes toward the chain's likeliest path
    biased = [(1, 2, 3, 0) if i % 10 == 0 else o for i, o in enumerate(plain)]
    stat, dof = _chi_square(biased, expected)
    assert stat > _chi2_quantile(dof)


# ---------------------------------------------------------------------------------------------- the recipe
def test_the_bundled_ngram_recipe_extends_the_bf16_one_and_speculates_on_openvino_only():
    recipe, _ = load_recipe("smollm2-ov-bf16-ngram")
    assert recipe.backend == "openvino-cpu" and recipe.precision == "bf16"
    assert recipe.speculative is not None and recipe.speculative.method == "ngram"
    config = SchedulerConfig.from_recipe(recipe)
    assert config.speculative == recipe.speculative
    with pytest.raises(
        RecipeError,
        match=r"speculative: this section is only for backend\(s\) trtllm-llmapi, openvino-cpu, not onnx-cpu",
    ):
        load_recipe("smollm2-fp32", {"speculative": NGRAM})  # onnx-cpu: GroupQueryAttention cannot verify
    with pytest.raises(RecipeError, match="min_matching_ngram_size: 4 exceeds max_matching_ngram_size"):
        load_recipe("smollm2-ov-fp32", {"speculative": NGRAM | {"min_matching_ngram_size": 4}})
    with pytest.raises(
        RecipeError, match=r"speculative.min_matching_ngram_size: not used by backend trtllm-llmapi"
    ):
        load_recipe("tiny-trtllm-llmapi-ngram", {"speculative": {"min_matching_ngram_size": 2}})
    with pytest.raises(RecipeError, match="speculative.method: draft_target; backend openvino-cpu drafts by"):
        load_recipe("smollm2-ov-fp32", {"speculative": {"method": "draft_target", "draft_model": "x"}})


def test_speculation_is_a_serve_time_override_of_an_openvino_engine(tmp_path):
    from llmkiln.engine_dir import EngineDir
    from llmkiln.recipe import SERVE_TIME_SECTIONS

    assert "speculative" in SERVE_TIME_SECTIONS
    recipe, _ = load_recipe("smollm2-ov-fp32", {"speculative": NGRAM})
    (tmp_path / "recipe.resolved.yaml").write_text(recipe.to_yaml())
    got = EngineDir(tmp_path).recipe({"speculative": {"max_draft_len": 2}})
    assert got.speculative is not None and got.speculative.max_draft_len == 2


# ---------------------------------------------------------------------------------------------- the cost model
def test_the_draft_cost_is_learned_from_decode_steps():
    """Steps timed as 4 ms + 1 ms per sequence + 0.5 ms per verified row: a row costs 0.5 / ((4 + b) / b) tokens
    of a batch of b — a tenth of a token alone, a third at 8; each batch size has its own fit."""
    from llmkiln.runtime.draft_cost import DEFAULT_THRESHOLD, MARGIN, DraftCost

    cost = DraftCost()
    assert cost.threshold(8) == DEFAULT_THRESHOLD  # nothing measured yet
    rng = np.random.default_rng(0)
    for _ in range(400):
        b, rows = int(rng.integers(1, 9)), int(rng.integers(0, 20))
        cost.update(b, rows, 4e6 + 1e6 * b + 0.5e6 * rows + rng.normal(0, 1e4))
    fit = cost.fit(8)
    assert fit is not None and fit == pytest.approx((12e6, 0.5e6), rel=1e-2)
    assert cost.threshold(1) == pytest.approx(MARGIN * 0.1, rel=1e-2)
    assert cost.threshold(8) == pytest.approx(MARGIN * 0.5 / 1.5, rel=1e-2)
    same = DraftCost()
    for _ in range(20):  # always 4 rows: no slope to fit
        same.update(2, 4, 5e6)
    assert same.fit(2) is None and same.threshold(2) == DEFAULT_THRESHOLD


def test_the_draft_margin_can_be_set_for_measurements(monkeypatch):
    """$LLMKILN_DRAFT_MARGIN replaces MARGIN in the threshold (A/B runs); anything but a number >= 0 is refused."""
    from llmkiln.runtime.draft_cost import MARGIN, MARGIN_ENV, DraftCost

    def threshold() -> float:
        cost = DraftCost()
        for rows in range(16):  # 10 ms a step + 1 ms a row, one sequence: a row is a tenth of a token
            cost.update(1, rows, 10e6 + rows * 1e6)
        return cost.threshold(1)

    monkeypatch.delenv(MARGIN_ENV, raising=False)
    assert DraftCost().margin == MARGIN and threshold() == pytest.approx(MARGIN * 0.1)
    monkeypatch.setenv(MARGIN_ENV, "1")
    assert threshold() == pytest.approx(0.1)
    for bad in ("two", "-1", "nan"):
        monkeypatch.setenv(MARGIN_ENV, bad)
        with pytest.raises(BadInput, match=MARGIN_ENV):
            DraftCost()


def test_a_batch_whose_rows_cost_more_than_drafts_bring_drafts_less():
    """The same requests with a learned row cost of 0.9 tokens: a draft needs p >= 0.9 at its depth, so the
    sequences (prior p = 0.7) draft nothing; with rows nearly free (0.05) they draft up to max_draft_len."""

    def run(row_ns: float) -> int:
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM)
        sched.draft_cost = DraftCost()
        for _ in range(50):
            sched.draft_cost.update(4, 8, 4e6 + 8 * row_ns)
            sched.draft_cost.update(4, 0, 4e6)
        runner = PagedFakeRunner(4, 80, BS, model=cycle_model, vocab_size=V)
        out = _run(sched, runner, _requests([[3, 4, 5, 6, 7] * 2] * 4, 12, ignore_eos=True))
        assert all(out[f"s{i}"] == _generate_plain([3, 4, 5, 6, 7] * 2, 12) for i in range(4))
        return sum(len(d.draft_ids) for plan in runner.steps for d in plan.decodes)

    assert run(0.9e6) == 0
    assert run(0.05e6) > 12


def test_drafting_stands_aside_where_its_steps_yield_less_than_plain_ones():
    """Per batch size, the time per token out of drafting and plain steps: at 8 sequences drafting steps take
    10 ms for 10 tokens (1 ms a token) against plain 6 ms for 8 (0.75): no drafts, but a drafting step every
    EXPLORE_EVERY[True] steps; at 1 sequence drafting yields more (0.5 vs 1 ms a token): drafts, with a plain
    step every EXPLORE_EVERY[False]. Without token counts (update without emitted) nothing is judged."""
    from llmkiln.runtime.draft_cost import EXPLORE_EVERY, DraftCost

    cost = DraftCost()
    assert cost.speculates(8)  # nothing timed: drafting may go ahead
    cost.update(8, 2, 10e6, emitted=10)
    assert cost.speculates(8)  # plain steps not timed yet
    cost.update(8, 0, 6e6, emitted=8)

    def run(
        seqs: int, steps: int, drafting: tuple[int, float, int], plain: tuple[int, float, int]
    ) -> list[bool]:
        """`steps` steps as the cost model decides them, each timed as (rows, ns, tokens out) of its kind."""
        decisions = []
        for _ in range(steps):
            drafts = cost.speculates(seqs)
            decisions.append(drafts)
            rows, ns, emitted = drafting if drafts else plain
            cost.update(seqs, rows, ns, emitted=emitted)
        return decisions

    decisions = run(8, 3 * EXPLORE_EVERY[True], (2, 10e6, 10), (0, 6e6, 8))
    assert sum(decisions) == 3  # one look at drafting in each EXPLORE_EVERY steps
    for _ in range(4):
        cost.update(1, 3, 2e6, emitted=4)
        cost.update(1, 0, 1e6, emitted=1)
    decisions = run(1, 2 * EXPLORE_EVERY[False], (3, 2e6, 4), (0, 1e6, 1))
    assert decisions.count(False) == 2
    blind = DraftCost()
    blind.update(8, 2, 10e6)
    blind.update(8, 0, 6e6)
    assert blind.speculates(8)
