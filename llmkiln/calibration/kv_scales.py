"""KV-cache scales for the CPU runtime's int8/fp8 prefix block store, from per-layer, per-KV-head absmax of K and V.

File `calibration/kv_scales.json` in the engine folder (schema agreed with the runtime):

    {"dtype": "int8" | "fp8",
     "layers": [{"k_scale": [one float per KV head], "v_scale": [...]}, ...],   # one entry per layer
     ...provenance fields (algorithm, samples, tokens, absmax) that readers may ignore}

scale = absmax / 127 for int8 and absmax / 448 for fp8 (E4M3 max). K is the cached (post-rotary) key, exactly what
the runtime stores. `KvAbsmax` accumulates statistics from any producer (ONNX engine present.* outputs or the HF
model's cache), so the same code serves the ONNX and the ModelOpt paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BadInput

KV_SCALES_NAME = "kv_scales.json"
QMAX: dict[str, float] = {"int8": 127.0, "fp8": 448.0}
# Scale floor, so an all-zero head (never seen in practice) cannot produce a zero divisor in the runtime.
MIN_ABSMAX = 1e-6
PERCENTILE = 99.99

KvDtype = Literal["int8", "fp8"]


@dataclass
class KvAbsmax:
    """Running per-layer, per-KV-head statistics of |K| and |V|; arrays are [num_kv_heads, head_dim, ...]."""

    num_layers: int
    num_kv_heads: int
    algorithm: Literal["max", "percentile"] = "max"
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

    def to_scales(self, dtype: KvDtype, **provenance: Any) -> KvScales:
        if self.sequences == 0:
            raise BadInput("no calibration sequences were seen; the calibration set is empty")
        k, v = self.absmax()
        return KvScales.from_absmax(
            dtype, k, v, algorithm=self.algorithm, sequences=self.sequences, tokens=self.tokens, **provenance
        )


@dataclass
class KvScales:
    """Per-layer, per-KV-head scales in the runtime's schema."""

    dtype: KvDtype
    k_scale: list[list[float]]
    v_scale: list[list[float]]
    provenance: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_absmax(
        cls, dtype: KvDtype, k_absmax: np.ndarray, v_absmax: np.ndarray, **provenance: Any
    ) -> KvScales:
        if dtype not in QMAX:
            raise BadInput(f"KV scale dtype must be one of {sorted(QMAX)}, got {dtype!r}")
        qmax = QMAX[dtype]
        k = np.maximum(np.asarray(k_absmax, dtype=np.float64), MIN_ABSMAX)
        v = np.maximum(np.asarray(v_absmax, dtype=np.float64), MIN_ABSMAX)
        prov = {"k_absmax": k.tolist(), "v_absmax": v.tolist(), "qmax": qmax, **provenance}
        return cls(dtype, (k / qmax).tolist(), (v / qmax).tolist(), prov)

    @property
    def num_layers(self) -> int:
        return len(self.k_scale)

    def to_json(self) -> dict[str, Any]:
        layers = [{"k_scale": k, "v_scale": v} for k, v in zip(self.k_scale, self.v_scale, strict=True)]
        return {"dtype": self.dtype, "layers": layers, **self.provenance}

    def write(self, path: Path) -> Path:
        """Write atomically (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path


def read_kv_scales(path: Path) -> KvScales:
    """Read and validate kv_scales.json (BadInput naming the file and field)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: cannot read KV scales: {exc}") from None
    dtype = data.get("dtype")
    if dtype not in QMAX:
        raise BadInput(f"{path}: field 'dtype': {dtype!r}; expected int8 or fp8")
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise BadInput(f"{path}: field 'layers' must be a non-empty list")
    k, v = [], []
    for i, layer in enumerate(layers):
        ks, vs = layer.get("k_scale"), layer.get("v_scale")
        ok = isinstance(ks, list) and isinstance(vs, list) and ks and len(ks) == len(vs)
        if not ok or not all(isinstance(x, int | float) and x > 0 for x in [*ks, *vs]):
            raise BadInput(
                f"{path}: field 'layers[{i}]': k_scale/v_scale must be equal-length lists of positive floats"
            )
        k.append([float(x) for x in ks])
        v.append([float(x) for x in vs])
    prov = {key: val for key, val in data.items() if key not in ("dtype", "layers")}
    return KvScales(dtype, k, v, prov)
