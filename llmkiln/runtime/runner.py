"""Executes a SchedulerOutput on the builder's ONNX graph. The runtime's onnxruntime module (runtime.simple, the
reference loop, is the other one: import-linter's `onnxruntime` contract lists them).

One InferenceSession driven through IOBinding. The KV lives in a pool per layer shaped
(slots, kv_heads, max_len, head_dim); past and present are bound to the same memory, so GroupQueryAttention
writes the new K/V in place. KV is right-padded: slot s holds valid entries [0, len_s); attention-mask row sums
give the lengths and the graph derives positions from them.

Shapes the op accepts (measured): a decode is one run over a contiguous range of slots with S=1 (slots in the
range that do not decode get a dummy token written at their current length, which nothing reads); a prefill
with a past (a chunk, or the rest of a prompt after a prefix hit) runs alone (B=1); prompts that start from
scratch and fit in one chunk run together, right-padded, into scratch buffers that are then copied into slots.
Copying cached blocks into a slot and prefilling the rest is bit-exact with a full prefill, as is chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from llmkiln.cpu_features import detect
from llmkiln.engine_dir import GenaiConfig
from llmkiln.errors import BadInput, NeedsGpuHost
from llmkiln.kv_scales import KvScales
from llmkiln.runtime import last_logits
from llmkiln.runtime.kv_quant import BlockData, bytes_per_block
from llmkiln.runtime.plan import PrefillChunk, SchedulerOutput, block_runs
from llmkiln.runtime.profile import StepTrace, now_ns

_POOL_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}
_RAW_NAMES = {"float16": "fp16", "int8": "int8"}

# Fresh prompts batched together may waste at most this share of their padded tokens on padding.
_MAX_PADDING = 0.25


def _providers(model: Path, wanted: Sequence[tuple[str, dict[str, Any]]] | None) -> list[Any]:
    """The engine's execution providers (onnx-gpu: TensorRT EP on its built cache, CUDA EP), else the CPU EP.
    NeedsGpuHost (exit 3) when this onnxruntime has none of them: an onnx-gpu engine never runs on the CPU."""
    if not wanted:
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    usable = [(name, opts) for name, opts in wanted if name in available]
    if not usable:
        raise NeedsGpuHost(
            f"{model.parent}: built for {', '.join(n for n, _ in wanted)} (backend onnx-gpu), and this onnxruntime "
            f"offers {', '.join(available)}: run it on a GPU host with onnxruntime-gpu (pip install -e '.[gpu]')"
        )
    return usable


# What an execution provider's shared library loads: when one is missing, onnxruntime skips the provider. (The
# major versions are those this onnxruntime-gpu wheel was built against; onnxruntime's error names the file.)
PROVIDER_LIBRARIES = {
    "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so, which needs TensorRT (libnvinfer, "
    "libnvinfer_plugin, libnvonnxparser) and the CUDA EP's libraries",
    "CUDAExecutionProvider": "libonnxruntime_providers_cuda.so, which needs the CUDA runtime and math libraries "
    "(libcudart, libcublas, libcublasLt, libcufft, libcurand) and cuDNN (libcudnn)",
}


def check_session_providers(
    session: Any, wanted: Sequence[tuple[str, dict[str, Any]]] | None, model: Path
) -> None:
    """NeedsGpuHost (exit 3) unless the session registered every provider the engine was built for.

    onnxruntime does not fail when an execution provider cannot load: a CUDA EP whose libraries are missing is
    logged and left out, a TensorRT EP that raises makes InferenceSession retry with its fallback list
    (onnxruntime_inference_collection.py: "Falling back to [...] and retrying"), and the graph then runs on the CPU
    EP. session.get_providers() is what is registered, so it is the check. After it, run-time fallback is
    switched off: an EP failure during run() raises instead of moving the session onto the CPU EP."""
    if not wanted:
        return
    active = list(session.get_providers())
    missing = [name for name, _ in wanted if name not in active]
    if missing:
        libs = "; ".join(
            f"{name}: {PROVIDER_LIBRARIES.get(name, 'its provider library')}" for name in missing
        )
        raise NeedsGpuHost(
            f"{model.parent}: built for {', '.join(n for n, _ in wanted)} (backend onnx-gpu), but onnxruntime "
            f"registered only {', '.join(active) or 'nothing'}: {', '.join(missing)} did not load, so the graph would "
            f"run on the CPU. Missing library ({libs}); onnxruntime's own error above names the file it could not "
            "open. Install those libraries (or run in a container that has them) and load the engine again"
        )
    session.disable_fallback()


class OnnxRunner:
    """Holds the session, the slot KV pools and the prefix-store block data; runs one plan per call."""

    batches_prefills_with_past = False  # GroupQueryAttention takes a past only at batch 1
    mixes_decodes_with_prefills = False
    paged_kv = False  # contiguous slots; the prefix store's blocks are copied in and out
    verifies_drafts = False  # GroupQueryAttention on the CPU takes several tokens on a past only at batch 1

    def __init__(
        self,
        engine_dir: Path,
        info: GenaiConfig,
        num_slots: int,
        max_len: int,
        tokens_per_block: int,
        store_max_bytes: int,
        kv_dtype: str = "fp32",
        kv_scales: KvScales | None = None,
        intra_op_threads: int = 0,
        intra_op_spinning: bool = True,
        last_logits_only: bool = True,
        providers: Sequence[tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        self.info = info
        self.num_slots = num_slots
        self.max_len = max_len
        self.tokens_per_block = tokens_per_block
        self.vocab_size = info.vocab_size
        opts = ort.SessionOptions()
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        if not intra_op_spinning:  # threads sleep between operators instead of spinning on a shared core
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        path = Path(engine_dir) / info.model_file
        rewritten = last_logits.rewrite(path, info.logits_name) if last_logits_only else None
        if rewritten is not None:
            opts.add_session_config_entry(last_logits.EXTERNAL_DATA_FOLDER, str(path.parent))
        self.session = ort.InferenceSession(
            rewritten if rewritten is not None else str(path), opts, providers=_providers(path, providers)
        )
        check_session_providers(self.session, providers, path)
        self.last_only = rewritten is not None
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.has_position_ids = "position_ids" in self.input_names
        past_type = next(i.type for i in self.session.get_inputs() if i.name == info.past_key_fmt % 0)
        if past_type not in _POOL_DTYPES:
            raise BadInput(f"{path}: KV cache type {past_type} is not supported (float, float16 or int8)")
        self.runtime_settings: dict[str, str] = {
            **detect().settings(),
            "precision": str(past_type),
            "kv_dtype": kv_dtype,
            "providers": ",".join(self.session.get_providers()),
            "intra_op_threads": str(intra_op_threads or "auto"),
            "intra_op_spinning": str(intra_op_spinning),
        }
        # NOTE: an engine built with an in-graph quantized KV cache (builder kv_cache_quant_scheme) keeps its
        # pool in that type; the prefix store then holds the pool's raw values (exact copies, no second rounding).
        self.pool_dtype = np.dtype(_POOL_DTYPES[past_type])
        L = info.num_layers
        shape = (num_slots, info.kv_heads, max_len, info.head_size)
        self.k = [np.empty(shape, self.pool_dtype) for _ in range(L)]
        self.v = [np.empty(shape, self.pool_dtype) for _ in range(L)]
        for arr in (*self.k, *self.v):
            arr.fill(0)  # NOTE: touch every page now; fresh pages make the first prefill ~1.6x slower
        # Block views of the pools, (slots, kv_heads, blocks, tokens_per_block, head_dim): a run of cached blocks
        # moves between a slot and the store in one strided copy per layer and K/V (views of contiguous arrays).
        bs = tokens_per_block
        self._block_views = (
            [
                (
                    k.reshape(num_slots, info.kv_heads, max_len // bs, bs, info.head_size),
                    v.reshape(num_slots, info.kv_heads, max_len // bs, bs, info.head_size),
                )
                for k, v in zip(self.k, self.v, strict=True)
            ]
            if max_len % bs == 0
            else None
        )
        self.slot_len = [0] * num_slots
        raw = None if self.pool_dtype == np.float32 else self.pool_dtype
        store_dtype = kv_dtype if raw is None else _RAW_NAMES[raw.name]
        block_bytes = bytes_per_block(store_dtype, L, info.kv_heads, tokens_per_block, info.head_size)
        self.num_blocks = store_max_bytes // block_bytes
        self.blocks = BlockData(
            kv_dtype,
            self.num_blocks,
            L,
            info.kv_heads,
            tokens_per_block,
            info.head_size,
            kv_scales,
            raw,
            max_copy_tokens=max_len,
        )
        self.block_memory: BlockData | None = self.blocks
        self._empty_past = np.zeros((1,), self.pool_dtype)
        self._names = [
            (
                info.past_key_fmt % i,
                info.past_value_fmt % i,
                info.present_key_fmt % i,
                info.present_value_fmt % i,
            )
            for i in range(L)
        ]

    def expect_drafts(self, max_draft_len: int) -> bool:
        """Never called: this runner does not verify drafts (the engine refuses `speculative` first)."""
        return False

    def close(self) -> None:
        self.session = None

    # ------------------------------------------------------------------ plan execution
    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]:
        """Run one step: loads, prefills, decodes, saves. Returns the last-position logits row per sampled request.

        With a `trace`, the time of each phase (and of each prefill run) is recorded in it."""
        out: dict[str, np.ndarray] = {}
        t = now_ns()
        for slot, start, ids in block_runs(plan.loads, self.tokens_per_block):
            self._load_blocks(ids, slot, start)
        fresh, single = self._group_prefills(plan.prefills)
        if trace is not None:
            trace.loads, trace.load_ns = len(plan.loads), now_ns() - t
        for group in fresh:
            t = now_ns()
            out.update(self._prefill_fresh(group))
            if trace is not None:
                n = sum(len(c.token_ids) for c in group)
                trace.prefills.append((len(group), n, 0, now_ns() - t, tuple(c.request_id for c in group)))
        for chunk in single:
            t = now_ns()
            logits = self._prefill_slot(chunk)
            if chunk.sample:
                out[chunk.request_id] = logits
            if trace is not None:
                n = len(chunk.token_ids)
                trace.prefills.append((1, n, chunk.start, now_ns() - t, (chunk.request_id,)))
        if plan.decodes:
            t = now_ns()
            decoded, rows, width = self._decode(plan)
            out.update(decoded)
            if trace is not None:
                trace.decode = (len(plan.decodes), rows, width, now_ns() - t)
        t = now_ns()
        for slot, start, ids in block_runs(plan.saves, self.tokens_per_block):
            self._save_blocks(ids, slot, start)
        if trace is not None:
            trace.saves, trace.save_ns = len(plan.saves), now_ns() - t
        return out

    def _group_prefills(
        self, chunks: list[PrefillChunk]
    ) -> tuple[list[list[PrefillChunk]], list[PrefillChunk]]:
        whole = sorted((c for c in chunks if c.start == 0 and c.sample), key=lambda c: len(c.token_ids))
        single = [c for c in chunks if not (c.start == 0 and c.sample)]
        groups: list[list[PrefillChunk]] = []
        for c in whole:
            if groups:
                g = groups[-1]
                real = sum(len(x.token_ids) for x in g) + len(c.token_ids)
                if real >= (1 - _MAX_PADDING) * len(c.token_ids) * (len(g) + 1):
                    g.append(c)
                    continue
            groups.append([c])
        fresh = [g for g in groups if len(g) > 1]
        single += [g[0] for g in groups if len(g) == 1]
        return fresh, single

    def _bind_common(
        self, binding: ort.IOBinding, ids: np.ndarray, mask: np.ndarray, rows: list[int]
    ) -> np.ndarray:
        """Bind ids, mask (and positions); returns the logits buffer: [B, 1, V] holding row `rows[b]` of each
        sequence with the last-logits graph, else [B, S, V]."""
        B, S = ids.shape
        if self.last_only:
            flat = np.asarray([b * S + r for b, r in enumerate(rows)], np.int64)
            binding.bind_cpu_input(last_logits.POSITIONS_INPUT, flat)
            logits = np.empty((B, 1, self.vocab_size), np.float32)
        else:
            logits = np.empty((B, S, self.vocab_size), np.float32)
        binding.bind_cpu_input(self.info.input_ids_name, ids)
        binding.bind_cpu_input(self.info.attention_mask_name, mask)
        if self.has_position_ids:  # graphs that did not derive positions from the mask
            total = mask.sum(axis=1, keepdims=True)
            S = ids.shape[1]
            start = np.zeros_like(total) if mask.shape[1] == S else total - S
            binding.bind_cpu_input(
                "position_ids", np.maximum(start + np.arange(S)[None, :], 0).astype(np.int64)
            )
        binding.bind_output(
            self.info.logits_name, "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data
        )
        return logits

    def _row(self, logits: np.ndarray, b: int, position: int) -> np.ndarray:
        return logits[b, 0] if self.last_only else logits[b, position]

    @staticmethod
    def _bind_array(binding: ort.IOBinding, name: str, arr: np.ndarray, output: bool) -> None:
        if output:
            binding.bind_output(name, "cpu", 0, arr.dtype.type, list(arr.shape), arr.ctypes.data)
        else:
            binding.bind_input(name, "cpu", 0, arr.dtype.type, list(arr.shape), arr.ctypes.data)

    def _run_pooled(self, lo: int, hi: int, ids: np.ndarray, mask: np.ndarray, rows: list[int]) -> np.ndarray:
        """Run over slots [lo, hi) with past and present bound to the pools (in-place KV writes)."""
        binding = self.session.io_binding()
        logits = self._bind_common(binding, ids, mask, rows)
        for layer, (pk, pv, ok, ov) in enumerate(self._names):
            kview, vview = self.k[layer][lo:hi], self.v[layer][lo:hi]
            self._bind_array(binding, pk, kview, False)
            self._bind_array(binding, pv, vview, False)
            self._bind_array(binding, ok, kview, True)
            self._bind_array(binding, ov, vview, True)
        self.session.run_with_iobinding(binding)
        return logits

    def _prefill_slot(self, chunk: PrefillChunk) -> np.ndarray:
        """B=1 prefill of a chunk at [start, start + n) of its slot; returns the last row of logits."""
        n = len(chunk.token_ids)
        ids = np.asarray(chunk.token_ids, np.int64)[None, :]
        mask = np.ones((1, chunk.start + n), np.int64)
        logits = self._run_pooled(chunk.slot, chunk.slot + 1, ids, mask, [n - 1])
        self.slot_len[chunk.slot] = chunk.start + n
        return self._row(logits, 0, n - 1)

    def _prefill_fresh(self, group: list[PrefillChunk]) -> dict[str, np.ndarray]:
        """Right-padded batch of prompts without a past into scratch present buffers, then copied into slots."""
        info = self.info
        B = len(group)
        lens = [len(c.token_ids) for c in group]
        S = max(lens)
        ids = np.zeros((B, S), np.int64)
        mask = np.zeros((B, S), np.int64)
        for b, c in enumerate(group):
            ids[b, : lens[b]] = c.token_ids
            mask[b, : lens[b]] = 1
        binding = self.session.io_binding()
        logits = self._bind_common(binding, ids, mask, [n - 1 for n in lens])
        past_shape = [B, info.kv_heads, 0, info.head_size]
        present = []
        for pk, pv, ok, ov in self._names:
            pk_arr = np.empty((B, info.kv_heads, S, info.head_size), self.pool_dtype)
            pv_arr = np.empty_like(pk_arr)
            for name in (pk, pv):
                binding.bind_input(
                    name, "cpu", 0, self.pool_dtype.type, past_shape, self._empty_past.ctypes.data
                )
            self._bind_array(binding, ok, pk_arr, True)
            self._bind_array(binding, ov, pv_arr, True)
            present.append((pk_arr, pv_arr))
        self.session.run_with_iobinding(binding)
        out = {}
        for b, c in enumerate(group):
            n = lens[b]
            for layer, (pk_arr, pv_arr) in enumerate(present):
                self.k[layer][c.slot, :, :n] = pk_arr[b, :, :n]
                self.v[layer][c.slot, :, :n] = pv_arr[b, :, :n]
            self.slot_len[c.slot] = n
            out[c.request_id] = self._row(logits, b, n - 1)
        return out

    def _decode(self, plan: SchedulerOutput) -> tuple[dict[str, np.ndarray], int, int]:
        """One decode run; returns the logits rows, the rows run and the context width."""
        items = {d.slot: d for d in plan.decodes}
        lo, hi = min(items), max(items) + 1
        ids = np.zeros((hi - lo, 1), np.int64)
        lens = []
        for s in range(lo, hi):
            item = items.get(s)
            if item is not None:
                ids[s - lo, 0] = item.token_id
                lens.append(item.position)
            else:  # dummy row: writes at the slot's current length, which is never read
                lens.append(min(self.slot_len[s], self.max_len - 1))
        mask = np.zeros((hi - lo, max(lens) + 1), np.int64)
        for r, n in enumerate(lens):
            mask[r, : n + 1] = 1
        logits = self._run_pooled(lo, hi, ids, mask, [0] * (hi - lo))
        out = {}
        for s, item in items.items():
            self.slot_len[s] = item.position + 1
            out[item.request_id] = self._row(logits, s - lo, 0)
        return out, hi - lo, mask.shape[1]

    # ------------------------------------------------------------------ prefix store copies
    def _load_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        n, bs = len(block_ids), self.tokens_per_block
        kv = self.blocks.read_many(block_ids)  # (n, L, 2, heads, bs, head_dim)
        if self._block_views is not None:
            b0 = start // bs
            for layer, (kb, vb) in enumerate(self._block_views):
                kb[slot, :, b0 : b0 + n] = kv[:, layer, 0].transpose(1, 0, 2, 3)
                vb[slot, :, b0 : b0 + n] = kv[:, layer, 1].transpose(1, 0, 2, 3)
        else:
            for i in range(n):
                s, e = start + i * bs, start + (i + 1) * bs
                for layer in range(self.info.num_layers):
                    self.k[layer][slot, :, s:e] = kv[i, layer, 0]
                    self.v[layer][slot, :, s:e] = kv[i, layer, 1]
        self.slot_len[slot] = start + n * bs

    def _save_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        n, bs, info = len(block_ids), self.tokens_per_block, self.info
        kv = self.blocks.staging(n)  # (n, L, 2, heads, bs, head_dim) in the pool dtype
        if self._block_views is not None:
            b0 = start // bs
            for layer, (kb, vb) in enumerate(self._block_views):
                kv[:, layer, 0] = kb[slot, :, b0 : b0 + n].transpose(1, 0, 2, 3)
                kv[:, layer, 1] = vb[slot, :, b0 : b0 + n].transpose(1, 0, 2, 3)
        else:
            for i in range(n):
                s, e = start + i * bs, start + (i + 1) * bs
                for layer in range(info.num_layers):
                    kv[i, layer, 0] = self.k[layer][slot, :, s:e]
                    kv[i, layer, 1] = self.v[layer][slot, :, s:e]
        self.blocks.write_many(block_ids, kv)
