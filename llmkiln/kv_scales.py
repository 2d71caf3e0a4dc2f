"""KV-cache scales: the one type and file format (`calibration/kv_scales.json` in an engine folder).

    {"dtype": "int8" | "fp8",
     "layers": [{"k_scale": [one float per KV head], "v_scale": [...]}, ...],   # one entry per layer
     ...provenance fields (algorithm, samples, tokens, k_absmax, v_absmax, qmax) that readers may ignore}

x ≈ q * scale, with scale = absmax / QMAX[dtype] (127 for int8, 448 for fp8 E4M3). K is the cached (post-rotary)
key. Calibration writes it (llmkiln.calibration), the CPU runtime's block store reads it (llmkiln.runtime).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BadInput
from llmkiln.jsonl import loads_json

KvDtype = Literal["int8", "fp8"]
FILE_NAME = "kv_scales.json"  # in an engine folder: calibration/kv_scales.json
QMAX: dict[str, float] = {"int8": 127.0, "fp8": 448.0}
# Scale floor, so an all-zero head (never seen in practice) cannot produce a zero divisor in the runtime.
MIN_ABSMAX = 1e-6


def is_quantized(dtype: object) -> TypeGuard[KvDtype]:
    """True for the 8-bit KV dtypes that need scales."""
    return dtype in QMAX


@dataclass(frozen=True)
class KvScales:
    """Per-layer, per-KV-head scales: `scales` (num_layers, 2, kv_heads), axis 1 = key/value (float64 as
    calibrated; `for_dtype` gives the runtime's float32)."""

    dtype: KvDtype
    scales: np.ndarray
    provenance: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_absmax(
        cls, dtype: str, k_absmax: np.ndarray, v_absmax: np.ndarray, **provenance: Any
    ) -> KvScales:
        """Scales from [layers, kv_heads] ranges of K and V (floored at MIN_ABSMAX)."""
        if not is_quantized(dtype):
            raise BadInput(f"KV scale dtype must be one of {sorted(QMAX)}, got {dtype!r}")
        qmax = QMAX[dtype]
        k = np.maximum(np.asarray(k_absmax, dtype=np.float64), MIN_ABSMAX)
        v = np.maximum(np.asarray(v_absmax, dtype=np.float64), MIN_ABSMAX)
        prov = {"k_absmax": k.tolist(), "v_absmax": v.tolist(), "qmax": qmax, **provenance}
        return cls(dtype, np.stack((k / qmax, v / qmax), axis=1), prov)

    @property
    def num_layers(self) -> int:
        return int(self.scales.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.scales.shape[2])

    @property
    def k_scale(self) -> list[list[float]]:
        return np.asarray(self.scales[:, 0], np.float64).tolist()

    @property
    def v_scale(self) -> list[list[float]]:
        return np.asarray(self.scales[:, 1], np.float64).tolist()

    def for_dtype(self, dtype: str) -> np.ndarray:
        """float32 scales for storing in `dtype` (converted through amax when calibrated for the other 8-bit type)."""
        return (np.asarray(self.scales, np.float64) * QMAX[self.dtype] / QMAX[dtype]).astype(np.float32)

    def to_json(self) -> dict[str, Any]:
        layers = [{"k_scale": k, "v_scale": v} for k, v in zip(self.k_scale, self.v_scale, strict=True)]
        return {"dtype": self.dtype, "layers": layers, **self.provenance}

    def write(self, path: Path) -> Path:
        """Write atomically (temp file + rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, path: Path, num_layers: int | None = None, kv_heads: int | None = None) -> KvScales:
        """Read and check a kv_scales.json; BadInput naming the file and field on a bad file (and on a layer or
        head count other than the model's, when given)."""
        try:
            data = loads_json(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BadInput(f"{path}: cannot read KV scales: {exc}") from None
        dtype = data.get("dtype") if isinstance(data, dict) else None
        if not is_quantized(dtype):
            raise BadInput(f"{path}: field 'dtype': {dtype!r}; expected 'int8' or 'fp8'")
        layers = data.get("layers")
        if (
            not isinstance(layers, list)
            or not layers
            or (num_layers is not None and len(layers) != num_layers)
        ):
            got = len(layers) if isinstance(layers, list) else layers
            want = f"{num_layers} layers" if num_layers is not None else "a non-empty list of layers"
            raise BadInput(f"{path}: field 'layers': expected {want}, got {got!r}")
        heads = kv_heads
        rows = []
        for i, layer in enumerate(layers):
            pair = []
            for name in ("k_scale", "v_scale"):
                values = layer.get(name) if isinstance(layer, dict) else None
                if (
                    not isinstance(values, list)
                    or not values
                    or (heads is not None and len(values) != heads)
                    or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in values)
                ):
                    want = f"{heads} floats" if heads is not None else "a list of floats, one per KV head"
                    raise BadInput(f"{path}: field 'layers.{i}.{name}': expected {want}, got {values!r}")
                arr = np.asarray(values, np.float64)
                if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
                    raise BadInput(
                        f"{path}: field 'layers.{i}.{name}': scales must be finite and > 0, got {values}"
                    )
                heads = len(values)
                pair.append(arr)
            rows.append(pair)
        prov = {key: val for key, val in data.items() if key not in ("dtype", "layers")}
        return cls(dtype, np.asarray(rows, np.float64), prov)
