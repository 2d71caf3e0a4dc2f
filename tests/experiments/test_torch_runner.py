"""The torch path (experiments/torch_runner.py) on stories260K: every attention formulation equals transformers'
fp32 forward; several requests' suffix prefills on a cached past in one forward and mixed decode + prefill steps
give the same logits as one at a time; served greedy output equals the onnxruntime reference loop (fp32)."""

from __future__ import annotations

import numpy as np
import pytest

from llmkiln.runtime.plan import DecodeItem, PrefillChunk, SchedulerOutput
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.simple import SimpleGenerator

torch = pytest.importorskip("torch")
tr = pytest.importorskip("experiments.torch_runner")

from tests.conftest import STORIES_DIR, requires_bf16  # noqa: E402
from tests.runtime.test_engine_model import MAX_TOKENS, OTHERS, SYSTEM, TAILS, _all_free, _overrides  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(STORIES_DIR), dtype=torch.float32).eval()


def _hf_last(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].numpy()


def _runner(dtype="fp32", min_prefix=8):
    return tr.TorchRunner(
        STORIES_DIR, 8, 512, 16, 2**20, dtype=dtype, threads=1, cascade_min_prefix=min_prefix
    )


def _prompts():
    rng = np.random.default_rng(1)
    prefix = rng.integers(3, 500, 120).tolist()
    return prefix, [rng.integers(3, 500, n).tolist() for n in (30, 7, 51)]


def _prefill(runner, rid, slot, start, ids):
    return runner.execute(SchedulerOutput(prefills=[PrefillChunk(rid, slot, start, tuple(ids), True)]))[rid]


def _suffix_steps(dtype, batched):
    """Prefix in slots 0-2 (one run each), then the three suffixes (one plan, or one plan each), then one
    mixed step: a decode token for rows 0 and 1 beside a fresh prompt's prefill in slot 3, then a decode step."""
    runner = _runner(dtype)
    prefix, sufs = _prompts()
    for s in range(3):
        _prefill(runner, "p", s, 0, prefix)
    P = len(prefix)
    chunks = [PrefillChunk(f"r{s}", s, P, tuple(x), True) for s, x in enumerate(sufs)]
    if batched:
        first = runner.execute(SchedulerOutput(prefills=chunks))
    else:
        first = {}
        for c in chunks:
            first.update(runner.execute(SchedulerOutput(prefills=[c])))
    toks = {s: int(first[f"r{s}"].argmax()) for s in range(3)}
    decodes = [DecodeItem(f"r{s}", s, toks[s], P + len(sufs[s])) for s in range(3)]
    fresh = PrefillChunk("f", 3, 0, tuple(sufs[0]), True)
    if batched:
        second = runner.execute(SchedulerOutput(prefills=[fresh], decodes=decodes))
    else:
        second = {}
        for d in decodes:
            second.update(runner.execute(SchedulerOutput(decodes=[d])))
        second.update(runner.execute(SchedulerOutput(prefills=[fresh])))
    return prefix, sufs, toks, first, second


@pytest.mark.parametrize("dtype", ["fp32", pytest.param("bf16", marks=requires_bf16)])
def test_batched_equals_one_at_a_time(dtype, hf):
    prefix, sufs, toks, first_b, second_b = _suffix_steps(dtype, True)
    _, _, toks_a, first_a, second_a = _suffix_steps(dtype, False)
    # bf16 logits are bf16-rounded (step 1/16 near 16) and differently blocked products round differently
    tol = 1e-4 if dtype == "fp32" else 0.25
    for key in first_a:
        assert np.max(np.abs(first_b[key] - first_a[key])) <= tol, key
        assert first_b[key].argmax() == first_a[key].argmax(), key
    for key in second_a:
        assert np.max(np.abs(second_b[key] - second_a[key])) <= tol, key
    if dtype == "fp32":
        assert toks == toks_a
        for s, suf in enumerate(sufs):
            assert np.max(np.abs(first_b[f"r{s}"] - _hf_last(hf, prefix + suf))) <= 1e-4
            ref = _hf_last(hf, prefix + suf + [toks[s]])
            assert np.max(np.abs(second_b[f"r{s}"] - ref)) <= 1e-4
        assert np.max(np.abs(second_b["f"] - _hf_last(hf, sufs[0]))) <= 1e-4


def test_attention_formulations_equal_transformers(hf):
    m = tr.TorchLlama(STORIES_DIR, "fp32", num_slots=4, max_len=512)
    prefix, sufs = _prompts()
    P = len(prefix)
    m.forward(
        torch.tensor(prefix),
        torch.arange(P),
        tr.SegmentAttention([tr.Segment(0, 0, P, 0)]),
        torch.tensor([0]),
    )
    for layer in range(m.num_layers):
        m.k[layer][1:] = m.k[layer][0]
        m.v[layer][1:] = m.v[layer][0]
    segs, t0 = [], 0
    for s, x in enumerate(sufs):
        segs.append(tr.Segment(s, P, len(x), t0))
        t0 += len(x)
    flat = torch.tensor(sum(sufs, []))
    pos = torch.cat([torch.arange(P, P + len(x)) for x in sufs])
    last = torch.tensor([s.t0 + s.n - 1 for s in segs])
    refs = [_hf_last(hf, prefix + x) for x in sufs]
    for att in (
        tr.SegmentAttention(segs),
        tr.BlockDiagonalAttention(segs, m.group, m.dtype),
        tr.CascadeAttention(segs, 0, P),
    ):
        out = m.forward(flat, pos, att, last).numpy()
        for i, ref in enumerate(refs):
            assert np.max(np.abs(out[i] - ref)) <= 1e-4, type(att).__name__


@pytest.fixture(scope="module")
def stories_engine(engine_factory):
    return engine_factory("stories-fp32")


@pytest.fixture(scope="module")
def alone(stories_engine):
    gen = SimpleGenerator(stories_engine, intra_op_threads=1)
    prompts = [gen.encode(SYSTEM + t) for t in TAILS] + [gen.encode(o) for o in OTHERS]
    return prompts, [list(gen.generate(p, MAX_TOKENS, stop_at_eos=False)) for p in prompts]


SMALL = {"max_batch_size": 4, "max_num_tokens": 64, "max_prefill_tokens": 16, "max_queue_size": 32}


@pytest.mark.parametrize(
    "variant",
    [
        {"scheduler": SMALL},  # decode-first: several chunks with pasts + decodes in one forward
        {"scheduler": {**SMALL, "chunked_prefill": False}},
        {"scheduler": SMALL, "kv_cache": {"prefix_reuse": False}},
        {"scheduler": {**SMALL, "ttft_first": True, "tpot_slo_ms": 0.01}},
    ],
    ids=["mixed+reuse+chunk", "mixed+reuse", "mixed, no reuse", "ttft-first"],
)
def test_served_greedy_equals_reference_loop(stories_engine, alone, variant):
    prompts, expected = alone
    eng = tr.load_torch_engine(stories_engine, STORIES_DIR, "fp32", _overrides(variant))
    eng.runner.cascade_min_prefix = 16  # the shared prompt here is ~40 tokens: exercise the cascade path
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
        first = eng.submit(prompts[0], params)
        while not first.finished:
            eng.step()
        assert first.result(timeout=60) == expected[0]
        handles = [eng.submit(p, params) for p in prompts[1:]]
        eng.start()
        for h, want in zip(handles, expected[1:], strict=True):
            assert h.result(timeout=60) == want
        _all_free(eng)
    finally:
        eng.shutdown()
