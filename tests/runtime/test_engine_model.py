"""The runtime on the real stories260K engines (onnxruntime fp32 and int8, OpenVINO fp32): batching, prefix reuse
and chunking change nothing in the greedy token ids — the OpenVINO engine's equal the onnxruntime fp32 reference
loop's; errors are clear and leave every slot and block free."""

from __future__ import annotations

import numpy as np
import pytest

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import BadRequestParams, PromptTooLong, QueueFull, SamplingParams
from llmkiln.runtime.simple import SimpleGenerator

pytestmark = pytest.mark.slow

SYSTEM = (
    "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her "
    "friends. One day she saw a big red ball"
)
TAILS = [
    " and she ran to get it.",
    ". It was shiny and round and she wanted to play with it all day long with her dog.",
    "",
    " near the tree. Her mom said",
    " and a small cat",
]
OTHERS = [
    "Tom had a toy car.",
    "The dog ran fast.",
    "Sue saw a big cat.",
    "The sun was hot and the bird sang a happy song in the tall green tree.",
]
MAX_TOKENS = 12
# small budgets so chunks interleave with decodes and several fresh prompts batch together
SMALL = {"max_batch_size": 4, "max_num_tokens": 48, "max_prefill_tokens": 16, "max_queue_size": 32}
VARIANTS = {
    "inflight+reuse+chunk": {"scheduler": SMALL},
    "inflight+reuse, no chunk": {"scheduler": {**SMALL, "chunked_prefill": False}},
    "inflight, no reuse, chunk": {"scheduler": SMALL, "kv_cache": {"prefix_reuse": False}},
    "inflight, no reuse, no chunk": {
        "scheduler": {**SMALL, "chunked_prefill": False, "max_batch_size": 8},
        "kv_cache": {"prefix_reuse": False},
    },
    "static+reuse+chunk": {"scheduler": {**SMALL, "batching": "static", "static_batch_timeout_ms": 5}},
    # a tiny TPOT bound: prefill and decode steps alternate, so both paths of the TTFT-first mode run
    "ttft-first+reuse+chunk": {"scheduler": {**SMALL, "ttft_first": True, "tpot_slo_ms": 0.01}},
}


def _overrides(extra: dict) -> dict:
    out = {"kv_cache": {"max_bytes": 4 * 2**20}, "scheduler": {"intra_op_threads": 1}}
    for key, value in extra.items():
        out[key] = {**out.get(key, {}), **value}
    return out


def _all_free(eng: LLMEngine) -> None:
    m = eng.metrics()
    assert m["num_running"] == 0 and m["queue_length"] == 0
    assert m["num_free_slots"] == eng.config.scheduler.max_batch_size
    if eng.block_store is not None:
        assert m["kv_blocks_pinned"] == 0
        assert m["kv_blocks_free"] == m["kv_blocks_total"]
        eng.block_store.check_invariants()


@pytest.fixture(scope="module", params=["stories-fp32", "stories-int8", "stories-ov-fp32"])
def engine_dir(request, engine_factory):
    return engine_factory(request.param)


@pytest.fixture(scope="module")
def alone(engine_dir, engine_factory):
    """Each prompt alone through the simple one-sequence generator (no batching, no cache, no IOBinding); for
    the OpenVINO engine, the onnxruntime fp32 engine's (the same weights)."""
    ref = engine_dir if EngineDir(engine_dir).has_onnx_model() else engine_factory("stories-fp32")
    gen = SimpleGenerator(ref, intra_op_threads=1)
    prompts = [gen.encode(SYSTEM + t) for t in TAILS] + [gen.encode(o) for o in OTHERS]
    return prompts, [list(gen.generate(p, MAX_TOKENS, stop_at_eos=False)) for p in prompts]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_concurrent_greedy_equals_alone(engine_dir, alone, variant):
    prompts, expected = alone
    eng = load_engine(engine_dir, _overrides(VARIANTS[variant]))
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        # the first request warms the prefix cache; the rest arrive together (queued before the thread starts)
        first = eng.submit(prompts[0], params)
        while not first.finished:  # static batching: step() idles until the batch timeout
            eng.step()
        assert first.result(timeout=60) == expected[0]
        handles = [eng.submit(p, params) for p in prompts[1:]]
        eng.start()
        for h, want in zip(handles, expected[1:], strict=True):
            assert h.result(timeout=60) == want, variant
        m = eng.metrics()
        if "reuse" in variant and "no reuse" not in variant:
            assert m["prefix_cache_hits"] >= 3
            assert handles[0].num_cached_tokens > 0
        else:
            assert all(h.num_cached_tokens == 0 for h in handles)
        _all_free(eng)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("recipe", ["stories-fp32", "stories-ov-fp32"])
