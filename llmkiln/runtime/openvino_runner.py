"""The OpenVINO PagedAttention runner of backend openvino-cpu (the path the kernel study picked,
docs/cpu-engine.md). With runtime.cascade_attention (its extension op), the only runtime modules that import
openvino.

The engine folder's IR (llmkiln.build.openvino_export: the checkpoint's fp32 weights, SDPA attention over a
stateful past) is turned into OpenVINO's PagedAttention graph at load by its own `paged_attention_transformation`
(what openvino-genai applies) and given a `logits_indices` input so the LM head runs only on the sampled rows,
then compiled for the CPU in the recipe's precision (fp32, or bf16: AVX512-BF16 / AMX products and bf16 KV).
One `execute` = one infer request over every sequence of the plan — prefill chunks on any past (several prompts'
suffixes in one call) and decode tokens, concatenated (varlen), each with its past length and block table.

A paged runner (`paged_kv`): its KV pools, per layer [blocks, kv_heads, block_size, head_dim] in the inference
precision, ARE the KV cache manager's blocks (runtime.kv_blocks.BlockStore, `num_blocks` of them, one OpenVINO
block each, so kv_cache.tokens_per_block is OpenVINO's block size). The scheduler gives every sequence its block
table in the plan — cached prefix blocks shared by many requests, then the request's own — and this runner only
executes it: no slot memory, no loads, and saves need nothing here (a prompt block is written in place and the
manager publishes it); the only copy is copy-on-write of one block when a prompt leaves a cached chain inside it. The pools are sized for the scheduler's worst case (every slot at max_seq_len)
plus kv_cache.max_bytes of cached prefixes; `block_memory` exposes them to the KV transfer (NIXL reads and
writes the blocks themselves).

A prompt graph (recipe `scheduler.prompt_graph`): OpenVINO's CPU plugin re-derives every node's shapes and
buffers when a graph's token count changes, and the state is the compiled model's (a second infer request of it
does not help), so a decode step after a mixed one (decodes + a prompt chunk) paid the change back. With it, runs
that carry prompt tokens go to a compiled copy of their graph (of each: PagedAttention's and the cascade one) and
decode-only runs keep their steady shape. It costs the memory of one more compiled copy of the weights per graph.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import ml_dtypes
import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino._offline_transformations import paged_attention_transformation

from llmkiln.cpu_features import detect
from llmkiln.env_switch import env_switch
from llmkiln.errors import BadInput, CpuLacksFeature
from llmkiln.runtime import cascade_attention, run_padding, signal_stack
from llmkiln.runtime.block_memory import PagedPools
from llmkiln.runtime.openvino_settings import REPORTED_PROPERTIES, choose
from llmkiln.runtime.plan import SchedulerOutput
from llmkiln.runtime.profile import StepTrace, now_ns
from llmkiln.runtime.run_padding import RunPadding

log = logging.getLogger(__name__)

# on/off over the recipe's scheduler.prompt_graph (llmkiln.env_switch), for A/B measurements
PROMPT_GRAPH_ENV = "LLMKILN_PROMPT_GRAPH"


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


def ir_weights(model: ov.Model) -> str:
    """What the IR's weights are: int8 where it holds u8 constants (NNCF's compression, recipe `weights: int8`;
    llmkiln.build.openvino_weights), else checkpoint (the export's fp32, bit for bit the checkpoint's)."""
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.u8:
            return "int8"
    return "checkpoint"


def _unfuse_mlp(model: ov.Model) -> int:
    """Give every one-input Swish its explicit beta of 1.0 (the same function), so the CPU plugin's AMX MLP fusion
    does not match (runtime.openvino_settings: it crashes with one thread). Returns how many it changed."""
    n = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Swish" and op.get_input_size() == 1:
            swish = ops.swish(op.input_value(0), np.float32(1.0))
            swish.set_friendly_name(op.get_friendly_name())
            op.output(0).replace(swish.output(0))
            n += 1
    model.validate_nodes_and_infer_types()
    return n


def _in_force(compiled: ov.CompiledModel) -> dict[str, str]:
    """What the compiled model says it runs with (REPORTED_PROPERTIES it supports)."""
    supported = set(compiled.get_property("SUPPORTED_PROPERTIES"))
    out = {}
    for name in REPORTED_PROPERTIES:
        if name in supported:
            value = compiled.get_property(name)
            if isinstance(value, ov.Type):
                out[name] = value.get_type_name()
            elif isinstance(value, (str, bool, int, float)):
                out[name] = str(value)
            else:  # an enum (SchedulingCoreType.ANY_CORE): its member's name
                out[name] = str(value).rsplit(".", 1)[-1]
    return out


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
    """The Runner protocol (runtime.plan.Runner) on OpenVINO's PagedAttention graph: one infer per plan."""

    batches_prefills_with_past = True
    mixes_decodes_with_prefills = True  # decode rows ride in the prefill run's infer call
    paged_kv = True
    verifies_drafts = (
        True  # a decode with drafts is one more varlen sequence of 1 + drafts tokens on its past
    )

    # the CPU plugin a Core creates swaps the thread's alternate signal stack (runtime.signal_stack)
    @signal_stack.kept()
    def __init__(
        self,
        model_xml: Path,
        num_slots: int,
        max_len: int,
        tokens_per_block: int | None,
        store_max_bytes: int,
        precision: str = "fp32",
        threads: int = 0,
        cascade: bool = False,
        prompt_graph: bool = False,
        compile_extra: Mapping[str, object] | None = None,
    ) -> None:
        core = ov.Core()
        require_precision(precision, core)
        model = core.read_model(str(model_xml))
        settings = choose(
            detect(), precision, threads, weights=ir_weights(model), extra=compile_extra
        )  # ValueError: bad precision
        paged_attention_transformation(model, False, False, False, False, False, False)
        _last_rows_only(model)
        if settings.unfuse_mlp:
            _unfuse_mlp(model)
        log.info(
            "compiling %s for the CPU (%s, %s, %d thread(s)%s)",
            model_xml.name,
            settings.cpu.model,
            precision,
            settings.effective_threads,
            "; " + "; ".join(settings.reasons) if settings.reasons else "",
        )
        for warning in settings.warnings:
            log.warning("%s", warning)
        cascade = cascade_attention.from_env(cascade)
        prompt_graph = env_switch(PROMPT_GRAPH_ENV, prompt_graph)
        source = model.clone() if cascade else None
        self.compiled = core.compile_model(model, "CPU", settings.properties())
        self.settings = replace(settings, in_force=_in_force(self.compiled))
        self.runtime_settings: dict[str, str] = self.settings.describe()
        self.req = self.compiled.create_infer_request()
        cache_inputs = [i for i in self.compiled.inputs if i.get_any_name().startswith("key_cache.")]
        dims = list(cache_inputs[0].get_partial_shape())[
            1:
        ]  # [blocks (dynamic), kv_heads, block_size, head_dim]
        self.kv_heads, self.block_size, self.head_dim = (d.get_length() for d in dims)
        if tokens_per_block is None:  # a runner outside an engine (the quality diff's scorer): OpenVINO's
            tokens_per_block = self.block_size
        if tokens_per_block != self.block_size:
            raise BadInput(
                f"kv_cache.tokens_per_block: {tokens_per_block}; backend openvino-cpu keeps the KV in OpenVINO's "
                f"blocks of {self.block_size} tokens on this CPU: set kv_cache.tokens_per_block: {self.block_size}"
            )
        self.num_layers = len(cache_inputs)
        self.cache_type = cache_inputs[0].get_element_type()
        self.num_slots, self.max_len, self.tokens_per_block = num_slots, max_len, tokens_per_block
        self.blocks_per_slot = bps = -(-max_len // self.block_size)
        itemsize = self.cache_type.size
        block_bytes = 2 * self.num_layers * self.kv_heads * self.block_size * self.head_dim * itemsize
        # every slot's worst case (the scheduler reserves it at admission) plus the cached prefixes' budget
        self.num_blocks = num_slots * bps + store_max_bytes // block_bytes
        # one block more than the manager's: where a run's padding (runtime.run_padding) writes its KV
        self._pad_block = self.num_blocks
        self.padding: RunPadding = run_padding.from_env()
        self.runtime_settings["run_padding"] = self.padding.describe()
        shape = [self.num_blocks + 1, self.kv_heads, self.block_size, self.head_dim]
        self.k: list[np.ndarray] = []  # numpy views of the OpenVINO tensors (bf16 via ml_dtypes)
        self.v: list[np.ndarray] = []
        self._tensors: list[ov.Tensor] = []
        bf16 = self.cache_type == ov.Type.bf16
        for _layer in range(self.num_layers):  # key then value of each layer: _bind_pools' order
            for pools in (self.k, self.v):
                tensor = ov.Tensor(self.cache_type, shape)  # OpenVINO's own allocation (aligned as it wants)
                arr = tensor.data.view(np.uint16).view(ml_dtypes.bfloat16) if bf16 else tensor.data
                arr[...] = 0  # touch every page now (as the onnxruntime runner does)
                self._tensors.append(tensor)
                pools.append(arr)
        self._bind_pools(self.req)
        # runs that carry prompt tokens get a compiled copy of their own (see the module's docstring)
        self.prompt_req = self._twin(core, model, settings.properties()) if prompt_graph else None
        self.prompt_runs = 0
        # cascade attention (runtime.cascade_attention): a second graph on the same pools, for runs whose sequences
        # share cached blocks
        self.cascade_req: ov.InferRequest | None = None
        self.cascade_prompt_req: ov.InferRequest | None = None
        self.cascade_runs = 0
        cascade_state = "off"
        ext = None
        why_not = cascade_attention.unsupported(settings.cpu, self.head_dim) if source is not None else None
        if why_not is not None:
            log.info("cascade attention is off: %s", why_not)
            cascade_state, source = f"off ({why_not})", None
        if source is not None:
            try:
                ext = cascade_attention.extension()
            except cascade_attention.ExtensionBuildFailed as exc:  # the engine still runs, on PagedAttention
                log.warning("cascade attention is off: %s", exc)
                cascade_state = f"off ({str(exc).splitlines()[0]})"
        if source is not None and ext is not None:
            core.add_extension(str(ext))
            cascade_attention.cascade_model(
                source, ext, self.cache_type, self.kv_heads, self.block_size, self.head_dim
            )
            self.cascade_compiled = core.compile_model(source, "CPU", settings.properties())
            self.cascade_req = self._bind_pools(self.cascade_compiled.create_infer_request())
            if prompt_graph:
                self.cascade_prompt_req = self._twin(core, source, settings.properties())
            self._cascade_inputs = {i.get_any_name() for i in self.cascade_compiled.inputs}
            cascade_state = "on"
        self.runtime_settings["cascade_attention"] = cascade_state
        # which runs take it: limits by what the CPU has and the caches' precision
        self.cascade_routing = cascade_attention.routing(settings.cpu, self.cache_type == ov.Type.bf16)
        if self.cascade_req is not None:
            self.runtime_settings["cascade_routing"] = self.cascade_routing.describe()
        self.runtime_settings["prompt_graph"] = (
            "on (runs with prompt tokens on a compiled copy of their own)" if prompt_graph else "off"
        )
        self.block_memory: PagedPools | None = PagedPools(  # the manager's blocks, not the padding's
            [p[: self.num_blocks] for kv in zip(self.k, self.v, strict=True) for p in kv], precision
        )
        self.vocab_size = int(self.compiled.output("logits").get_partial_shape()[-1].get_length())
        # `prompt_logits` / `next_logits` outside an engine (the quality diff's scorer): the first blocks
        self._scratch = tuple(range(min(bps, self.num_blocks)))

    def expect_drafts(self, max_draft_len: int) -> bool:
        """Speculation is on: pad a lone drafting sequence's runs to a steady 1 + max_draft_len (run_padding);
        True when they are (a lone sequence's drafts are then free)."""
        free = self.padding.for_drafts(max_draft_len)
        self.runtime_settings["run_padding"] = self.padding.describe()
        return free

    @signal_stack.kept()
    def close(self) -> None:
        """Free every OpenVINO object now, on the closing thread: left to the garbage collector, they would be
        destroyed on whichever thread it runs in later (a client thread of another test crashed that way). The CPU
        plugin destroyed with them puts back the alternate signal stack it saved: kept as it was
        (runtime.signal_stack)."""
        self.k, self.v = [], []  # numpy views of the pool tensors
        self.block_memory = None
        self._tensors = []
        self.req = None
        self.compiled = None
        self.prompt_req = None
        self.cascade_req = None
        self.cascade_prompt_req = None
        self.cascade_compiled = None

    def _twin(self, core: ov.Core, model: ov.Model, properties: dict[str, object]) -> ov.InferRequest:
        """An infer request of another compilation of `model` on the same pools (scheduler.prompt_graph)."""
        return self._bind_pools(core.compile_model(model, "CPU", properties).create_infer_request())

    def _bind_pools(self, req: ov.InferRequest) -> ov.InferRequest:
        """Give an infer request the KV pools (every graph of this runner reads and writes the same blocks)."""
        for layer in range(self.num_layers):
            req.set_tensor(f"key_cache.{layer}", self._tensors[2 * layer])
            req.set_tensor(f"value_cache.{layer}", self._tensors[2 * layer + 1])
        return req

    def execute(self, plan: SchedulerOutput, trace: StepTrace | None = None) -> dict[str, np.ndarray]:
        for src, dst in plan.copies:  # copy-on-write of a partly shared block, before the run writes into it
            for pool in (*self.k, *self.v):
                pool[dst] = pool[src]
        tables = plan.block_tables
        seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]] = []  # (id, new tokens, past, table)
        rows: list[int] = []  # logits rows wanted per sequence (its last ones): 0, 1, or 1 + drafts
        for c in plan.prefills:
            seqs.append((c.request_id, c.token_ids, c.start, tables[c.request_id]))
            rows.append(1 if c.sample else 0)
        for d in plan.decodes:
            seqs.append((d.request_id, d.token_ids, d.position, tables[d.request_id]))
            rows.append(len(d.token_ids))
        if not seqs:
            return {}
        t = now_ns()
        logits = self._run(seqs, rows, prompt=bool(plan.prefills))
        out: dict[str, np.ndarray] = {}
        at = 0
        for (rid, *_), n in zip(seqs, rows, strict=True):
            if n:  # a decode with drafts gets all its rows, every other sequence its last one
                out[rid] = logits[at] if n == 1 else logits[at : at + n]
            at += n
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
                run = sum(len(d.token_ids) for d in plan.decodes)  # a decode's token and its drafts
                trace.decode = (len(plan.decodes), run, width, 0 if plan.prefills else ns)
        return out

    def prompt_logits(self, ids: list[int]) -> np.ndarray:
        """Logits at every position of one prompt computed from scratch ([len(ids), vocab]; the quality diff's
        scorer). Only on a runner no engine drives: it writes the first blocks of the pool."""
        return self._run([("", tuple(ids), 0, self._scratch)], [len(ids)])

    def next_logits(self, token: int, position: int) -> np.ndarray:
        """Logits after one more token at `position` of the sequence `prompt_logits` began (a greedy loop's step)."""
        return self._run([("", (token,), position, self._scratch)], [1])[0]

    def _run(
        self,
        seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]],
        rows: list[int],
        cascade: bool | None = None,
        prompt: bool = False,
    ) -> np.ndarray:
        """One infer over the sequences; the logits of the last `rows[i]` tokens of each, in order. A run a few
        tokens short of the recent ones gets them as padding (runtime.run_padding): a sequence of its own in the
        padding block, no logits row. `cascade`: which graph (None: the cascade graph where it pays,
        cascade_attention.worth_it; True needs it loaded); `prompt`: the run carries prompt tokens (it takes the
        graph's prompt copy where there is one)."""
        bs = self.block_size
        extra = self.padding.pad(sum(len(toks) for _, toks, _, _ in seqs))
        if extra:
            seqs, rows = [*seqs, ("", (0,) * extra, 0, (self._pad_block,))], [*rows, 0]
        ids = np.concatenate([np.asarray(toks, np.int64) for _, toks, _, _ in seqs])
        pos = np.concatenate([np.arange(p, p + len(toks), dtype=np.int64) for _, toks, p, _ in seqs])
        begins = np.cumsum([0] + [len(toks) for _, toks, _, _ in seqs]).astype(np.int32)
        used = [table[: -(-(p + len(toks)) // bs)] for _, toks, p, table in seqs]
        feeds = {
            "input_ids": ids,
            "position_ids": pos,
            "past_lens": np.asarray([p for _, _, p, _ in seqs], np.int32),
            "subsequence_begins": begins,
            "block_indices": np.concatenate([np.asarray(tb, np.int32) for tb in used]),
            "block_indices_begins": np.cumsum([0] + [len(tb) for tb in used]).astype(np.int32),
            "max_context_len": np.asarray(max(p + len(toks) for _, toks, p, _ in seqs), np.int32),
            # no row wanted (chunks that do not end their prompt): one anyway, not returned (no empty Gather)
            "logits_indices": np.concatenate(
                [np.arange(end - n, end, dtype=np.int64) for end, n in zip(begins[1:], rows, strict=True)]
            )
            if any(rows)
            else np.zeros(1, np.int64),
        }
        if cascade is None:
            cascade = self.cascade_req is not None and cascade_attention.worth_it(
                seqs, bs, self.cascade_routing
            )
        req, twin = self.req, self.prompt_req
        if cascade:
            if self.cascade_req is None:
                raise ValueError(
                    "this runner has no cascade attention graph (cascade=False, or it is off here)"
                )
            req, twin = self.cascade_req, self.cascade_prompt_req
            self.cascade_runs += 1
            feeds = {k: v for k, v in feeds.items() if k in self._cascade_inputs}
        if prompt and twin is not None:  # the graph's copy for runs with prompt tokens (prompt_graph)
            req = twin
            self.prompt_runs += 1
        for name, value in feeds.items():
            req.set_tensor(name, ov.Tensor(value))
        req.infer()
        return np.array(req.get_tensor("logits").data[: sum(rows), 0], dtype=np.float32)
