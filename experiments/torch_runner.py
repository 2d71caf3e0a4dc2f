"""The torch execution path for the CPU engine (a prototype): a Llama forward over a flat batch of tokens
from several sequences at once, with a slot KV pool, and the attention formulations the builder's
GroupQueryAttention cannot express.

An experiment, not part of the package (experiments/ is not in the wheel): the CPU kernel study
(experiments/cpu_kernel_study.py, docs/cpu-engine.md) and the in-process runner loop (experiments/cpu_runner_loop.py)
drive it; tests/experiments/test_torch_runner.py checks it against transformers and the reference loop.

- `TorchLlama` reads the HF checkpoint (config.json + model.safetensors) as it is: the weights are the source
  tensors (q/k/v and gate/up concatenated, as the onnxruntime-genai builder does), in float32 or cast to bfloat16
  (the bf16 path: a lower precision, judged by the quality diff like int8).
- `forward(ids, positions, attention, sample_rows)` runs every token of the step through the linear layers in one
  matrix product per weight; attention per layer is delegated to an `Attention` object that writes the step's K/V
  into the pool and attends:
  - `SegmentAttention`: each sequence's tokens (a prefill chunk on any cached past, or one decode token) attend
    their own slot's [0, start + n) causally: one flash-attention call per sequence (the varlen batch).
  - `BlockDiagonalAttention`: the same in one SDPA call over the concatenated queries and gathered keys with a
    block-diagonal + causal mask (the varlen formulation as one kernel; it gathers KV and computes masked pairs).
  - `DenseDecodeAttention`: decode rows of contiguous slots in one padded SDPA call (what GQA does today).
  - `CascadeAttention`: the rows share a prefix [0, P) held once (in `prefix_slot`): every row's queries attend it
    in one call (a matrix-matrix product instead of B matrix-vector ones), each row's own tail [P, len) in
    another, merged by log-sum-exp. Works for decode rows and prefill segments alike.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass(frozen=True)
class Segment:
    """Tokens [t0, t0 + n) of the flat batch belong to `slot` at positions [start, start + n)."""

    slot: int
    start: int
    n: int
    t0: int


class Attention(Protocol):
    def __call__(
        self, model: TorchLlama, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] (rotary applied) -> attention output [T, H, D]; writes k/v to the pool."""
        ...


