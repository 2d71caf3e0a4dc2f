"""The OpenVINO PagedAttention runner (runtime/openvino_runner.py) on the stories260K openvino-cpu engine: several
requests' prefills on a cached past in one call and mixed decode + prefill steps give the same logits as one at a
time (fp32 and bf16) and as transformers (fp32); served greedy output equals transformers' greedy loop (fp32) and,
in bf16, the same runner's one-request-at-a-time output; prefixes shared by block table give the tokens an engine
without prefix reuse gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import openvino_runner as ov_runner
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.plan import DecodeItem, PrefillChunk, SchedulerOutput
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig
from tests.conftest import STORIES_DIR as STORIES
from tests.conftest import requires_bf16

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow
# batched vs one at a time: fp32 within float rounding; bf16 products change with the batch's blocking
TOL = {"fp32": 1e-4, "bf16": 0.25}


@pytest.fixture(scope="module")
def xml(engine_factory) -> Path:
    path = EngineDir(engine_factory("stories-ov-fp32")).openvino_model()
    assert path is not None
    return path


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(STORIES), dtype=torch.float32).eval()


def _hf_last(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0, -1].numpy()


def _hf_greedy(hf, ids, n) -> list[int]:
    out = []
    for _ in range(n):
        out.append(int(_hf_last(hf, ids + out).argmax()))
    return out


BS = 32  # OpenVINO's block: kv_cache.tokens_per_block of every openvino-cpu engine


def _runner(xml, precision="fp32", store=2**20):
    return ov_runner.OpenVinoPagedRunner(xml, 8, 512, BS, store, precision=precision, threads=1)


def _tables(runner, *sequences: str) -> dict[str, tuple[int, ...]]:
    """Block tables by hand, as the scheduler would give them: sequence i owns blocks [i*bps, (i+1)*bps)."""
    bps = runner.blocks_per_slot
    return {rid: tuple(range(i * bps, (i + 1) * bps)) for i, rid in enumerate(sequences)}


def _steps(xml, precision: str, batched: bool):
    rng = np.random.default_rng(1)
    prefix = rng.integers(3, 500, 120).tolist()
    sufs = [rng.integers(3, 500, n).tolist() for n in (30, 7, 51)]
    r = _runner(xml, precision)
    tables = _tables(r, "r0", "r1", "r2", "f")
    for s in range(3):
        pre = {"p": tables[f"r{s}"]}
        r.execute(SchedulerOutput(prefills=[PrefillChunk("p", s, 0, tuple(prefix), False)], block_tables=pre))
    P = len(prefix)
    chunks = [PrefillChunk(f"r{s}", s, P, tuple(x), True) for s, x in enumerate(sufs)]
    first: dict = {}
    for plan in (
        [SchedulerOutput(prefills=chunks, block_tables=tables)]
        if batched
        else [SchedulerOutput(prefills=[c], block_tables=tables) for c in chunks]
    ):
        first.update(r.execute(plan))
    toks = {s: int(first[f"r{s}"].argmax()) for s in range(3)}
    decodes = [DecodeItem(f"r{s}", s, toks[s], P + len(sufs[s])) for s in range(3)]
    fresh = PrefillChunk("f", 3, 0, tuple(sufs[0]), True)
    plans = (
        [SchedulerOutput(prefills=[fresh], decodes=decodes, block_tables=tables)]
        if batched
        else [SchedulerOutput(decodes=[d], block_tables=tables) for d in decodes]
        + [SchedulerOutput(prefills=[fresh], block_tables=tables)]
    )
    second: dict = {}
    for plan in plans:
        second.update(r.execute(plan))
    return prefix, sufs, toks, first, second


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=requires_bf16)])
def test_batched_equals_one_at_a_time(xml, hf, precision):
    prefix, sufs, toks, first_b, second_b = _steps(xml, precision, True)
    _, _, toks_a, first_a, second_a = _steps(xml, precision, False)
    assert toks == toks_a
    for key in first_a:
        assert np.max(np.abs(first_b[key] - first_a[key])) <= TOL[precision]
    for key in second_a:
        assert np.max(np.abs(second_b[key] - second_a[key])) <= TOL[precision]
    if precision != "fp32":
        return
    for s, suf in enumerate(sufs):
        assert np.max(np.abs(first_b[f"r{s}"] - _hf_last(hf, prefix + suf))) <= 1e-3
        assert np.max(np.abs(second_b[f"r{s}"] - _hf_last(hf, prefix + suf + [toks[s]]))) <= 1e-3
    assert np.max(np.abs(second_b["f"] - _hf_last(hf, sufs[0]))) <= 1e-3


def test_run_padding_leaves_the_sequences_logits_as_they_are(xml):
    """A decode padded to the recent runs' token count (runtime/run_padding.py: a sequence of its own in the
    block beyond the manager's) gives the logits an unpadded run gives, and writes no block a request owns."""
    rng = np.random.default_rng(3)
    prompt = tuple(rng.integers(3, 500, 40).tolist())
    out = {}
    for limit in (0, 4):
        r = _runner(xml)
        try:
            r.padding = ov_runner.RunPadding(limit=limit)
            tables = _tables(r, "a")
            r.execute(SchedulerOutput(prefills=[PrefillChunk("a", 0, 0, prompt, False)], block_tables=tables))
            drafts = DecodeItem("a", 0, 7, 40, draft_ids=(8, 9, 10))
            r.execute(SchedulerOutput(decodes=[drafts], block_tables=tables))
            before = [k.copy() for k in r.k]
            step = SchedulerOutput(decodes=[DecodeItem("a", 0, 11, 40)], block_tables=tables)
            out[limit] = r.execute(step)["a"].copy()
            assert r.padding.padded_runs == (1 if limit else 0)
            assert r._pad_block == r.num_blocks and r.block_memory.num_blocks == r.num_blocks
            for b, a in zip(
                before, r.k, strict=True
            ):  # only block 1 (position 40) and the padding block change
                changed = {int(i) for i in np.flatnonzero((b != a).reshape(len(b), -1).any(axis=1))}
                assert changed <= {1, r._pad_block}
        finally:
            r.close()  # OpenVINO objects freed on this thread, not by a later garbage collection elsewhere
    assert np.max(np.abs(out[0] - out[4])) <= 1e-5


