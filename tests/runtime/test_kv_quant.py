"""Quantized prefix-block storage: bounded round-trip error, 2-4x more tokens in the same byte budget,
calibrated scales, and a real engine serving prefix hits from an int8/fp8/fp16 store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmkiln.errors import BadInput
from llmkiln.kv_scales import KvScales
from llmkiln.runtime.kv_quant import BlockData, bytes_per_block, dequantize, quantize

L, H, T, D = 5, 4, 16, 8


def _kv(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, 2, H, T, D)).astype(np.float32)
    x[:, :, 1] *= 20.0  # heads with very different ranges: per-head scales matter
    return x


@pytest.mark.parametrize(
    ("dtype", "rel_bound"),
    [("fp16", 1e-3), ("int8", 0.5 / 127 + 1e-6), ("fp8", 2**-4 + 1e-6)],
)
def test_round_trip_error_is_bounded(dtype, rel_bound):
    x = _kv()
    q, scales = quantize(x, dtype)
    y = dequantize(q, scales, dtype)
    amax = np.abs(x).max(axis=(-2, -1), keepdims=True)
    if dtype == "int8":  # at most half a step of amax/127 per (layer, k/v, head)
        assert np.all(np.abs(y - x) <= amax * rel_bound)
    else:  # relative error of the float format (fp8 e4m3: 3 mantissa bits), plus subnormals near 0
        assert np.all(np.abs(y - x) <= np.abs(x) * rel_bound + amax * 2**-9)
    assert q.dtype.itemsize == {"fp16": 2, "int8": 1, "fp8": 1}[dtype]


def test_same_budget_holds_more_tokens():
    budget = 8 * 2**20
    tokens = {d: budget // bytes_per_block(d, L, H, T, D) * T for d in ("fp32", "fp16", "int8", "fp8")}
    assert tokens["fp16"] / tokens["fp32"] == pytest.approx(2.0, rel=0.01)
    for d in ("int8", "fp8"):
        assert 3.5 <= tokens[d] / tokens["fp32"] <= 4.0
    data = BlockData("int8", 4, L, H, T, D)
    assert data.nbytes == 4 * bytes_per_block("int8", L, H, T, D)


def test_block_data_write_read():
    x = _kv(1)
    for dtype in ("fp32", "fp16", "int8", "fp8"):
        data = BlockData(dtype, 3, L, H, T, D)
        data.write(2, x)
        y = data.read(2)
        rel = {"fp32": 0.0, "fp16": 1e-3, "int8": 0.5 / 127, "fp8": 2**-4}[dtype]
        assert np.max(np.abs(y - x)) <= rel * np.max(np.abs(x)) + 1e-7, dtype


def test_calibrated_scales_are_used_and_validated(tmp_path):
    x = _kv(2)
    amax = np.abs(x).max(axis=(-2, -1))  # (L, 2, H)
    layers = [
        {"k_scale": (amax[i, 0] / 448).tolist(), "v_scale": (amax[i, 1] / 448).tolist()} for i in range(L)
    ]
    path = tmp_path / "kv_scales.json"
    path.write_text(json.dumps({"dtype": "fp8", "layers": layers}))
    scales = KvScales.read(path, L, H)
    np.testing.assert_allclose(scales.for_dtype("int8"), amax / 127, rtol=1e-5)
    data = BlockData("int8", 1, L, H, T, D, static_scales=scales)
    data.write(0, x)
    np.testing.assert_allclose(data.scales[0], amax / 127, rtol=1e-5)
    # a static scale smaller than the data clips instead of overflowing
    small = KvScales("int8", np.full((L, 2, H), 1e-3, np.float32))
    data = BlockData("int8", 1, L, H, T, D, static_scales=small)
    data.write(0, x)
    assert np.max(np.abs(data.read(0))) <= 127 * 1e-3 + 1e-6
    path.write_text(json.dumps({"dtype": "fp8", "layers": layers[:2]}))
    with pytest.raises(BadInput, match="layers"):
        KvScales.read(path, L, H)
    bad = [dict(layer) for layer in layers]
    bad[1]["v_scale"] = [0.0] * H
    path.write_text(json.dumps({"dtype": "int8", "layers": bad}))
    with pytest.raises(BadInput, match=r"layers\.1\.v_scale"):
        KvScales.read(path, L, H)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "int8", "fp8"])
def test_engine_with_quantized_store(engine_factory, dtype):
    from llmkiln.runtime.loader import load_engine
    from llmkiln.runtime.request import SamplingParams
    from llmkiln.runtime.simple import SimpleGenerator

    engine_dir = engine_factory("stories-fp32")
    eng = load_engine(
        engine_dir, {"kv_cache": {"dtype": dtype, "max_bytes": 2**20}, "scheduler": {"intra_op_threads": 1}}
    )
    assert eng.runner.blocks.dtype == dtype
    text = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with"
    prompt = eng.encode(text)
    captured = {}
    execute = eng.runner.execute

    def recording(plan):
        out = execute(plan)
        captured.update({c.request_id: out[c.request_id].copy() for c in plan.prefills if c.sample})
        return out

    eng.runner.execute = recording
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    eng.submit(prompt, params, request_id="warm")
    while eng.step():
        pass
    # another prompt takes the warm request's slot, so the hit below comes from the quantized store
    eng.submit(eng.encode("The dog ran fast."), params, request_id="other")
    while eng.step():
        pass
    h = eng.submit(prompt + [prompt[5]], params, request_id="hit")
    while eng.step():
        pass
    assert h.num_cached_tokens == (len(prompt) // 16) * 16 > 0
    full = SimpleGenerator(engine_dir).prompt_logits(prompt + [prompt[5]])[-1]
    err = np.max(np.abs(captured["hit"] - full))
    spread = np.ptp(full)
    assert err <= {"fp16": 1e-2, "int8": 0.1, "fp8": 0.25}[dtype] * spread, err
    assert int(np.argmax(captured["hit"])) == int(np.argmax(full))
    eng.shutdown()


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8", "fp8"])
def test_many_blocks_at_once_equal_one_by_one(dtype):
    xs = np.stack([_kv(s) for s in range(3)])
    one, many = BlockData(dtype, 5, L, H, T, D), BlockData(dtype, 5, L, H, T, D)
    for i, block_id in enumerate((4, 0, 2)):
        one.write(block_id, xs[i])
    many.write_many([4, 0, 2], xs)
    assert np.array_equal(one.values, many.values)
    got = many.read_many([2, 4])
    assert np.array_equal(got[0], one.read(2)) and np.array_equal(got[1], one.read(4))


@pytest.mark.parametrize(
    ("dtype", "static"),
    [("fp32", False), ("fp16", False), ("int8", False), ("fp8", False), ("int8", True), ("fp8", True)],
)
def test_copies_through_the_staging_buffer_equal_one_by_one(dtype, static):
    """The runners' path: blocks gathered into the reused staging buffer (quantized there in place), written to
    scattered and consecutive ids, read back into it: the same bytes and values as block-by-block writes and
    reads, and no block-sized array is allocated per copy (the staging buffer is the one read_many returns)."""
    scales = KvScales("int8", np.full((L, 2, H), 0.05, np.float32)) if static else None
    xs = np.stack([_kv(s) for s in range(4)])
    one = BlockData(dtype, 8, L, H, T, D, scales)
    many = BlockData(dtype, 8, L, H, T, D, scales, max_copy_tokens=4 * T)
    assert len(many._staging) == 4 and len(one._staging) == 0  # sized (and touched) at construction
    for ids in ([6, 1, 3, 2], [4, 5, 6, 7]):  # scattered (one consecutive pair), then one run
        for i, block_id in enumerate(ids):
            one.write(block_id, xs[i])
        staged = many.staging(len(ids))
        staged[...] = xs
        many.write_many(ids, staged)
        assert np.array_equal(one.values, many.values)
        if one.scales is not None:
            assert np.array_equal(one.scales, many.scales)
        got = many.read_many(ids)
        for i, block_id in enumerate(ids):
            assert np.array_equal(got[i], one.read(block_id))
        if dtype != "fp32":
            assert np.shares_memory(got, many.staging(1))  # filled in place, not allocated
    if dtype == "fp32":  # a run of an fp32 store: a view of the store
        assert not np.shares_memory(many.read_many([4, 5]), many.staging(1))