class TorchLlama:
    """A Llama checkpoint with a KV pool of `num_slots` slots of `max_len` tokens, in `dtype`."""

    def __init__(
        self,
        model_dir: Path,
        dtype: str = "fp32",
        num_slots: int = 8,
        max_len: int = 4096,
        linear: str = "onednn",
    ) -> None:
        from safetensors.torch import load_file

        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.dtype = DTYPES[dtype]
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.group = self.heads // self.kv_heads
        self.num_layers = cfg["num_hidden_layers"]
        self.vocab_size = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.num_slots, self.max_len = num_slots, max_len
        sd = load_file(str(Path(model_dir) / "model.safetensors"))
        dt = self.dtype

        def w(name: str) -> torch.Tensor:
            return sd[name].to(dt).contiguous()

        self.embed = w("model.embed_tokens.weight")
        self.lm_head = w("lm_head.weight") if "lm_head.weight" in sd else self.embed
        self.norm = w("model.norm.weight")
        self.layers = []
        self.linear_kind = linear
        self._index_cache: dict[tuple, tuple[torch.Tensor, ...]] = {}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            self.layers.append(
                (
                    w(p + "input_layernorm.weight"),
                    torch.cat([sd[a + n + "_proj.weight"] for n in "qkv"]).to(dt).contiguous(),
                    w(a + "o_proj.weight"),
                    w(p + "post_attention_layernorm.weight"),
                    torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]]).to(dt).contiguous(),
                    w(m + "down_proj.weight"),
                )
            )
        if linear == "onednn":  # weights reordered once into oneDNN's blocked layout (same values)
            self.layers = [tuple(self._pack(t) if t.dim() == 2 else t for t in lay) for lay in self.layers]
            self.lm_head_packed = self._pack(self.lm_head)
        else:
            self.lm_head_packed = self.lm_head
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(dt), emb.sin().to(dt)
        shape = (num_slots, self.kv_heads, max_len, self.head_dim)
        self.k = [torch.zeros(shape, dtype=dt) for _ in range(self.num_layers)]
        self.v = [torch.zeros(shape, dtype=dt) for _ in range(self.num_layers)]

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return packed

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x @ w.T: oneDNN with a pre-packed weight (AVX-512 / AVX512-BF16 whatever the CPU vendor), or
        torch's default (MKL sgemm for fp32, which takes a slower path on non-Intel CPUs)."""
        if self.linear_kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return F.linear(x, w)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    @torch.no_grad()
    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attention: Attention, sample_rows: torch.Tensor
    ) -> torch.Tensor:
        """ids, positions [T] int64; returns float32 logits [len(sample_rows), vocab] of those flat rows."""
        T = ids.shape[0]
        H, KVH, D = self.heads, self.kv_heads, self.head_dim
        x = self.embed[ids]
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        nq, nk = H * D, KVH * D
        for layer, (ln1, wqkv, wo, ln2, wgu, wd) in enumerate(self.layers):
            h = self._rms(x, ln1)
            qkv = self._linear(h, wqkv)
            q = self._rope(qkv[:, :nq].view(T, H, D), cos, sin)
            k = self._rope(qkv[:, nq : nq + nk].view(T, KVH, D), cos, sin)
            v = qkv[:, nq + nk :].view(T, KVH, D)
            o = attention(self, layer, q, k, v)
            x = x + self._linear(o.reshape(T, nq), wo)
            h = self._rms(x, ln2)
            gu = self._linear(h, wgu)
            inter = gu.shape[-1] // 2
            x = x + self._linear(F.silu(gu[:, :inter]) * gu[:, inter:], wd)
        x = self._rms(x[sample_rows], self.norm)
        return self._linear(x, self.lm_head_packed).float()

    # ---------------------------------------------------------------- KV helpers used by the attentions
    def write_kv(self, layer: int, segments: Sequence[Segment], k: torch.Tensor, v: torch.Tensor) -> None:
        K, V = self.k[layer], self.v[layer]
        singles = [s for s in segments if s.n == 1]
        if len(singles) > 1:  # decode rows: one indexed write per pool instead of one copy per row
            key = tuple((s.slot, s.start, s.t0) for s in singles)
            idx = self._index_cache.get(key)
            if idx is None:
                idx = self._index_cache[key] = tuple(torch.tensor(c) for c in zip(*key, strict=True))
            slots, starts, rows = idx
            K[slots, :, starts] = k[rows]
            V[slots, :, starts] = v[rows]
            segments = [s for s in segments if s.n != 1]
        for s in segments:
            K[s.slot, :, s.start : s.start + s.n] = k[s.t0 : s.t0 + s.n].transpose(0, 1)
            V[s.slot, :, s.start : s.start + s.n] = v[s.t0 : s.t0 + s.n].transpose(0, 1)

    def fold(self, q: torch.Tensor) -> torch.Tensor:
        """q [n, H, D] -> [KVH, G*n, D] (rows ordered (group, position)): GQA as plain attention per KV head."""
        n = q.shape[0]
        return (
            q.view(n, self.kv_heads, self.group, self.head_dim)
            .permute(1, 2, 0, 3)
            .reshape(self.kv_heads, self.group * n, self.head_dim)
        )

    def unfold(self, o: torch.Tensor, n: int) -> torch.Tensor:
        return (
            o.view(self.kv_heads, self.group, n, self.head_dim)
            .permute(2, 0, 1, 3)
            .reshape(n, self.heads, self.head_dim)
        )