def test_compile_extra_reaches_the_compiled_model_and_the_report(xml):
    """A probe's compile properties (experiments.shared_prefix_runs, PERF_COUNT) are in force on the compiled
    graph and named in what the engine reports; without them the runner compiles as before."""
    r = ov_runner.OpenVinoPagedRunner(
        xml, 2, 128, BS, 0, precision="fp32", threads=1, compile_extra={"PERF_COUNT": True}
    )
    plain = _runner(xml)
    try:
        assert r.compiled.get_property("PERF_COUNT") == "YES"  # how OpenVINO 2026.4 reads it back
        assert plain.compiled.get_property("PERF_COUNT") == "NO"
        assert r.runtime_settings["compile_extra"] == "PERF_COUNT=True"
        assert "compile_extra" not in plain.runtime_settings
    finally:
        r.close()
        plain.close()


SMALL = {"max_batch_size": 4, "max_num_tokens": 64, "max_prefill_tokens": 16, "max_queue_size": 32}


@pytest.mark.parametrize(
    "extra",
    [{}, {"chunked_prefill": False}, {"prefix_reuse": False}, {"ttft_first": True, "tpot_slo_ms": 0.01}],
    ids=["mixed+reuse+chunk", "mixed+reuse", "no reuse", "ttft-first"],
)
def test_served_greedy_equals_transformers(xml, hf, extra):
    rng = np.random.default_rng(2)
    system = rng.integers(3, 500, 40).tolist()
    prompts = [system + rng.integers(3, 500, n).tolist() for n in (5, 12, 1, 9)] + [
        rng.integers(3, 500, n).tolist() for n in (6, 14)
    ]
    expected = [_hf_greedy(hf, p, 8) for p in prompts]
    config = SchedulerConfig.make(
        eos_token_ids=(2,), tokens_per_block=BS, max_bytes=2**20, max_seq_len=512, **{**SMALL, **extra}
    )
    kv = config.kv_cache
    runner = ov_runner.OpenVinoPagedRunner(
        xml, 4, 512, BS, kv.max_bytes if kv.prefix_reuse else 0, precision="fp32", threads=1
    )
    eng = LLMEngine(config, runner)
    try:
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        first = eng.submit(prompts[0], params)
        while not first.finished:
            eng.step()
        assert first.result(timeout=60) == expected[0]
        handles = [eng.submit(p, params) for p in prompts[1:]]
        eng.start()
        for h, want in zip(handles, expected[1:], strict=True):
            assert h.result(timeout=60) == want
    finally:
        eng.shutdown()


