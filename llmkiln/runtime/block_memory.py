"""Where the bytes of the KV cache manager's blocks live, as a transfer agent (NIXL) reads and writes them.

`BlockMemory` is what host.kv_transfer needs of a runner's block memory: the regions to register once, the
(address, bytes) spans of given blocks, and a layout two engines must share for blocks to move between them as
bytes. Two implementations: a slot runner's prefix store (runtime.kv_quant.BlockData: one array, a block one
contiguous run, plus its scales) and a paged runner's pools (`PagedPools` here: one array per layer and K/V, a
block one contiguous run in each). With paged pools the transfer moves KV from the prefill engine's blocks to the
decode engine's blocks directly: no staging copy on either side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class BlockMemory(Protocol):
    def regions(self) -> list[tuple[int, int]]:
        """(address, bytes) of every array behind the blocks: registered once; the arrays never move."""
        ...

    def arrays(self) -> list[tuple[int, int]]:
        """(base address, bytes per block) of each array, in `spans` order: what a peer computes its reads from."""
        ...

    def spans(self, block_ids: Sequence[int]) -> list[tuple[int, int]]:
        """(address, bytes) of these blocks: for each array in `arrays` order, each block in the order given."""
        ...

    def layout(self) -> dict[str, object]:
        """What two engines' block memories must share for blocks to move between them as bytes."""
        ...


def array_spans(arrays: list[tuple[int, int]], block_ids: Sequence[int]) -> list[tuple[int, int]]:
    """`BlockMemory.spans` of arrays given as (base, bytes per block)."""
    return [(base + int(b) * step, step) for base, step in arrays for b in block_ids]


class PagedPools:
    """A paged runner's pools, each [blocks, ...] (OpenVINO: per layer a K and a V array [blocks, kv_heads,
    tokens_per_block, head_dim], in the order k0, v0, k1, v1, ...)."""

    def __init__(self, pools: Sequence[np.ndarray], dtype: str) -> None:
        self.pools = list(pools)
        self.dtype = dtype
        first = self.pools[0]
        if any(p.shape != first.shape or p.dtype != first.dtype for p in self.pools):
            raise ValueError("paged pools of different shapes or types")
        self.num_blocks = first.shape[0]

    def regions(self) -> list[tuple[int, int]]:
        return [(p.ctypes.data, p.nbytes) for p in self.pools]

    def arrays(self) -> list[tuple[int, int]]:
        return [(p.ctypes.data, p.nbytes // max(1, p.shape[0])) for p in self.pools]

    def spans(self, block_ids: Sequence[int]) -> list[tuple[int, int]]:
        return array_spans(self.arrays(), block_ids)

    def layout(self) -> dict[str, object]:
        return {
            "dtype": f"paged-{self.dtype}",
            "block_shape": list(self.pools[0].shape[1:]),
            "arrays": len(self.pools),
            "scales": False,
            "static_scales": False,
        }

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pools)