def causal_mask(start: int, n: int, group: int, length: int | None = None) -> torch.Tensor:
    """Bool [group * n, length] (True = attend): query i (at position start + i) sees keys [0, start + i]."""
    length = start + n if length is None else length
    m = torch.arange(length)[None, :] <= (start + torch.arange(n))[:, None]
    return m.repeat(group, 1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float):
    """Attention of [B, KVH, Lq, D] queries on [B, KVH, Lk, D] keys; returns (out, logsumexp [B, KVH, Lq] fp32).

    Small problems (decode rows, or a bf16 suffix on its past) as three explicit products (scores materialized:
    oneDNN's bf16 matmul is ~1.6-2x torch's CPU flash kernel there, measured); large ones (a long cold prompt)
    with the flash kernel, which skips nothing but never materializes the scores."""
    lq, lk = q.shape[-2], k.shape[-2]
    small = lq * lk <= (4 << 20 if q.dtype == torch.bfloat16 else 32 * 4096)
    if not small:
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, float("-inf"))
        return _flash(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    B, H, D = q.shape[0], q.shape[1], q.shape[-1]
    # [B * KVH, L, D] views of the pool (slot stride = heads x head stride): bmm reads them in place, where
    # matmul on 4-d views would copy every key and value first
    k3, v3 = k.reshape(B * H, lk, D), v.reshape(B * H, lk, D)
    scores = torch.bmm(q.reshape(B * H, lq, D), k3.transpose(1, 2)).view(B, H, lq, lk).float().mul_(scale)
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    mx = scores.amax(dim=-1, keepdim=True)
    e = torch.exp_(scores.sub_(mx))  # one exp pass serves both the output and the log-sum-exp
    total = e.sum(dim=-1, keepdim=True)
    out = torch.bmm(e.to(q.dtype).view(B * H, lq, lk), v3).view(B, H, lq, D)
    out = out.div_(total.to(q.dtype) if q.dtype != torch.float32 else total)
    return out, (mx + torch.log(total)).squeeze(-1)


class PrefixKV:
    """A shared prefix's K (transposed) and V per layer in contiguous buffers, copied once from `slot`'s pool
    rows [0, P) at first use: its score and value products then read them in place, in one pass for all rows."""

    def __init__(self, slot: int, length: int, num_layers: int) -> None:
        self.slot, self.P = slot, length
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def get(self, model: TorchLlama, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.layers[layer]
        if kv is None:
            k = model.k[layer][self.slot, :, : self.P]
            kv = self.layers[layer] = (
                k.transpose(1, 2).contiguous(),
                model.v[layer][self.slot, :, : self.P].clone(),
            )
        return kv


def _attend_prefix(q3: torch.Tensor, prefix: PrefixKV, model: TorchLlama, layer: int):
    """q3 [KVH, M, D] (every row's queries) on the whole prefix: (out [KVH, M, D], logsumexp [KVH, M]).

    Explicit products over the contiguous prefix buffer (oneDNN bf16 bmm), in chunks of query rows small enough
    that the fp32 scores stay in the last-level cache (the elementwise passes over them were DRAM-bound)."""
    kT, v = prefix.get(model, layer)
    H, M, _ = q3.shape
    rows = max(16, (2 << 20) // (H * prefix.P))
    if M <= rows:
        return _explicit_chunk(q3, kT, v, model.scale)
    parts = [_explicit_chunk(q3[:, i : i + rows], kT, v, model.scale) for i in range(0, M, rows)]
    return torch.cat([o for o, _ in parts], dim=1), torch.cat([lse for _, lse in parts], dim=1)


def _explicit_chunk(q3: torch.Tensor, kT: torch.Tensor, v: torch.Tensor, scale: float):
    scores = torch.bmm(q3, kT).float().mul_(scale)
    mx = scores.amax(dim=-1, keepdim=True)
    e = torch.exp_(scores.sub_(mx))
    total = e.sum(dim=-1, keepdim=True)
    out = torch.bmm(e.to(q3.dtype), v)
    out = out.div_(total.to(q3.dtype) if q3.dtype != torch.float32 else total)
    return out, (mx + torch.log(total)).squeeze(-1)


def merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Combine two partial attentions over disjoint key sets by their log-sum-exps (cascade attention)."""
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
    den = w1 + w2
    return (o1.float() * (w1 / den)[..., None] + o2.float() * (w2 / den)[..., None]).to(o1.dtype)


class SegmentAttention:
    """Each segment attends its own slot's [0, start + n) causally: one flash call per segment."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)
        self._masks: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        model.write_kv(layer, self.segments, k, v)
        out = torch.empty_like(q)
        for s in self.segments:
            L = s.start + s.n
            key = (s.start, s.n)
            if key not in self._masks:
                self._masks[key] = causal_mask(s.start, s.n, model.group).to(model.dtype)
                self._masks[key] = torch.zeros(self._masks[key].shape, dtype=model.dtype).masked_fill_(
                    self._masks[key] == 0, float("-inf")
                )
            mask = self._masks[key] if s.n > 1 else None
            qf = model.fold(q[s.t0 : s.t0 + s.n])[None]
            o, _ = _attend(
                qf,
                model.k[layer][s.slot : s.slot + 1, :, :L],
                model.v[layer][s.slot : s.slot + 1, :, :L],
                mask,
                model.scale,
            )
            out[s.t0 : s.t0 + s.n] = model.unfold(o[0], s.n)
        return out


class BlockDiagonalAttention:
    """All segments in one SDPA call: concatenated queries x gathered keys, block-diagonal + causal mask."""

    def __init__(self, segments: Sequence[Segment], group: int, dtype: torch.dtype) -> None:
        self.segments = list(segments)
        total_q = sum(s.n for s in segments)
        total_k = sum(s.start + s.n for s in segments)
        mask = torch.zeros((group, total_q, total_k), dtype=torch.bool)
        k0 = 0
        for s in segments:
            L = s.start + s.n
            mask[:, s.t0 : s.t0 + s.n, k0 : k0 + L] = causal_mask(s.start, s.n, 1)
            k0 += L
        self.mask = (
            torch.zeros(mask.shape, dtype=dtype)
            .masked_fill_(~mask, float("-inf"))
            .reshape(group * total_q, total_k)
        )

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        model.write_kv(layer, self.segments, k, v)
        K = torch.cat([model.k[layer][s.slot, :, : s.start + s.n] for s in self.segments], dim=1)[None]
        V = torch.cat([model.v[layer][s.slot, :, : s.start + s.n] for s in self.segments], dim=1)[None]
        o, _ = _attend(model.fold(q)[None], K, V, self.mask, model.scale)
        return model.unfold(o[0], q.shape[0])


class DenseDecodeAttention:
    """Decode rows (one token each) of slots [lo, hi) in one padded SDPA call; row r attends [0, pos_r]."""

    def __init__(self, segments: Sequence[Segment], dtype: torch.dtype) -> None:
        self.segments = list(segments)
        self.lo = min(s.slot for s in segments)
        self.hi = max(s.slot for s in segments) + 1
        self.width = max(s.start for s in segments) + 1
        rows = self.hi - self.lo
        mask = torch.zeros((rows, 1, 1, self.width), dtype=torch.bool)
        for s in segments:
            mask[s.slot - self.lo, ..., : s.start + 1] = True
        self.mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
        self.rows = torch.tensor([s.slot - self.lo for s in segments])

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        model.write_kv(layer, self.segments, k, v)
        B = self.hi - self.lo
        qp = torch.zeros((B, model.heads, model.head_dim), dtype=q.dtype)
        qp[self.rows] = q
        qf = qp.view(B, model.kv_heads, model.group, model.head_dim)
        K = model.k[layer][self.lo : self.hi, :, : self.width]
        V = model.v[layer][self.lo : self.hi, :, : self.width]
        o, _ = _attend(qf, K, V, self.mask.expand(B, 1, model.group, self.width), model.scale)
        return o.reshape(B, model.heads, model.head_dim)[self.rows]


class CascadeAttention:
    """Segments whose slots share the tokens [0, P), held once in `prefix_slot`: all queries attend the prefix in
    one call, each segment its own [P, start + n) causally in another (one call per segment), merged by LSE."""

    def __init__(
        self, segments: Sequence[Segment], prefix_slot: int, prefix_len: int, prefix: PrefixKV | None = None
    ) -> None:
        self.segments = list(segments)
        self.P, self.prefix_slot = prefix_len, prefix_slot
        self.prefix = prefix if prefix is not None else PrefixKV(prefix_slot, prefix_len, 0)
        assert all(s.start >= prefix_len for s in segments)

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        model.write_kv(layer, self.segments, k, v)
        P = self.P
        if len(self.prefix.layers) != model.num_layers:
            self.prefix.layers = [None] * model.num_layers
        o_p, l_p = _attend_prefix(model.fold(q), self.prefix, model, layer)  # [KVH, G*T, D]
        out = torch.empty_like(q)
        T = q.shape[0]
        o_p = o_p.view(model.kv_heads, model.group, T, model.head_dim)
        l_p = l_p.view(model.kv_heads, model.group, T)
        for s in self.segments:
            L = s.start + s.n
            mask = causal_mask(s.start - P, s.n, model.group) if s.n > 1 else None
            qs = model.fold(q[s.t0 : s.t0 + s.n])[None]
            o_s, l_s = _attend(
                qs,
                model.k[layer][s.slot : s.slot + 1, :, P:L],
                model.v[layer][s.slot : s.slot + 1, :, P:L],
                mask,
                model.scale,
            )
            o_s = o_s[0].view(model.kv_heads, model.group, s.n, model.head_dim)
            l_s = l_s[0].view(model.kv_heads, model.group, s.n)
            sl = slice(s.t0, s.t0 + s.n)
            o = merge(o_p[:, :, sl], l_p[:, :, sl], o_s, l_s)  # [KVH, G, n, D]
            out[sl] = o.permute(2, 0, 1, 3).reshape(s.n, model.heads, model.head_dim)
        return out


class BatchedCascadeDecode:
    """Cascade attention for decode rows only, batched: the prefix part as in CascadeAttention (one call), the
    rows' own tails [P, pos] in one padded call over their contiguous slots, merged by LSE."""

    def __init__(
        self,
        segments: Sequence[Segment],
        prefix_slot: int,
        prefix_len: int,
        dtype: torch.dtype,
        prefix: PrefixKV | None = None,
    ) -> None:
        self.segments = list(segments)
        self.P, self.prefix_slot = prefix_len, prefix_slot
        self.prefix = prefix if prefix is not None else PrefixKV(prefix_slot, prefix_len, 0)
        self.lo = min(s.slot for s in segments)
        self.hi = max(s.slot for s in segments) + 1
        self.width = max(s.start for s in segments) + 1 - prefix_len
        mask = torch.zeros((self.hi - self.lo, 1, 1, self.width), dtype=torch.bool)
        for s in segments:
            mask[s.slot - self.lo, ..., : s.start + 1 - prefix_len] = True
        self.mask = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
        self.rows = torch.tensor([s.slot - self.lo for s in segments])

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        model.write_kv(layer, self.segments, k, v)
        P, T = self.P, q.shape[0]
        H, KVH, G, D = model.heads, model.kv_heads, model.group, model.head_dim
        if len(self.prefix.layers) != model.num_layers:
            self.prefix.layers = [None] * model.num_layers
        qp_ = q.view(T, KVH, G, D).permute(1, 0, 2, 3).reshape(KVH, T * G, D)
        o_p, l_p = _attend_prefix(qp_, self.prefix, model, layer)
        o_p = o_p.view(KVH, T, G, D).permute(1, 0, 2, 3)  # [T, KVH, G, D]
        l_p = l_p.view(KVH, T, G).permute(1, 0, 2)
        B = self.hi - self.lo
        qb = torch.zeros((B, KVH, G, D), dtype=q.dtype)
        qb[self.rows] = q.view(T, KVH, G, D)
        K = model.k[layer][self.lo : self.hi, :, P : P + self.width]
        V = model.v[layer][self.lo : self.hi, :, P : P + self.width]
        o_s, l_s = _attend(qb, K, V, self.mask.expand(B, 1, G, self.width), model.scale)
        o = merge(o_p, l_p, o_s[self.rows], l_s[self.rows])
        return o.reshape(T, H, D)


class StepAttention:
    """One engine step's attention: prefill segments (flat rows [0, td)) then decode rows ([td, T)).

    Prefill segments sharing a cached prefix (the runner's `_shared`: at least `cascade_min_prefix` tokens every segment starting past it) use
    CascadeAttention, else one flash call each; decode rows sharing such a prefix use BatchedCascadeDecode, else
    one padded call (DenseDecodeAttention)."""

    def __init__(
        self,
        prefills: Sequence[Segment],
        prefill_prefix: PrefixKV | None,
        decodes: Sequence[Segment],
        decode_prefix: PrefixKV | None,
        dtype: torch.dtype,
    ) -> None:
        self.td = sum(s.n for s in prefills)
        self.pre: Attention | None = None
        self.dec: Attention | None = None
        if prefills:
            self.pre = (
                CascadeAttention(prefills, prefills[0].slot, prefill_prefix.P, prefill_prefix)
                if prefill_prefix
                else SegmentAttention(prefills)
            )
        if decodes:
            rel = [Segment(s.slot, s.start, 1, s.t0 - self.td) for s in decodes]
            self.dec = (
                BatchedCascadeDecode(rel, decodes[0].slot, decode_prefix.P, dtype, decode_prefix)
                if decode_prefix
                else DenseDecodeAttention(rel, dtype)
            )

    def __call__(self, model: TorchLlama, layer: int, q, k, v):
        td = self.td
        if self.dec is None:
            return self.pre(model, layer, q, k, v)
        if self.pre is None:
            return self.dec(model, layer, q, k, v)
        o1 = self.pre(model, layer, q[:td], k[:td], v[:td])
        o2 = self.dec(model, layer, q[td:], k[td:], v[td:])
        return torch.cat([o1, o2])


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for s in seqs[1:]:
        i = 0
        while i < n and s[i] == first[i]:
            i += 1
        n = i
    return n


class TorchRunner:
    """The Runner protocol (runtime.engine.Runner) on TorchLlama: every plan runs as ONE forward — all prefill
    chunks (with or without a cached past) and all decode tokens of the step together (mixed batches), the
    prefix store's block loads and saves around it. The KV pool holds `dtype` values (fp32 or bf16); the
    prefix store keeps its own storage type (`kv_dtype`, as the onnxruntime runner).

    Shared prefixes are found from the token ids the runner wrote into each slot (prefill chunks, decode tokens,
    blocks loaded from the store carry the tokens they were saved with): when the rows of a step share at least
    `cascade_min_prefix` tokens, attention reads that prefix once for all of them (cascade). The rows' own copies
    of the prefix were computed from the same tokens at the same positions, so this changes values only by
    floating-point rounding of differently shaped matrix products (fp32: ~1e-6)."""

    batches_prefills_with_past = True  # the scheduler's TTFT-first runs may batch prompts on a cached past
    mixes_decodes_with_prefills = True
    paged_kv = False
    verifies_drafts = False

    def __init__(
        self,
        model_dir: Path,
        num_slots: int,
        max_len: int,
        tokens_per_block: int,
        store_max_bytes: int,
        kv_dtype: str = "fp32",
        kv_scales=None,
        dtype: str = "fp32",
        threads: int = 0,
        cascade_min_prefix: int = 256,
    ) -> None:
        from llmkiln.runtime.kv_quant import BlockData, bytes_per_block

        if threads:
            torch.set_num_threads(threads)
        self.model = m = TorchLlama(model_dir, dtype, num_slots, max_len)
        self.num_slots, self.max_len, self.vocab_size = num_slots, max_len, m.vocab_size
        self.tokens_per_block = tokens_per_block
        self.cascade_min_prefix = cascade_min_prefix
        block_bytes = bytes_per_block(kv_dtype, m.num_layers, m.kv_heads, tokens_per_block, m.head_dim)
        self.num_blocks = store_max_bytes // block_bytes
        self.blocks = BlockData(
            kv_dtype,
            self.num_blocks,
            m.num_layers,
            m.kv_heads,
            tokens_per_block,
            m.head_dim,
            kv_scales,
            None,
            max_copy_tokens=max_len,
        )
        self.block_memory = self.blocks
        self.slot_tokens: list[list[int]] = [[] for _ in range(num_slots)]
        self._prefixes: dict[tuple[int, int], PrefixKV] = {}
        self.block_tokens: dict[int, tuple[int, ...]] = {}

    def expect_drafts(self, max_draft_len: int) -> bool:
        """Never called: this runner does not verify drafts."""
        return False

    def close(self) -> None:
        pass

    def _shared(self, segs: Sequence[Segment]) -> PrefixKV | None:
        """The prefix buffer when the segments' slots hold the same first P >= cascade_min_prefix tokens (one
        buffer per prefix, kept across steps: the two most recently used)."""
        if len(segs) < 2:
            return None
        P = _common_prefix([self.slot_tokens[s.slot][: s.start] for s in segs])
        if P < self.cascade_min_prefix:
            return None
        key = (P, hash(tuple(self.slot_tokens[segs[0].slot][:P])))
        prefix = self._prefixes.pop(key, None)
        if prefix is None:
            prefix = PrefixKV(segs[0].slot, P, self.model.num_layers)
        self._prefixes[key] = prefix
        while len(self._prefixes) > 2:
            self._prefixes.pop(next(iter(self._prefixes)))
        return prefix

    def execute(self, plan, trace=None):
        import numpy as np

        from llmkiln.runtime.plan import block_runs
        from llmkiln.runtime.profile import now_ns

        t = now_ns()
        for slot, start, ids in block_runs(plan.loads, self.tokens_per_block):
            self._load_blocks(ids, slot, start)
        if trace is not None:
            trace.loads, trace.load_ns = len(plan.loads), now_ns() - t
        ids: list[int] = []
        pos: list[int] = []
        rows: list[tuple[str, int]] = []
        pre: list[Segment] = []
        for c in plan.prefills:
            n = len(c.token_ids)
            pre.append(Segment(c.slot, c.start, n, len(ids)))
            if c.sample:
                rows.append((c.request_id, len(ids) + n - 1))
            ids.extend(c.token_ids)
            pos.extend(range(c.start, c.start + n))
        dec: list[Segment] = []
        for d in plan.decodes:
            dec.append(Segment(d.slot, d.position, 1, len(ids)))
            rows.append((d.request_id, len(ids)))
            ids.append(d.token_id)
            pos.append(d.position)
        out: dict[str, np.ndarray] = {}
        if ids:
            t = now_ns()
            att = StepAttention(pre, self._shared(pre), dec, self._shared(dec), self.model.dtype)
            for c in plan.prefills:
                self.slot_tokens[c.slot][c.start :] = c.token_ids
            for d in plan.decodes:
                self.slot_tokens[d.slot][d.position :] = [d.token_id]
            logits = self.model.forward(
                torch.tensor(ids),
                torch.tensor(pos),
                att,
                torch.tensor([r for _, r in rows], dtype=torch.long),
            ).numpy()
            out = {rid: logits[i] for i, (rid, _) in enumerate(rows)}
            if trace is not None:
                ns = now_ns() - t
                if pre:
                    n = sum(s.n for s in pre)
                    trace.prefills.append(
                        (
                            len(pre),
                            n,
                            max(s.start for s in pre),
                            ns,
                            tuple(c.request_id for c in plan.prefills),
                        )
                    )
                if dec:
                    width = max(s.start for s in dec) + 1
                    trace.decode = (len(dec), len(dec), width, 0 if pre else ns)
        t = now_ns()
        for slot, start, block_ids in block_runs(plan.saves, self.tokens_per_block):
            self._save_blocks(block_ids, slot, start)
        if trace is not None:
            trace.saves, trace.save_ns = len(plan.saves), now_ns() - t
        return out

    def _load_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        m, bs, n = self.model, self.tokens_per_block, len(block_ids)
        kv = torch.from_numpy(self.blocks.read_many(block_ids))  # (n, L, 2, heads, bs, head_dim)
        end = start + n * bs
        for layer in range(m.num_layers):
            m.k[layer][slot, :, start:end] = (
                kv[:, layer, 0].permute(1, 0, 2, 3).reshape(m.kv_heads, n * bs, m.head_dim)
            )
            m.v[layer][slot, :, start:end] = (
                kv[:, layer, 1].permute(1, 0, 2, 3).reshape(m.kv_heads, n * bs, m.head_dim)
            )
        toks = self.slot_tokens[slot][:start]
        toks += [-1 - slot] * (start - len(toks))  # unknown tokens never match another slot's
        for b in block_ids:
            toks.extend(self.block_tokens.get(b, (-1 - slot,) * bs))
        self.slot_tokens[slot] = toks

    def _save_blocks(self, block_ids: list[int], slot: int, start: int) -> None:
        m, bs, n = self.model, self.tokens_per_block, len(block_ids)
        kv = self.blocks.staging(n)  # (n, L, 2, heads, bs, head_dim) float32
        end = start + n * bs
        for layer in range(m.num_layers):
            for j, pool in enumerate((m.k[layer], m.v[layer])):
                blk = pool[slot, :, start:end].reshape(m.kv_heads, n, bs, m.head_dim).permute(1, 0, 2, 3)
                kv[:, layer, j] = blk.float().numpy()
        self.blocks.write_many(block_ids, kv)
        toks = self.slot_tokens[slot]
        for i, b in enumerate(block_ids):
            self.block_tokens[b] = tuple(toks[start + i * bs : start + (i + 1) * bs])


def load_torch_engine(engine_dir: Path, model_dir: Path, dtype: str = "fp32", overrides=None):
    """An LLMEngine over TorchRunner with an engine folder's recipe settings and tokenizer (not started).

    Prototype seam: the engine folder gives the scheduler settings and tokenizer, `model_dir` the HF
    checkpoint the torch path runs (the engine's source model)."""
    from tokenizers import Tokenizer

    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.engine import LLMEngine
    from llmkiln.runtime.scheduler import SchedulerConfig

    folder = EngineDir(engine_dir)
    recipe = folder.runtime_recipe(overrides)
    info = folder.genai_config()
    kv = recipe.kv_cache
    tok_file = folder.tokenizer_file()
    tokenizer = Tokenizer.from_file(str(tok_file)) if tok_file is not None else None
    runner = TorchRunner(
        model_dir,
        num_slots=recipe.scheduler.max_batch_size,
        max_len=recipe.limits.max_seq_len,
        tokens_per_block=kv.tokens_per_block,
        store_max_bytes=kv.max_bytes if kv.prefix_reuse else 0,
        kv_dtype=kv.dtype,
        dtype=dtype,
        threads=recipe.scheduler.intra_op_threads,
    )
    config = SchedulerConfig.from_recipe(recipe, info.eos_token_ids)
    return LLMEngine(config, runner, tokenizer, recipe, engine_dir=folder.path)
