"""Storage of prefix-cache blocks: fp32, fp16, int8 (per block and head scales) or fp8 e4m3 (ml_dtypes).

A block is the KV of `tokens_per_block` tokens for every layer: float32 (L, 2, kv_heads, tokens, head_dim),
axis 1 = key/value. Quantized storage keeps one float32 scale per (layer, key/value, head) of each block, with
x ≈ q * scale: dynamic scales are amax / 127 (int8) or amax / 448 (fp8) over the block's tokens and head dims.
When the engine folder has calibration/kv_scales.json (llmkiln.kv_scales), its static per-layer, per-head scales
are used instead; scales calibrated for the other 8-bit dtype are converted through their amax.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from llmkiln.errors import BadInput
from llmkiln.kv_scales import QMAX, KvScales, is_quantized
from llmkiln.runtime.block_memory import array_spans

STORAGE_DTYPES: dict[str, np.dtype] = {
    "fp32": np.dtype(np.float32),
    "fp16": np.dtype(np.float16),
    "int8": np.dtype(np.int8),
    "fp8": np.dtype(ml_dtypes.float8_e4m3fn),
}


def bytes_per_block(dtype: str, num_layers: int, kv_heads: int, tokens_per_block: int, head_dim: int) -> int:
    """Bytes one block takes in the store (values plus float32 scales for int8/fp8)."""
    values = num_layers * 2 * kv_heads * tokens_per_block * head_dim * STORAGE_DTYPES[dtype].itemsize
    scales = num_layers * 2 * kv_heads * 4 if is_quantized(dtype) else 0
    return values + scales


def quantize(
    x: np.ndarray, dtype: str, scales: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """x float32 (..., tokens, head_dim) → (values in the storage dtype, float32 scales (...) or None).

    scales None: dynamic, amax of each (..., :, :) slice. Given scales are static (values beyond are clipped).
    """
    if dtype == "fp32":
        return np.asarray(x, np.float32), None
    if dtype == "fp16":
        return np.asarray(x, np.float16), None
    qmax = QMAX[dtype]
    if scales is None:
        amax = np.abs(x).max(axis=(-2, -1))
        scales = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    y = np.clip(x / scales[..., None, None], -qmax, qmax)
    if dtype == "int8":
        return np.rint(y).astype(np.int8), scales
    return y.astype(ml_dtypes.float8_e4m3fn), scales


def dequantize(q: np.ndarray, scales: np.ndarray | None, dtype: str) -> np.ndarray:
    """Inverse of quantize, to float32."""
    if scales is None or not is_quantized(dtype):
        return np.asarray(q, np.float32)
    return q.astype(np.float32) * scales[..., None, None]


class BlockData:
    """The arrays behind BlockStore ids: num_blocks blocks of (L, 2, kv_heads, tokens_per_block, head_dim)."""

    def __init__(
        self,
        dtype: str,
        num_blocks: int,
        num_layers: int,
        kv_heads: int,
        tokens_per_block: int,
        head_dim: int,
        static_scales: KvScales | None = None,
        raw: np.dtype | None = None,
        max_copy_tokens: int = 0,
    ) -> None:
        """raw: keep blocks exactly as this dtype (the engine's own KV type), without conversion. max_copy_tokens:
        the most tokens one copy moves (a runner's longest sequence): the `staging` buffer for them is allocated
        and touched now, at load, instead of by the first long copy."""
        if dtype not in STORAGE_DTYPES:
            raise BadInput(f"kv_cache.dtype: {dtype!r}; allowed: {', '.join(STORAGE_DTYPES)}")
        self.dtype = dtype if raw is None else f"raw-{np.dtype(raw).name}"
        self.raw = raw is not None
        shape = (num_blocks, num_layers, 2, kv_heads, tokens_per_block, head_dim)
        self.values = np.zeros(shape, STORAGE_DTYPES[dtype] if raw is None else raw)
        self.values.fill(0)  # NOTE: touch every page now, not on a step's first write (see `staging`)
        self.scales = np.ones(shape[:4], np.float32) if is_quantized(dtype) and raw is None else None
        self.static = (
            static_scales.for_dtype(dtype) if static_scales is not None and is_quantized(dtype) else None
        )
        # what read_many returns and write_many takes: the raw dtype, else float32
        self.array_dtype = np.dtype(raw) if raw is not None else np.dtype(np.float32)
        self._staging = np.empty((0, *shape[1:]), self.array_dtype)
        if num_blocks and max_copy_tokens:
            self.staging(min(num_blocks, -(-max_copy_tokens // tokens_per_block)))

    def staging(self, num_blocks: int) -> np.ndarray:
        """A reusable (num_blocks, L, 2, kv_heads, tokens, head_dim) buffer in `array_dtype` for moving blocks
        between the store and a runner's pools; its contents last until the next `staging` or `read_many`.

        Why one buffer: a fresh block-sized temporary per copy (48 MiB for a 2048-token prompt of bench-llama-125m)
        is a fresh mapping numpy asks the kernel to back with huge pages, and with THP defrag `madvise` (this
        host's setting) each such fault may compact memory synchronously: measured in a serving decode worker,
        loading an imported 128-block prefix took 48 ms median and up to 122 ms, 40-90 ms of it kernel time (536
        faults), against 4-9 ms in a quiet process; every running decode waited for it."""
        if len(self._staging) < num_blocks:
            self._staging = np.empty((num_blocks, *self._staging.shape[1:]), self.array_dtype)
            self._staging.fill(0)  # touch it once
        return self._staging[:num_blocks]

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (self.scales.nbytes if self.scales is not None else 0)

    def regions(self) -> list[tuple[int, int]]:
        """(address, bytes) of the arrays behind every block (values, then scales): what a transfer agent
        registers once. The arrays are allocated once and never move."""
        out = [(self.values.ctypes.data, self.values.nbytes)]
        if self.scales is not None:
            out.append((self.scales.ctypes.data, self.scales.nbytes))
        return out

    def arrays(self) -> list[tuple[int, int]]:
        """(base address, bytes per block) of the values, then of the scales (runtime.block_memory.BlockMemory)."""
        arrays = [self.values] if self.scales is None else [self.values, self.scales]
        return [(arr.ctypes.data, arr.nbytes // max(1, arr.shape[0])) for arr in arrays]

    def spans(self, block_ids: Sequence[int]) -> list[tuple[int, int]]:
        """(address, bytes) of these blocks as stored: the values of each, then the scales of each (a block is
        one contiguous run of values and one of scales). Two stores of one layout give lists of equal sizes."""
        return array_spans(self.arrays(), block_ids)

    def layout(self) -> dict[str, object]:
        """What two stores must share for blocks to move between them as bytes."""
        return {
            "dtype": self.dtype,
            "block_shape": list(self.values.shape[1:]),
            "scales": self.scales is not None,
            "static_scales": self.static is not None,
        }

    def write(self, block_id: int, kv: np.ndarray) -> None:
        if self.raw:
            self.values[block_id] = kv
            return
        q, scales = quantize(kv, self.dtype, self.static)
        self.values[block_id] = q
        if self.scales is not None and scales is not None:
            self.scales[block_id] = scales

    def write_many(self, block_ids: Sequence[int], kv: np.ndarray) -> None:
        """Write n blocks at once: kv (n, L, 2, kv_heads, tokens, head_dim); the same values as n `write`s.
        Allocates nothing block-sized when kv is the `staging` buffer (int8/fp8 then quantize it in place)."""
        n = len(block_ids)
        if self.scales is None:  # fp32, fp16, raw: a (casting) copy per run of consecutive ids
            for dst, src, length in _runs(block_ids):
                self.values[dst : dst + length] = kv[src : src + length]
            return
        if not np.may_share_memory(kv, self._staging):
            q, scales = quantize(kv, self.dtype, self.static)
            self.values[np.asarray(block_ids, np.intp)] = q
            if scales is not None:
                self.scales[np.asarray(block_ids, np.intp)] = scales
            return
        qmax = QMAX[self.dtype]
        if self.static is None:  # amax per (block, layer, k/v, head) without a block-sized |x|
            amax = np.maximum(kv.max(axis=(-2, -1)), -kv.min(axis=(-2, -1)))
            scales = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        else:
            scales = np.broadcast_to(self.static, kv.shape[:4]).astype(np.float32)
        np.divide(kv, scales[..., None, None], out=kv)  # the same arithmetic as quantize(), in place
        np.clip(kv, -qmax, qmax, out=kv)
        if self.dtype == "int8":
            np.rint(kv, out=kv)
        for dst, src, length in _runs(block_ids):
            self.values[dst : dst + length] = kv[src : src + length]  # cast as astype() casts
        self.scales[np.asarray(block_ids, np.intp)] = scales[:n]

    def read_many(self, block_ids: Sequence[int]) -> np.ndarray:
        """n blocks at once, (n, L, 2, kv_heads, tokens, head_dim) in `array_dtype`; the same values as n `read`s.
        Read-only. For consecutive ids of an fp32 or raw store it is a view of the store (imported prompts and
        fresh saves get consecutive ids from the free list); otherwise it is the `staging` buffer, filled."""
        runs = _runs(block_ids)
        if len(runs) == 1 and self.values.dtype == self.array_dtype:
            dst, _, length = runs[0]
            return self.values[dst : dst + length]
        out = self.staging(len(block_ids))
        for dst, src, length in runs:
            out[src : src + length] = self.values[dst : dst + length]
        if self.scales is not None:
            out *= self.scales[np.asarray(block_ids, np.intp)][..., None, None]
        return out

    def read(self, block_id: int) -> np.ndarray:
        if self.raw:
            return self.values[block_id]
        scales = self.scales[block_id] if self.scales is not None else None
        return dequantize(self.values[block_id], scales, self.dtype)


def _runs(block_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first id, position in block_ids, length) of each run of consecutive ids."""
    runs: list[tuple[int, int, int]] = []
    for i, b in enumerate(block_ids):
        b = int(b)
        if runs and runs[-1][0] + runs[-1][2] == b:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((b, i, 1))
    return runs
