"""KV-cache statistics for calibration: per-layer, per-KV-head absmax (or percentile) of the cached K and V.

`KvAbsmax` accumulates them from any producer (the ONNX engine's present.* outputs or the HF model's cache), so
the same code serves the ONNX and the ModelOpt paths; `to_scales` turns them into llmkiln.kv_scales.KvScales, the
type and file format the runtime reads (`calibration/kv_scales.json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from llmkiln.errors import BadInput
from llmkiln.kv_scales import KvScales

PERCENTILE = 99.99


KvAlgorithm = Literal["max", "percentile"]  # the calibration.algorithm values that make KV scales


@dataclass
class KvAbsmax:
    """Running per-layer, per-KV-head statistics of |K| and |V|; arrays are [num_kv_heads, head_dim, ...]."""

    num_layers: int
    num_kv_heads: int
    algorithm: KvAlgorithm = "max"
    k_max: np.ndarray = field(init=False)
    v_max: np.ndarray = field(init=False)
    _k_samples: list[list[np.ndarray]] = field(init=False, repr=False)
    _v_samples: list[list[np.ndarray]] = field(init=False, repr=False)
    sequences: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ("max", "percentile"):
            raise BadInput(
                f"calibration.algorithm {self.algorithm!r} cannot make KV scales; use max or percentile"
            )
        self.k_max = np.zeros((self.num_layers, self.num_kv_heads), dtype=np.float64)
        self.v_max = np.zeros((self.num_layers, self.num_kv_heads), dtype=np.float64)
        self._k_samples = [[] for _ in range(self.num_layers)]
        self._v_samples = [[] for _ in range(self.num_layers)]

    def update(self, layer: int, key: np.ndarray, value: np.ndarray) -> None:
        """Add one sequence's cached K/V of one layer: shape [batch, kv_heads, seq, head_dim]."""
        for arr, acc, samples in ((key, self.k_max, self._k_samples), (value, self.v_max, self._v_samples)):
            a = np.abs(np.asarray(arr, dtype=np.float32))
            if a.ndim != 4 or a.shape[1] != self.num_kv_heads:
                raise ValueError(
                    f"layer {layer}: expected [batch, {self.num_kv_heads}, seq, head_dim], got {a.shape}"
                )
            per_head = a.transpose(1, 0, 2, 3).reshape(self.num_kv_heads, -1)
            acc[layer] = np.maximum(acc[layer], per_head.max(axis=1))
            if self.algorithm == "percentile":
                samples[layer].append(per_head)
        if layer == 0:
            self.sequences += int(key.shape[0])
            self.tokens += int(key.shape[0] * key.shape[2])

    def absmax(self) -> tuple[np.ndarray, np.ndarray]:
        """[layers, kv_heads] ranges of K and V (max, or the PERCENTILE-th percentile of |x|)."""
        if self.algorithm == "max":
            return self.k_max.copy(), self.v_max.copy()
        k = np.stack([np.percentile(np.concatenate(s, axis=1), PERCENTILE, axis=1) for s in self._k_samples])
        v = np.stack([np.percentile(np.concatenate(s, axis=1), PERCENTILE, axis=1) for s in self._v_samples])
        return k, v

    def to_scales(self, dtype: str, **provenance: Any) -> KvScales:
        if self.sequences == 0:
            raise BadInput("no calibration sequences were seen; the calibration set is empty")
        k, v = self.absmax()
        return KvScales.from_absmax(
            dtype, k, v, algorithm=self.algorithm, sequences=self.sequences, tokens=self.tokens, **provenance
        )