@requires_bf16
def test_served_bf16_greedy_equals_alone(xml):
    """bf16: eight requests on a shared prefix served together give the tokens each gets alone."""
    rng = np.random.default_rng(3)
    system = rng.integers(3, 500, 48).tolist()
    prompts = [system + rng.integers(3, 500, n).tolist() for n in (5, 12, 1, 9, 30, 2, 17, 8)]
    config = SchedulerConfig.make(
        eos_token_ids=(2,), tokens_per_block=BS, max_bytes=2**20, max_seq_len=512, **SMALL
    )
    params = SamplingParams(max_tokens=8, ignore_eos=True)

    def engine():
        runner = ov_runner.OpenVinoPagedRunner(xml, 4, 512, BS, 2**20, precision="bf16")
        return LLMEngine(config, runner)

    alone = []
    for p in prompts:
        eng = engine()
        h = eng.submit(p, params)
        while not h.finished:
            eng.step()
        alone.append(h.result(timeout=60))
        eng.shutdown()
    eng = engine()
    try:
        handles = [eng.submit(p, params) for p in prompts]
        eng.start()
        together = [h.result(timeout=60) for h in handles]
    finally:
        eng.shutdown()
    same = sum(a == b for a, b in zip(alone, together, strict=True))
    assert same == len(prompts), (alone, together)


def test_prefix_hits_share_blocks_and_give_what_no_reuse_gives(xml):
    """Requests on one system prompt share its whole blocks by block table (one copy of the prefix for all of
    them); partial overlaps compute the rest; the tokens equal those of an engine without prefix reuse."""
    rng = np.random.default_rng(4)
    system = rng.integers(3, 500, 75).tolist()  # 2 whole OpenVINO blocks of 32 + 11 tokens
    prompts = [system + rng.integers(3, 500, n).tolist() for n in (3, 9, 20, 1, 14)]
    prompts += [system[:40] + rng.integers(3, 500, 12).tolist(), system[:33] + [7, 8, 9]]  # partial overlaps
    params = SamplingParams(max_tokens=6, ignore_eos=True)

    def run(reuse: bool):
        config = SchedulerConfig.make(
            eos_token_ids=(2,),
            tokens_per_block=BS,
            max_bytes=2**20,
            max_seq_len=512,
            prefix_reuse=reuse,
            **SMALL,
        )
        runner = ov_runner.OpenVinoPagedRunner(xml, 4, 512, BS, 2**20, precision="fp32", threads=1)
        eng = LLMEngine(config, runner)
        shared_refs = []
        try:
            first = eng.submit(prompts[0], params)
            while not first.finished:
                eng.step()
            out = [first.result(timeout=60)]
            handles = [eng.submit(p, params) for p in prompts[1:]]
            while not all(h.finished for h in handles):
                eng.step()
                shared_refs.append(max((b.ref_count for b in eng.kv_manager.blocks), default=0))
            out += [h.result(timeout=60) for h in handles]
            hits = eng.metrics()["prefix_cache_hits"]
        finally:
            eng.shutdown()
        return out, hits, max(shared_refs)

    shared_out, hits, most_refs = run(True)
    plain_out, _, plain_refs = run(False)
    assert shared_out == plain_out
    assert hits >= 4
    assert most_refs >= 3  # one block of the system prompt in three or more running requests' tables
    assert plain_refs == 1
