"""Which weights `weights: int8` keeps (llmkiln.build.openvino_weights), on graphs built op by op: the MLP's down
projection is found by the activation feeding it, not by any product of two computed values."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from llmkiln.build.openvino_weights import _down_projections, _weight_matmuls

HIDDEN, INTER = 8, 16


def _linear(x, rows: int, cols: int, name: str):
    w = ops.constant(np.ones((rows, cols), np.float32))
    mm = ops.matmul(x, w, False, True)
    mm.set_friendly_name(name)
    return mm


def _layer(gamma_folded: bool) -> ov.Model:
    """RMSNorm → q; RMSNorm → gate, up; swish(gate) * up → down. With gamma_folded the norm ends in x * rsqrt(...)
    (the PyTorch frontend drops a multiply by an all-ones gamma, as in a generated model's IR)."""
    x = ops.parameter([1, HIDDEN], np.float32, name="x")
    rms = ops.sqrt(ops.reduce_mean(ops.multiply(x, x), ops.constant(np.array([-1])), True))
    normed = ops.multiply(x, ops.divide(ops.constant(np.float32(1.0)), rms))
    if not gamma_folded:
        normed = ops.multiply(normed, ops.constant(np.full((HIDDEN,), 0.5, np.float32)))
    q = _linear(normed, HIDDEN, HIDDEN, "q")
    gate, up = _linear(normed, INTER, HIDDEN, "gate"), _linear(normed, INTER, HIDDEN, "up")
    down = _linear(ops.multiply(ops.swish(gate), up), HIDDEN, INTER, "down")
    return ov.Model([ops.add(q, down)], [x])


def test_the_down_projection_is_the_one_fed_by_the_activation_product() -> None:
    for folded in (False, True):
        model = _layer(gamma_folded=folded)
        assert len(_weight_matmuls(model)) == 4
        assert _down_projections(model) == ["down"], folded


def test_the_weight_rule_is_in_the_whole_build_key_of_int8_recipes_only(monkeypatch) -> None:
    """An engine built by an older rule is not 'up to date' (the recipe hash does not see the rule); recipes with
    the checkpoint's weights keep their key."""
    from types import SimpleNamespace

    from llmkiln.build import openvino_weights
    from llmkiln.build.build_cache import build_key
    from llmkiln.build.openvino_export import OpenVinoExportStage

    stage = OpenVinoExportStage()

    def key(weights: str) -> str:
        recipe = SimpleNamespace(weights=weights, compute_hash=lambda: "recipe")
        return build_key(recipe, {}, {}, [stage], SimpleNamespace(recipe=recipe))

    before = {w: key(w) for w in ("checkpoint", "int8")}
    assert key("checkpoint") == build_key(SimpleNamespace(compute_hash=lambda: "recipe"), {}, {}, [stage])
    monkeypatch.setattr(openvino_weights, "METHOD", openvino_weights.METHOD + "; another rule")
    assert key("int8") != before["int8"] and key("checkpoint") == before["checkpoint"]