def test_prefix_hit_logits_match_full_prefill(engine_factory, recipe):
    engine_dir = engine_factory(recipe)
    eng = load_engine(engine_dir, _overrides({}))
    captured: dict[str, np.ndarray] = {}
    execute = eng.runner.execute

    def recording(plan, trace=None):
        out = execute(plan)
        for chunk in plan.prefills:
            if chunk.sample:
                captured[chunk.request_id] = out[chunk.request_id].copy()
        return out

    eng.runner.execute = recording
    prefix = eng.encode(SYSTEM + TAILS[1])[:48]  # exactly 3 blocks of 16
    assert len(prefix) == 48
    a = prefix + eng.encode(" and she ran.")[1:]
    b = prefix + eng.encode(" but the dog was sad and wanted to go home.")[1:]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    ha = eng.submit(a, params, request_id="a")
    while eng.step():
        pass
    # 1) slot runner: a's slot still holds its prompt, b starts on the whole common prefix there, no block copies;
    # paged runner: b's table starts with a's published whole blocks (shared, not copied)
    bs = eng.config.kv_cache.tokens_per_block
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    reused = common // bs * bs if eng.runner.paged_kv else common
    computed_before = eng.metrics()["prompt_tokens_computed"]
    hb = eng.submit(b, params, request_id="b")
    while eng.step():
        pass
    assert ha.result(timeout=1) and hb.result(timeout=1)
    assert common >= 48 and hb.num_cached_tokens == reused >= 32
    assert eng.metrics()["prompt_tokens_computed"] - computed_before == len(b) - reused
    # 2) another prompt takes that slot: the same b now loads its cached blocks (b's own, saved) from the store
    other = eng.submit(eng.encode(OTHERS[3]), params, request_id="other")
    while eng.step():
        pass
    hb2 = eng.submit(b, params, request_id="b2")
    while eng.step():
        pass
    assert other.result(timeout=1) and hb2.result(timeout=1) == hb.result()
    assert hb2.num_cached_tokens == (len(b) - 1) // bs * bs >= 32
    full = SimpleGenerator(engine_factory("stories-fp32")).prompt_logits(b)[-1]
    tol = 1e-5 if recipe == "stories-fp32" else 1e-4  # OpenVINO vs onnxruntime: other kernels, same fp32 math
    assert np.max(np.abs(captured["b"] - full)) <= tol
    assert np.max(np.abs(captured["b2"] - full)) <= tol
    _all_free(eng)
    eng.shutdown()


def test_rejections_and_cancel_leave_everything_free(engine_factory):
    engine_dir = engine_factory("stories-fp32")
    eng = load_engine(
        engine_dir,
        _overrides(
            {"scheduler": {"max_batch_size": 2, "max_queue_size": 3}, "limits": {"max_input_len": 40}}
        ),
    )
    prompt = eng.encode(SYSTEM)
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    # not started: requests stay queued, so the bound is reached deterministically
    held = [eng.submit(prompt[:20], params) for _ in range(3)]
    with pytest.raises(QueueFull, match="max_queue_size"):
        eng.submit(prompt[:20], params)
    with pytest.raises(PromptTooLong, match="max_input_len"):
        eng.submit(prompt[:41], params)
    with pytest.raises(PromptTooLong, match="max_seq_len"):
        eng.submit(prompt[:20], SamplingParams(max_tokens=eng.config.limits.max_seq_len))
    with pytest.raises(BadRequestParams, match="temperature"):
        SamplingParams(temperature=-1.0)  # refused before it reaches any engine
    with pytest.raises(BadRequestParams, match="out of range"):
        eng.submit([1, 10_000], params)
    assert eng.metrics()["requests_rejected"] == 4
    eng.start()
    events = []
    for ev in held[0]:
        events.append(ev)
        if len(events) == 3:
            held[0].cancel()
            held[2].cancel()
    assert events[-1].finished and events[-1].finish_reason == "cancelled" and events[-1].token_id is None
    assert held[2].finish_reason == "cancelled" or held[2].wait(10)
    held[1].cancel()
    for h in held:
        assert h.wait(timeout=30)
        assert h.finish_reason == "cancelled"
    # after cancels, the queue admits again and a normal request completes
    assert len(eng.submit(prompt[:20], SamplingParams(max_tokens=3)).result(timeout=30)) >= 1
    _all_free(eng)
    assert eng.metrics()["requests_cancelled"] == 3
    eng.shutdown()


@pytest.mark.parametrize("recipe", ["stories-fp32", "stories-int8"])
def test_last_logits_rewrite_matches_full_graph(engine_factory, recipe):
    engine_dir = engine_factory(recipe)
    from llmkiln.runtime.plan import PrefillChunk, SchedulerOutput
    from llmkiln.runtime.runner import OnnxRunner

    info = EngineDir(engine_dir).genai_config()
    runners = [OnnxRunner(engine_dir, info, 4, 128, 16, 0, last_logits_only=flag) for flag in (True, False)]
    assert runners[0].last_only and not runners[1].last_only
    plan = SchedulerOutput(
        prefills=[
            PrefillChunk("a", 0, 0, tuple(range(5, 30)), True),  # fresh prompts batch together (padded)
            PrefillChunk("b", 1, 0, tuple(range(40, 62)), True),
            PrefillChunk("c", 2, 0, tuple(range(70, 75)), True),
        ]
    )
    got, want = (r.execute(plan) for r in runners)
    for rid in "abc":
        np.testing.assert_allclose(got[rid], want[rid], atol=1e-5)
