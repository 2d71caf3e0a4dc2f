"""Drafts from earlier requests' outputs (runtime.draft_history, recipe speculative.history_tokens): the most
frequent continuation of the longest known suffix, bounded, and — in the scheduler — used only where a row is
free and the sequence's own lookup found one token or nothing, with greedy output unchanged."""

from __future__ import annotations

import pytest

from llmkiln.errors import RecipeError
from llmkiln.recipe import load_recipe
from llmkiln.runtime.draft_cost import FREE_ROW, DraftCost
from llmkiln.runtime.draft_history import DraftHistory
from llmkiln.runtime.request import Request, RequestTimings, SamplingParams
from llmkiln.runtime.scheduler import Scheduler
from tests.runtime.conftest import PagedFakeRunner, make_paged_scheduler, run_to_completion

BS = 4
NGRAM = {"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3, "min_matching_ngram_size": 2}


def test_a_draft_walks_the_most_frequent_continuation_of_the_longest_known_suffix():
    h = DraftHistory(1000, max_ngram=3)
    h.record([0], [1, 2, 3, 4])
    h.record([0], [1, 2, 3, 5])
    h.record([0], [1, 2, 3, 5])
    h.record([7], [2, 6])
    assert h.match([9, 0], 4) == ((1, 2, 3, 5), 1)  # 5 followed (1, 2, 3) twice, 4 once
    assert h.match([9, 0, 1], 2) == ((2, 3), 2)  # k drafts at most; matched on (0, 1)
    # the longest suffix decides: after (7, 2) came 6, after 2 alone mostly 3
    assert h.match([7, 2], 1) == ((6,), 2)
    assert h.match([8, 2], 1) == ((3,), 1)
    assert h.match([8, 2], 1, min_ngram=2) == ((), 0)  # (8, 2) never seen
    assert h.match([42], 4) == ((), 0)
    assert h.match([], 4) == ((), 0)


def test_the_history_forgets_its_oldest_outputs_beyond_its_size():
    h = DraftHistory(6, max_ngram=2)
    h.record([0], [1, 2, 3])
    h.record([0], [1, 4, 5])
    assert len(h) == 6 and h.match([0, 1], 1) == ((2,), 2)  # a tie: the first recorded
    h.record([0], [1, 4, 6])  # the first output goes, its counts with it
    assert len(h) == 6
    assert h.match([0, 1], 2) == ((4, 5), 2)
    assert h.match([2], 1) == ((), 0)
    h.record([0], [])  # nothing to record
    assert len(h) == 6
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        DraftHistory(0)
    unigrams = DraftHistory(10, max_ngram=1)
    unigrams.record([7, 0], [1, 2])
    assert unigrams.match([0], 2) == ((1, 2), 1)  # a reply's first token follows its prompt's last one


# a model whose reply is the same phrase whatever the prompt (after the prompt's last token, 0): a sequence's own
# text never predicts it, earlier replies do
PHRASE = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
V = 11


def phrase_model(seq: list[int]) -> int:
    start = len(seq) - 1 - seq[::-1].index(0)
    return PHRASE[(len(seq) - start - 1) % len(PHRASE)]


def _serve(sched, runner, prompts: list[list[int]], tag: str) -> dict[str, list[int | None]]:
    for i, p in enumerate(prompts):
        sched.add_request(
            Request(f"{tag}{i}", p, SamplingParams(max_tokens=10, ignore_eos=True), timings=RequestTimings(i))
        )
    return run_to_completion(sched, runner, max_steps=200)


def test_a_lone_sequence_drafts_from_earlier_replies_where_its_own_text_has_nothing():
    def second_reply_steps(history_tokens: int) -> tuple[int, Scheduler]:
        """Steps of a second request, the first one's reply recorded before it (with history_tokens > 0)."""
        sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"history_tokens": history_tokens})
        sched.lone_drafts_free = True
        runner = PagedFakeRunner(4, 80, BS, model=phrase_model, vocab_size=V)
        assert _serve(sched, runner, [[10, 9, 0]], "a") == {"a0": PHRASE}
        before = len(runner.steps)
        assert _serve(sched, runner, [[5, 0]], "b") == {"b0": PHRASE}  # output unchanged
        return len(runner.steps) - before, sched

    steps_off, off = second_reply_steps(0)
    steps_on, on = second_reply_steps(4096)
    assert off.draft_history is None and off.num_history_drafted_tokens == 0
    # the phrase is known from the first reply (after its prompt's last token, 0): 4 drafts a step, all right
    assert on.num_history_drafted_tokens > 0
    assert on.num_history_accepted_tokens == on.num_history_drafted_tokens
    assert steps_on < steps_off
    assert on.num_free_drafted_tokens >= on.num_history_drafted_tokens  # history drafts are free drafts
    assert on.draft_history is not None and len(on.draft_history) == 2 * len(PHRASE)  # both replies recorded


def test_two_decoding_sequences_do_not_draft_from_the_history():
    """Their rows are not padded: even where the learned price of a row is under FREE_ROW (a memory-bound batch,
    nearly free) the history's drafts (mostly wrong, acceptance not tracked per source) stay out."""
    sched = make_paged_scheduler(num_blocks=80, speculative=NGRAM | {"history_tokens": 4096})
    sched.lone_drafts_free = True
    cheap = DraftCost()  # two sequences: 10 ms a step, a verified row 0.1% of that
    for _ in range(50):
        cheap.update(2, 4, 10e6 + 4 * 0.001 * 10e6)
        cheap.update(2, 0, 10e6)
    assert cheap.threshold(2) <= FREE_ROW
    sched.draft_cost = cheap
    runner = PagedFakeRunner(4, 80, BS, model=phrase_model, vocab_size=V)
    _serve(sched, runner, [[10, 9, 0]], "a")
    out = _serve(sched, runner, [[5, 0], [6, 0]], "b")
    assert out == {"b0": PHRASE, "b1": PHRASE}
    assert sched.num_history_drafted_tokens == 0


def test_history_tokens_is_an_ngram_field_of_openvino_cpu():
    recipe, _ = load_recipe("smollm2-ov-fp32", {"speculative": NGRAM | {"history_tokens": 2048}})
    assert recipe.speculative is not None and recipe.speculative.history_tokens == 2048
    with pytest.raises(RecipeError, match=r"speculative.history_tokens: not used by backend trtllm-llmapi"):
        load_recipe("tiny-trtllm-llmapi-ngram", {"speculative": {"history_tokens": 2048}})
    with pytest.raises(RecipeError, match="history_tokens"):
        load_recipe("smollm2-ov-fp32", {"speculative": NGRAM | {"history_tokens": -1}})
