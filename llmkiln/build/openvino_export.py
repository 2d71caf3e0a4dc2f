"""OpenVINO export for backend openvino-cpu: the source checkpoint, weights as they are (fp32, never rounded),
as an OpenVINO IR (`openvino_model.xml` + `.bin`) whose attention OpenVINO's own `paged_attention_transformation`
turns into its PagedAttention op at load (llmkiln.runtime.openvino_runner).

The graph is traced with OpenVINO's PyTorch frontend (`ov.convert_model`) from a plain Llama forward written for
it (`_TraceLlama`: the HF Llama arithmetic — RMSNorm, rotary on position ids, grouped-query attention through
`scaled_dot_product_attention`, SwiGLU — over past K/V inputs), then made stateful the way optimum-intel's export
makes it (a `beam_idx` reorder of each past, `make_stateful`, zero-initialized states): that is the form the
transformation recognizes. optimum-intel itself is not used: it needs transformers < 5.6 and a CUDA build of torch,
which the project's pinned environment cannot take (docs/cpu-engine.md). The IR is checked against transformers
in fp32 by the tests (max |Δlogit| ~1e-5 on stories260K, prefill and prefill-on-a-past).

A `genai_config.json` in onnxruntime-genai's schema (decoder `filename: openvino_model.xml`) describes the model's
shapes and special tokens, so every reader of an engine folder (EngineDir.genai_config) works unchanged.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from llmkiln.build.capacity import check_model_fits
from llmkiln.build.stages import BuildContext
from llmkiln.engine_dir import GENAI_CONFIG, OPENVINO_BIN, OPENVINO_XML
from llmkiln.errors import BadInput, BuildFailed
from llmkiln.versions import package_versions

SUPPORTED_MODEL_TYPES = ("llama",)
_TOOLS = ("openvino", "torch", "safetensors", "numpy")


def _config_problems(cfg: dict[str, Any]) -> list[str]:
    out = []
    if cfg.get("model_type") not in SUPPORTED_MODEL_TYPES:
        out.append(f"model_type {cfg.get('model_type')!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in ("default", None):
        out.append(f"rope type {rope_type!r} (supported: default)")
    for flag in ("attention_bias", "mlp_bias"):
        if cfg.get(flag):
            out.append(f"{flag}: true (not supported)")
    if cfg.get("hidden_act", "silu") != "silu":
        out.append(f"hidden_act {cfg.get('hidden_act')!r} (supported: silu)")
    return out


def _rope_theta(cfg: dict[str, Any]) -> float:
    rope = cfg.get("rope_parameters") or {}
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _make_module(model_dir: Path, cfg: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if not weights:
        raise BadInput(f"{model_dir}: no *.safetensors weights to export")

    class _TraceLlama(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = int(cfg["num_hidden_layers"])
            self.heads = int(cfg["num_attention_heads"])
            self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
            self.head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // self.heads)
            self.eps = float(cfg["rms_norm_eps"])
            self.tied = "lm_head.weight" not in weights
            self.source = weights
            d = self.head_dim
            inv = 1.0 / (_rope_theta(cfg) ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            self.inv_freq = inv  # a traced constant
            self.w = torch.nn.ParameterDict(
                {
                    k.replace(".", "_"): torch.nn.Parameter(v.float(), requires_grad=False)
                    for k, v in weights.items()
                }
            )

        def p(self, name: str) -> torch.Tensor:
            if name == "lm_head.weight" and self.tied:
                name = "model.embed_tokens.weight"
            return self.w[name.replace(".", "_")]

        def rms(self, x: torch.Tensor, name: str) -> torch.Tensor:
            return self.p(name) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

        def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
            b, s = input_ids.shape
            h, kvh, d = self.heads, self.kv_heads, self.head_dim
            x = F.embedding(input_ids, self.p("model.embed_tokens.weight"))
            freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[:, None], emb.sin()[:, None]
            keys = torch.arange(attention_mask.shape[1])[None, None, None, :]
            mask = torch.where(keys <= position_ids[:, None, :, None], 0.0, torch.finfo(torch.float32).min)
            presents = []
            for i in range(self.layers):
                pre = f"model.layers.{i}."
                y = self.rms(x, pre + "input_layernorm.weight")
                q = F.linear(y, self.p(pre + "self_attn.q_proj.weight")).view(b, s, h, d).transpose(1, 2)
                k = F.linear(y, self.p(pre + "self_attn.k_proj.weight")).view(b, s, kvh, d).transpose(1, 2)
                v = F.linear(y, self.p(pre + "self_attn.v_proj.weight")).view(b, s, kvh, d).transpose(1, 2)
                q = q * cos + _rotate_half(q) * sin
                k = k * cos + _rotate_half(k) * sin
                k = torch.cat([past[2 * i], k], dim=2)
                v = torch.cat([past[2 * i + 1], v], dim=2)
                presents += [k, v]
                rep = h // kvh  # grouped-query attention: the Unsqueeze-Broadcast-Reshape form HF uses
                kr = k.unsqueeze(2).expand(b, kvh, rep, -1, d).reshape(b, h, -1, d)
                vr = v.unsqueeze(2).expand(b, kvh, rep, -1, d).reshape(b, h, -1, d)
                a = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=d**-0.5)
                x = x + F.linear(
                    a.transpose(1, 2).reshape(b, s, h * d), self.p(pre + "self_attn.o_proj.weight")
                )
                y = self.rms(x, pre + "post_attention_layernorm.weight")
                gate = F.linear(y, self.p(pre + "mlp.gate_proj.weight"))
                up = F.linear(y, self.p(pre + "mlp.up_proj.weight"))
                x = x + F.linear(F.silu(gate) * up, self.p(pre + "mlp.down_proj.weight"))
            logits = F.linear(self.rms(x, "model.norm.weight"), self.p("lm_head.weight"))
            return (logits, *presents)

    return _TraceLlama().eval()


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def export_openvino(model_dir: Path, out_dir: Path) -> dict[str, Any]:
    """model_dir (HF Llama folder) → out_dir/openvino_model.xml + .bin (stateful IR, fp32 weights as stored)."""
    import openvino as ov
    import openvino.opset13 as ops
    import torch
    from openvino._offline_transformations import apply_make_stateful_transformation

    cfg = json.loads((model_dir / "config.json").read_text())
    problems = _config_problems(cfg)
    if problems:
        raise BadInput(
            f"{model_dir}/config.json: backend openvino-cpu exports Llama-architecture models only; this one has "
            + "; ".join(problems)
            + ". Use backend onnx-cpu for it"
        )
    module = _make_module(model_dir, cfg)
    source = {k: v.detach().float().numpy() for k, v in module.source.items()}
    layers, kvh, d = module.layers, module.kv_heads, module.head_dim
    b, s, p = 2, 3, 4  # example shapes for tracing; every axis but heads and head size is made dynamic below
    past = [torch.zeros(b, kvh, p, d) for _ in range(2 * layers)]
    example = (
        torch.ones(b, s, dtype=torch.int64),
        torch.ones(b, p + s, dtype=torch.int64),
        torch.arange(p, p + s)[None].expand(b, s).contiguous(),
        *past,
    )
    kv_names = [f"{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(2 * layers)]
    in_names = ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{n}" for n in kv_names)]
    out_names = ["logits", *(f"present.{n}" for n in kv_names)]
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace's, from OpenVINO's frontend
            model = ov.convert_model(module, example_input=example)
    except Exception as exc:
        raise BuildFailed(f"OpenVINO could not trace {model_dir}: {type(exc).__name__}: {exc}") from exc
    for port, name in zip(model.inputs, in_names, strict=True):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, out_names, strict=True):
        port.get_tensor().set_names({name})
    shapes = {port: ov.PartialShape([-1, -1]) for port in model.inputs[:3]}
    shapes.update({port: ov.PartialShape([-1, kvh, -1, d]) for port in model.inputs[3:]})
    model.reshape(shapes)
    # stateful, as optimum-intel makes it: each past goes through a beam_idx Gather, then becomes a state
    beam = ops.parameter([-1], ov.Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    for port in model.inputs[3:]:
        param = port.get_node()
        consumers = list(param.output(0).get_target_inputs())
        reordered = ops.gather(param, beam, ops.constant(0))
        for c in consumers:
            c.replace_source_output(reordered.output(0))
    model.add_parameters([beam])
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, dict(zip(in_names[3:], out_names[1:], strict=True)))
    batch = ops.gather(
        ops.shape_of(model.input("input_ids"), output_type="i64"), ops.constant([0]), ops.constant(0)
    )
    for op in model.get_ops():
        if (
            op.get_type_name() == "ReadValue"
        ):  # an empty past of the batch's size (the pattern wants an initializer)
            shape = ops.concat([batch, *(ops.constant(np.array([n], np.int64)) for n in (kvh, 0, d))], axis=0)
            op.set_arguments([ops.broadcast(ops.constant(np.float32(0)), shape)])
    model.validate_nodes_and_infer_types()
    out_dir.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(out_dir / OPENVINO_XML), compress_to_fp16=False)
    _write_genai_config(cfg, model_dir, out_dir, layers, kvh, d)
    weights = check_weights(model, source, model_dir)
    ops_count: dict[str, int] = {}
    for op in model.get_ops():
        ops_count[op.get_type_name()] = ops_count.get(op.get_type_name(), 0) + 1
    return {
        "layers": layers,
        "kv_heads": kvh,
        "head_dim": d,
        "sdpa_ops": ops_count.get("ScaledDotProductAttention", 0),
        "ir_bytes": (out_dir / OPENVINO_BIN).stat().st_size,
        "weights": weights,
    }


def check_weights(model: Any, source: dict[str, np.ndarray], model_dir: Path) -> dict[str, Any]:
    """Every source tensor is in the IR bit for bit (as fp32), or is all ones — a scale OpenVINO folded away
    (x·1 = x exactly); anything else is BuildFailed: the weights are never changed."""
    import openvino as ov

    consts: set[str] = set()
    for op in model.get_ops():
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.f32:
            consts.add(hashlib.sha256(np.ascontiguousarray(op.get_data()).tobytes()).hexdigest())
    identical, folded, changed = 0, [], []
    for name, value in sorted(source.items()):
        if hashlib.sha256(np.ascontiguousarray(value, np.float32).tobytes()).hexdigest() in consts:
            identical += 1
        elif np.all(value == 1.0):
            folded.append(name)
        else:
            changed.append(name)
    if changed:
        raise BuildFailed(
            f"{model_dir}: the OpenVINO IR does not hold these weights bit for bit: {', '.join(changed[:5])}"
            + (f" (+{len(changed) - 5} more)" if len(changed) > 5 else "")
        )
    return {"tensors": len(source), "bit_identical": identical, "all_ones_folded": len(folded)}


def _write_genai_config(
    cfg: dict[str, Any], model_dir: Path, out_dir: Path, layers: int, kvh: int, d: int
) -> None:
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    doc = {
        "model": {
            "type": cfg["model_type"],
            "bos_token_id": gen.get("bos_token_id", cfg.get("bos_token_id")),
            "eos_token_id": eos if eos is not None else [],
            "pad_token_id": cfg.get("pad_token_id") or (eos[0] if isinstance(eos, list) else eos),
            "vocab_size": int(cfg["vocab_size"]),
            "context_length": int(cfg.get("max_position_embeddings") or 2048),
            "decoder": {
                "filename": OPENVINO_XML,
                "head_size": d,
                "hidden_size": int(cfg["hidden_size"]),
                "num_attention_heads": int(cfg["num_attention_heads"]),
                "num_hidden_layers": layers,
                "num_key_value_heads": kvh,
            },
        },
        "llmkiln": {"written_by": "llmkiln.build.openvino_export", "runtime": "OpenVINO PagedAttention"},
    }
    (out_dir / GENAI_CONFIG).write_text(json.dumps(doc, indent=2) + "\n")


class OpenVinoExportStage:
    """Export the source checkpoint to an OpenVINO IR (cached by source hashes and tool versions)."""

    name = "export"
    version = "1"
    cacheable = True

    def check(self, ctx: BuildContext) -> None:
        # precision: the recipe schema already allows only BACKEND_PRECISIONS[openvino-cpu] (fp32, bf16)
        config = check_model_fits(ctx)
        problems = _config_problems(config) if config is not None else []
        if problems:
            raise BadInput(
                f"{ctx.source.path / 'config.json'}: backend openvino-cpu exports Llama-architecture models only; "
                "this one has " + "; ".join(problems) + f". Set backend: onnx-cpu in {ctx.recipe_file}"
            )

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        # the IR does not depend on the precision (chosen at load): fp32 and bf16 recipes share one export;
        # it does on `weights` (int8: compressed here, by NNCF)
        key: dict[str, Any] = {"source": ctx.source_hashes, "tools": package_versions(_TOOLS)}
        weights = self.build_key_extra(ctx)
        if weights is not None:
            key["weights"] = weights
        return key

    def build_key_extra(self, ctx: BuildContext) -> dict[str, Any] | None:
        """The weight-compression rule (None for the checkpoint's weights): in the whole-build key too, so an
        engine built by an older rule is not reported up to date (the recipe hash does not see the rule)."""
        if ctx.recipe.weights == "checkpoint":
            return None
        from llmkiln.build.openvino_weights import METHOD

        return {"mode": ctx.recipe.weights, "method": METHOD, "tools": package_versions(("nncf",))}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        info = export_openvino(ctx.source.path, out_dir)
        part = {
            "tool": "openvino.convert_model (PyTorch frontend) + make_stateful",
            "inference_precision": ctx.recipe.precision,
            "export_seconds": round(time.perf_counter() - t0, 3),
            **info,
        }
        if ctx.recipe.weights != "checkpoint":  # after check_weights: the fp32 IR was the checkpoint's first
            from llmkiln.build.openvino_weights import compress_weights

            part["weight_compression"] = compress_weights(out_dir, ctx.recipe.weights)
            part["ir_bytes"] = part["weight_compression"]["ir_bytes"]
        return part
