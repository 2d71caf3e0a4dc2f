"""What the quantized prefix block store does to the logits: a prefix-cache hit replayed offline.

For each evaluation text: prefill the first part (a whole number of blocks), round-trip its KV through the
runtime's own quantize/dequantize (runtime.kv_quant) with the calibrated static scales or with dynamic per-block
scales, then run the rest of the text on that KV. KL(exact‖round-tripped) and top-1 agreement over the suffix
positions measure the storage error alone (the engine's weights are the same on both sides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from llmkiln.calibration.candidates import OnnxScorer
from llmkiln.calibration.datasets import TextRecord
from llmkiln.calibration.quality_diff import token_kl
from llmkiln.kv_scales import KvScales
from llmkiln.runtime.kv_quant import dequantize, quantize


def _roundtrip(x: np.ndarray, dtype: str, scales: np.ndarray | None, block: int) -> np.ndarray:
    """x [1, heads, T, dim] through the store: per block of `block` tokens, static per-head scales or dynamic."""
    out = np.empty_like(x, dtype=np.float32)
    for start in range(0, x.shape[2], block):
        part = np.asarray(x[0, :, start : start + block], np.float32)  # [heads, t, dim]
        q, s = quantize(part, dtype, None if scales is None else scales.astype(np.float32))
        out[0, :, start : start + block] = dequantize(q, s, dtype)
    return out


def kv_store_effect(
    scorer: OnnxScorer,
    scales: KvScales,
    records: Sequence[TextRecord],
    tokens_per_block: int = 16,
    max_seq_len: int = 256,
    samples: int = 8,
) -> dict[str, Any]:
    """{"static": {...}, "dynamic_per_block": {...}} with mean/max KL and top-1 over the suffix tokens."""
    n = scorer.gen.info.num_layers
    static = {"k": np.asarray(scales.k_scale), "v": np.asarray(scales.v_scale)}
    kls: dict[str, list[np.ndarray]] = {"static": [], "dynamic_per_block": []}
    agree: dict[str, list[np.ndarray]] = {"static": [], "dynamic_per_block": []}
    for rec in list(records)[:samples]:
        ids = scorer.encode(rec.text)[:max_seq_len]
        split = (len(ids) // 2) // tokens_per_block * tokens_per_block
        if split < tokens_per_block or split >= len(ids):
            continue
        full = scorer.logits(ids)[split:]
        _, past = scorer.gen.forward(ids[:split], scorer.gen._empty_past())
        for mode in kls:
            q_past = {}
            for i in range(n):
                for kind in ("key", "value"):
                    name = f"past_key_values.{i}.{kind}"
                    s = static[kind[0]][i] if mode == "static" else None
                    q_past[name] = _roundtrip(past[name], scales.dtype, s, tokens_per_block)
            logits, _ = scorer.gen.forward(ids[split:], q_past)
            kls[mode].append(token_kl(full, logits))
            agree[mode].append(full.argmax(-1) == logits.argmax(-1))
    out: dict[str, Any] = {"dtype": scales.dtype, "tokens_per_block": tokens_per_block}
    for mode in kls:
        if not kls[mode]:
            continue
        k = np.concatenate(kls[mode])
        out[mode] = {
            "mean_kl": float(k.mean()),
            "max_kl": float(k.max()),
            "top1_agreement": float(np.concatenate(agree[mode]).mean()),
            "texts": len(kls[mode]),
            "tokens": int(k.size),
        }
    return out
