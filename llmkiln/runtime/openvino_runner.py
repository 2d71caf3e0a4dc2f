"""The OpenVINO PagedAttention runner of backend openvino-cpu (the path the kernel study picked,
docs/cpu-engine.md). The only runtime module that imports openvino.

The engine folder's IR (llmkiln.build.openvino_export: the checkpoint's fp32 weights, SDPA attention over a
stateful past) is turned into OpenVINO's PagedAttention graph at load by its own `paged_attention_transformation`
(what openvino-genai applies) and given a `logits_indices` input so the LM head runs only on the sampled rows,
then compiled for the CPU in the recipe's precision (fp32, or bf16: AVX512-BF16 / AMX products and bf16 KV).
One `execute` = one infer request over every sequence of the plan — prefill chunks on any past (several prompts'
suffixes in one call) and decode tokens, concatenated (varlen), each with its past length and block table. KV
lives in per-layer block pools [blocks, kv_heads, block_size, head_dim] in the inference precision. Slot s owns
a fixed run of private blocks, and its block table starts as that run (the Runner protocol's slot semantics).

Prefix hits are shared by block table, not copied per request: the pool has a second part of *shared* blocks,
each holding one OpenVINO block (32 tokens here, two or more store blocks) of a stored prefix, keyed by the
chained hash of its last store block (which determines every token up to its end, so equal keys mean equal KV).
A load that covers a whole OpenVINO block points the slot's table at the shared block — materialized from the
store the first time (the same conversion as a copy), reused by every later request with that prefix — and a
prompt block a slot has just computed and saved is promoted to a shared block (or pointed at the one already
holding that content), so eight requests on one system prompt read one copy of its KV in each decode step
instead of eight. A block the slot
must write into (its prefill or decode positions, a partial load) is first made private again: its content is
copied out of the shared block only when the slot still needs tokens in it before the write (copy-on-write).
Shared blocks are reference-counted by the tables that point at them and evicted least recently used when none
does. Saves read through the table. Results are the same as with copies (tests).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from pathlib import Path

import ml_dtypes
import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino._offline_transformations import paged_attention_transformation

from llmkiln.capabilities import OPENVINO_STORE_DTYPES
from llmkiln.errors import CpuLacksFeature
from llmkiln.runtime.kv_quant import BlockData, bytes_per_block
from llmkiln.runtime.plan import BlockCopy, SchedulerOutput, block_runs
from llmkiln.runtime.profile import StepTrace, now_ns

PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


def _last_rows_only(model: ov.Model) -> None:
    """LM head only on the rows named by a new input `logits_indices` (openvino-genai's slice-before-matmul)."""
    node = model.output("logits").get_node()
    while node.get_type_name() != "MatMul":
        node = node.input_value(0).get_node()
    idx = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    idx.output(0).get_tensor().set_names({"logits_indices"})
    node.input(0).replace_source_output(ops.gather(node.input_value(0), idx, 0).output(0))
    model.add_parameters([idx])
    model.validate_nodes_and_infer_types()


def cpu_capabilities(core: ov.Core | None = None) -> tuple[str, list[str]]:
    """(CPU name, OpenVINO's OPTIMIZATION_CAPABILITIES of it: e.g. FP32, INT8, BF16 — BF16 only where the CPU
    has AVX512-BF16 or AMX)."""
    core = core or ov.Core()
    return str(core.get_property("CPU", "FULL_DEVICE_NAME")), [
        str(c) for c in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    ]


def require_precision(precision: str, core: ov.Core | None = None) -> None:
    """CpuLacksFeature (exit 2) when `precision` needs what this CPU does not have. OpenVINO's CPU plugin has no
    bf16 path on an AVX2-only CPU: its PagedAttention refuses a bf16 KV cache there ("expect kvcache type f32"),
    so a bf16 recipe is refused up front with what to do instead, not with a kernel's assertion."""
    if precision != "bf16":
        return
    name, caps = cpu_capabilities(core)
    if "BF16" not in caps:
        raise CpuLacksFeature(
            f"precision bf16 (backend openvino-cpu) needs a CPU with bf16 arithmetic (AVX512-BF16 or AMX); this "
            f"one ({name}; OpenVINO's capabilities: {', '.join(caps)}) has none. Use the recipe's fp32 sibling "
            "(e.g. smollm2-ov-fp32, precision: fp32), or build and serve on such a CPU"
        )


class OpenVinoPagedRunner:
    """The Runner protocol (runtime.engine.Runner) on OpenVINO's PagedAttention graph: one infer per plan."""

    batches_prefills_with_past = True
    mixes_decodes_with_prefills = True  # decode rows ride in the prefill run's infer call

    def __init__(
        self,
        model_xml: Path,
        num_slots: int,
        max_len: int,
        tokens_per_block: int,
        store_max_bytes: int,
        kv_dtype: str = "fp32",
        precision: str = "fp32",
        threads: int = 0,
    ) -> None:
        if kv_dtype not in OPENVINO_STORE_DTYPES:
            raise ValueError(
                f"kv_cache.dtype {kv_dtype!r}: the OpenVINO runner stores {' or '.join(OPENVINO_STORE_DTYPES)}"
            )
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: the OpenVINO runner runs {' or '.join(PRECISIONS)}")
        core = ov.Core()
        require_precision(precision, core)
        model = core.read_model(str(model_xml))
        paged_attention_transformation(model, False, False, False, False, False, False)
        _last_rows_only(model)
        prec = PRECISIONS[precision]
        cfg: dict[str, object] = {"INFERENCE_PRECISION_HINT": prec, "KV_CACHE_PRECISION": prec}
        if threads:
            cfg["INFERENCE_NUM_THREADS"] = threads
        self.compiled = core.compile_model(model, "CPU", cfg)
        self.req = self.compiled.create_infer_request()
        cache_inputs = [i for i in self.compiled.inputs if i.get_any_name().startswith("key_cache.")]
        dims = list(cache_inputs[0].get_partial_shape())[
            1:
        ]  # [blocks (dynamic), kv_heads, block_size, head_dim]
        self.kv_heads, self.block_size, self.head_dim = (d.get_length() for d in dims)
        self.num_layers = len(cache_inputs)
        self.cache_type = cache_inputs[0].get_element_type()
        self.num_slots, self.max_len, self.tokens_per_block = num_slots, max_len, tokens_per_block
        self.blocks_per_slot = bps = -(-max_len // self.block_size)
        block_bytes = bytes_per_block(
            kv_dtype, self.num_layers, self.kv_heads, tokens_per_block, self.head_dim
        )
        self.num_blocks = store_max_bytes // block_bytes
        # shared blocks: as many tokens as the store holds, when store blocks tile OpenVINO's blocks
        shareable = self.block_size % tokens_per_block == 0
        num_shared = self.num_blocks * tokens_per_block // self.block_size if shareable else 0
        self.shared = _SharedBlocks(num_slots * bps, num_shared)
        self.tables = [[s * bps + j for j in range(bps)] for s in range(num_slots)]
        shape = [num_slots * bps + num_shared, self.kv_heads, self.block_size, self.head_dim]
        self.k: list[np.ndarray] = []  # numpy views of the OpenVINO tensors (bf16 via ml_dtypes)
        self.v: list[np.ndarray] = []
        self._tensors: list[ov.Tensor] = []
        bf16 = self.cache_type == ov.Type.bf16
        for layer in range(self.num_layers):
            for name, pools in ((f"key_cache.{layer}", self.k), (f"value_cache.{layer}", self.v)):
                tensor = ov.Tensor(self.cache_type, shape)  # OpenVINO's own allocation (aligned as it wants)
                arr = tensor.data.view(np.uint16).view(ml_dtypes.bfloat16) if bf16 else tensor.data
                arr[...] = 0  # touch every page now (as the onnxruntime runner does)
                self.req.set_tensor(name, tensor)
                self._tensors.append(tensor)
                pools.append(arr)
        self.vocab_size = int(self.compiled.output("logits").get_partial_shape()[-1].get_length())
        self.blocks = BlockData(
            kv_dtype,
            self.num_blocks,
            self.num_layers,
            self.kv_heads,
            tokens_per_block,
            self.head_dim,
            None,
            None,
            max_copy_tokens=max_len,
        )

    def close(self) -> None:
        """Free every OpenVINO object now, on the closing thread: left to the garbage collector, they would be
        destroyed on whichever thread it runs in later (a client thread of another test crashed that way)."""
        self.k, self.v = [], []  # numpy views of the pool tensors
        self._tensors = []
        self.req = None
        self.compiled = None

    def _table(self, slot: int, length: int) -> list[int]:
        return self.tables[slot][: -(-length // self.block_size)]

    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]:
        t = now_ns()
        self._load(plan.loads)
        if trace is not None:
            trace.loads, trace.load_ns = len(plan.loads), now_ns() - t
        seqs: list[tuple[str, tuple[int, ...], int, int]] = []  # (request id, new tokens, past length, slot)
        for c in plan.prefills:
            seqs.append((c.request_id, c.token_ids, c.start, c.slot))
        for d in plan.decodes:
            seqs.append((d.request_id, (d.token_id,), d.position, d.slot))
        out: dict[str, np.ndarray] = {}
        if seqs:
            t = now_ns()
            logits = self._run(seqs)
            sampled = {c.request_id for c in plan.prefills if c.sample} | {d.request_id for d in plan.decodes}
            out = {rid: logits[i] for i, (rid, *_) in enumerate(seqs) if rid in sampled}
            if trace is not None:
                ns = now_ns() - t
                if plan.prefills:
                    n = sum(len(c.token_ids) for c in plan.prefills)
                    past = max(c.start for c in plan.prefills)
                    trace.prefills.append(
                        (len(plan.prefills), n, past, ns, tuple(c.request_id for c in plan.prefills))
                    )
                if plan.decodes:
                    width = max(d.position for d in plan.decodes) + 1
                    trace.decode = (len(plan.decodes), len(plan.decodes), width, 0 if plan.prefills else ns)
        t = now_ns()
        for slot, start, block_ids in block_runs(plan.saves, self.tokens_per_block):
            self._save_blocks(block_ids, slot, start)
        for save in plan.saves:  # a whole OpenVINO block of a prompt just computed: share it from now on
            if (
                save.key
                and self.shared.capacity
                and (save.start + self.tokens_per_block) % self.block_size == 0
            ):
                self._promote(save.slot, save.start // self.block_size, save.key)
        if trace is not None:
            trace.saves, trace.save_ns = len(plan.saves), now_ns() - t
        return out

    def prompt_logits(self, ids: list[int], slot: int = 0) -> np.ndarray:
        """Logits at every position of one prompt computed from scratch in `slot` ([len(ids), vocab]; the
        quality diff's scorer)."""
        return self._run([("", tuple(ids), 0, slot)], all_rows=True)

    def next_logits(self, token: int, position: int, slot: int = 0) -> np.ndarray:
        """Logits after one more token at `position` of the sequence in `slot` (a greedy loop's step)."""
        return self._run([("", (token,), position, slot)])[0]

    def _run(self, seqs: list[tuple[str, tuple[int, ...], int, int]], all_rows: bool = False) -> np.ndarray:
        for _, toks, p, slot in seqs:  # the blocks each sequence writes into are the slot's own
            bs = self.block_size
            for j in range(p // bs, (p + len(toks) - 1) // bs + 1):
                self._own(slot, j, keep=j * bs < p)
        ids = np.concatenate([np.asarray(toks, np.int64) for _, toks, _, _ in seqs])
        pos = np.concatenate([np.arange(p, p + len(toks), dtype=np.int64) for _, toks, p, _ in seqs])
        begins = np.cumsum([0] + [len(toks) for _, toks, _, _ in seqs]).astype(np.int32)
        tables = [self._table(slot, p + len(toks)) for _, toks, p, slot in seqs]
        feeds = {
            "input_ids": ids,
            "position_ids": pos,
            "past_lens": np.asarray([p for _, _, p, _ in seqs], np.int32),
            "subsequence_begins": begins,
            "block_indices": np.concatenate([np.asarray(tb, np.int32) for tb in tables]),
            "block_indices_begins": np.cumsum([0] + [len(tb) for tb in tables]).astype(np.int32),
            "max_context_len": np.asarray(max(p + len(toks) for _, toks, p, _ in seqs), np.int32),
            "logits_indices": np.arange(len(ids), dtype=np.int64)
            if all_rows
            else (begins[1:] - 1).astype(np.int64),
        }
        for name, value in feeds.items():
            self.req.set_tensor(name, ov.Tensor(value))
        self.req.infer()
        return np.array(self.req.get_tensor("logits").data[:, 0], dtype=np.float32)

    # ------------------------------------------------------------------ prefix store: shared blocks, copies
    def _private(self, slot: int, j: int) -> int:
        """The pool block the slot owns for its table entry j."""
        return slot * self.blocks_per_slot + j

    def _copy_block(self, src: int, dst: int) -> None:
        for pool in (*self.k, *self.v):
            pool[dst] = pool[src]

    def _own(self, slot: int, j: int, keep: bool) -> None:
        """Make block j of the slot's table private (copying the shared content in when `keep`)."""
        private = self._private(slot, j)
        current = self.tables[slot][j]
        if current == private:
            return
        if keep:
            self._copy_block(current, private)
        self.shared.unref(current)
        self.tables[slot][j] = private

    def _point(self, slot: int, j: int, sid: int) -> None:
        current = self.tables[slot][j]
        if current == sid:
            return
        self.shared.ref(sid)
        if current != self._private(slot, j):
            self.shared.unref(current)
        self.tables[slot][j] = sid

    def _promote(self, slot: int, j: int, key: int) -> None:
        """Block j of the slot, complete prompt KV with content `key`: point the table at the shared block of that
        content (made from this one if there is none), so later requests, and this slot's next ones, read one copy."""
        current = self.tables[slot][j]
        if current != self._private(slot, j):
            return  # shared already
        sid = self.shared.get(key)
        if sid is None:
            sid = self.shared.add(key)
            if sid is None:
                return
            self._copy_block(current, sid)
        self._point(slot, j, sid)

    def _load(self, loads: list[BlockCopy]) -> None:
        """Store blocks into slots: whole OpenVINO blocks by shared block, the rest by copy."""
        bs, tpb = self.block_size, self.tokens_per_block
        per = bs // tpb if self.shared.capacity else 0
        by_slot: dict[int, dict[int, BlockCopy]] = {}
        for c in loads:
            by_slot.setdefault(c.slot, {})[c.start] = c
        for slot, starts in by_slot.items():
            copies: list[BlockCopy] = []
            for j in sorted({start // bs for start in starts}):
                group = [starts[j * bs + i * tpb] for i in range(per) if j * bs + i * tpb in starts]
                if per and len(group) == per and group[-1].key:
                    sid = self.shared.get(group[-1].key)
                    if sid is None and (sid := self.shared.add(group[-1].key)) is not None:
                        self._write([g.block_id for g in group], np.full(bs, sid), np.arange(bs))
                    if sid is not None:
                        self._point(slot, j, sid)
                        continue
                self._own(slot, j, keep=True)  # a partial block: the slot's own, copied into
                copies += [starts[j * bs + i] for i in range(0, bs, tpb) if j * bs + i in starts]
            for s, start, ids in block_runs(copies, tpb):
                self._load_blocks(ids, s, start)

    def _positions(self, slot: int, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        p = np.arange(start, start + n)
        return np.asarray(self.tables[slot])[p // self.block_size], p % self.block_size

    def _load_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        self._write(block_ids, *self._positions(slot, start, len(block_ids) * self.tokens_per_block))

    def _write(self, block_ids: list[int], blk: np.ndarray, off: np.ndarray) -> None:
        """Store blocks' KV into pool positions (block, offset), one per token."""
        kv = self.blocks.read_many(block_ids)  # (n, L, 2, heads, bs, head_dim)
        n = len(block_ids) * self.tokens_per_block
        for layer in range(self.num_layers):
            for j, pool in enumerate((self.k[layer], self.v[layer])):
                vals = kv[:, layer, j].transpose(0, 2, 1, 3).reshape(n, self.kv_heads, self.head_dim)
                pool[blk, :, off] = vals.astype(pool.dtype)

    def _save_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        nb, bs = len(block_ids), self.tokens_per_block
        blk, off = self._positions(slot, start, nb * bs)
        kv = self.blocks.staging(nb)  # (nb, L, 2, heads, bs, head_dim) float32
        for layer in range(self.num_layers):
            for j, pool in enumerate((self.k[layer], self.v[layer])):
                vals = pool[blk, :, off].astype(np.float32)  # (n, heads, head_dim)
                kv[:, layer, j] = vals.reshape(nb, bs, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        self.blocks.write_many(block_ids, kv)


class _SharedBlocks:
    """Pool blocks [first, first + capacity) holding stored prefixes, by content key; reference-counted by the
    slots' tables, least recently used first out among the unreferenced."""

    def __init__(self, first: int, capacity: int) -> None:
        self.capacity = capacity
        self.free = list(range(first + capacity - 1, first - 1, -1))
        self.by_key: OrderedDict[int, int] = OrderedDict()
        self.refs: Counter[int] = Counter()

    def get(self, key: int) -> int | None:
        sid = self.by_key.get(key)
        if sid is not None:
            self.by_key.move_to_end(key)
        return sid

    def add(self, key: int) -> int | None:
        """A block for new content `key` (None: every block is in use)."""
        if not self.free:
            victim = next((k for k, sid in self.by_key.items() if not self.refs[sid]), None)
            if victim is None:
                return None
            self.free.append(self.by_key.pop(victim))
        sid = self.free.pop()
        self.by_key[key] = sid
        return sid

    def ref(self, sid: int) -> None:
        self.refs[sid] += 1

    def unref(self, sid: int) -> None:
        self.refs[sid] -= 1
        if self.refs[sid] <= 0:
            del self.refs[sid]
