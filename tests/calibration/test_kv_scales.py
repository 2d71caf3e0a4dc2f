"""KV scale statistics and the kv_scales.json schema shared with the runtime (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmkiln.calibration.kv_stats import KvAbsmax
from llmkiln.errors import BadInput
from llmkiln.kv_scales import KvScales


def _kv(rng: np.random.Generator, heads: int = 3, t: int = 10, d: int = 4) -> np.ndarray:
    return rng.normal(size=(1, heads, t, d)).astype(np.float32) * np.arange(1, heads + 1)[None, :, None, None]


def test_absmax_is_per_layer_and_per_head_and_scales_divide_by_qmax(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stats = KvAbsmax(num_layers=2, num_kv_heads=3)
    seen = {i: ([], []) for i in range(2)}
    for _ in range(4):
        for layer in range(2):
            k, v = _kv(rng), _kv(rng)
            stats.update(layer, k, v)
            seen[layer][0].append(k)
            seen[layer][1].append(v)
    assert stats.sequences == 4 and stats.tokens == 40
    for layer in range(2):
        k = np.abs(np.concatenate(seen[layer][0], axis=2)).max(axis=(0, 2, 3))
        np.testing.assert_allclose(stats.k_max[layer], k)
    for dtype, qmax in (("int8", 127.0), ("fp8", 448.0)):
        scales = stats.to_scales(dtype)
        np.testing.assert_allclose(np.asarray(scales.k_scale), stats.k_max / qmax)
        np.testing.assert_allclose(np.asarray(scales.v_scale), stats.v_max / qmax)
        back = KvScales.read(scales.write(tmp_path / f"{dtype}.json"))
        assert back.dtype == dtype and back.k_scale == scales.k_scale and back.v_scale == scales.v_scale
        data = json.loads((tmp_path / f"{dtype}.json").read_text())
        assert set(data["layers"][0]) == {"k_scale", "v_scale"} and len(data["layers"][0]["k_scale"]) == 3


def test_percentile_is_below_max() -> None:
    rng = np.random.default_rng(1)
    stats = KvAbsmax(1, 2, algorithm="percentile")
    k = rng.normal(size=(1, 2, 5000, 4)).astype(np.float32)
    k[0, 0, 0, 0] = 100.0  # one outlier
    stats.update(0, k, k)
    kp, _ = stats.absmax()
    assert kp[0, 0] < 100.0 and np.all(kp <= stats.k_max)


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="algorithm"):
        KvAbsmax(1, 1, algorithm="builder")  # type: ignore[arg-type]  # deliberately outside KvAlgorithm
    with pytest.raises(BadInput, match="empty"):
        KvAbsmax(1, 1).to_scales("int8")
    with pytest.raises(BadInput, match="dtype"):
        KvScales.from_absmax("fp16", np.ones((1, 1)), np.ones((1, 1)))
    bad = tmp_path / "kv.json"
    bad.write_text(json.dumps({"dtype": "int8", "layers": [{"k_scale": [1.0], "v_scale": [0.0]}]}))
    with pytest.raises(BadInput, match=r"layers\.0\.v_scale"):
        KvScales.read(bad)
    bad.write_text(json.dumps({"dtype": "int4", "layers": []}))
    with pytest.raises(BadInput, match="dtype"):
        KvScales.read(bad)
