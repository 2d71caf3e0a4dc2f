"""FP8 weights + FP8 KV calibration with NVIDIA ModelOpt on CPU (fake quantization), and both exports.

`calibrate_fp8(hf_dir, out_dir, texts, max_seq_len)` loads the HF checkpoint in fp32, inserts ModelOpt quantizers
(FP8_DEFAULT_CFG + the FP8 KV entries of FP8_KV_CFG, max calibration), runs one forward per calibration text, and
writes into out_dir (assembled in a temp folder, renamed into place when complete):

    hf_checkpoint/          export_hf_checkpoint (unified HF: fp8 weights, weight_scale/input_scale/k_scale/v_scale,
                            hf_quant_config.json) + the source tokenizer files; unquantized tensors bit-identical
    trtllm_checkpoint/      export_tensorrt_llm_checkpoint (config.json + rank0.safetensors), with two fixes:
                            rotary_base restored from the HF config (dropped under transformers 5.x), and
    kv_cache_scales.json    the calibrated per-layer KV scales (amax/448) next to the ones the export clamps to >= 1.0
    kv_scales.json          per-layer, per-KV-head fp8 scales in the CPU runtime's schema (llmkiln.kv_scales)
    modelopt_state.pth      mto.save of the fake-quant model (quality_diff reloads it with mto.restore), saved after
                            q/k/v and gate/up got their shared weight scale (unify_fused_amax), as in the exports
    calibration.json        what was done: source, samples, tokens, algorithm, amax table, tool versions

The TRT-LLM checkpoint is the hand-off to the GPU build (trtllm-build runs on a GPU host).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmkiln.atomic import atomic_dir
from llmkiln.calibration.kv_stats import KvAbsmax, KvAlgorithm
from llmkiln.errors import BadInput, BuildFailed
from llmkiln.kv_scales import FILE_NAME as KV_SCALES_NAME
from llmkiln.kv_scales import KvScales
from llmkiln.tokenizer_files import copy_tokenizer_files
from llmkiln.versions import package_versions

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FP8_MAX = 448.0
HF_DIR_NAME = "hf_checkpoint"
TRTLLM_DIR_NAME = "trtllm_checkpoint"
STATE_NAME = "modelopt_state.pth"
META_NAME = "calibration.json"
KV_CACHE_SCALES_NAME = "kv_cache_scales.json"
# HF model_type -> ModelOpt decoder_type for export_tensorrt_llm_checkpoint
DECODER_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen", "qwen3": "qwen", "gemma": "gemma"}
TRTLLM_DTYPES = ("float16", "bfloat16", "float32")
_TOOLS = ("nvidia-modelopt", "torch", "transformers", "safetensors")


@dataclass
class Fp8CalibrationResult:
    """Where calibrate_fp8 wrote its outputs, and the calibrated KV scales."""

    out_dir: Path
    hf_checkpoint_dir: Path
    trtllm_checkpoint_dir: Path
    kv_scales: KvScales
    trtllm_kv_scales: list[dict[str, float]]
    modelopt_state_path: Path
    meta: dict[str, Any] = field(default_factory=dict)


def fp8_quant_config() -> dict[str, Any]:
    """FP8_DEFAULT_CFG with the FP8 KV-cache quantizer entries appended (what hf_ptq.py does for fp8 + fp8 KV)."""
    import modelopt.torch.quantization as mtq

    return mtq.update_quant_cfg_with_kv_cache_quant(mtq.FP8_DEFAULT_CFG, mtq.FP8_KV_CFG["quant_cfg"])


def rope_theta(hf_config: dict[str, Any]) -> float | None:
    """rope_theta from a HF config.json (transformers 5.x keeps it under rope_parameters)."""
    params = hf_config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    if "rope_theta" in hf_config:
        return float(hf_config["rope_theta"])
    return None


def load_hf_model(hf_dir: Path) -> PreTrainedModel:
    """The HF causal LM in fp32 on CPU, eval mode, with config.architectures set (ModelOpt's export needs it)."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (hf_dir / "config.json").is_file():
        raise BadInput(f"{hf_dir}: not a Hugging Face model folder (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    return model


def tokenize(hf_dir: Path, texts: Sequence[str], max_seq_len: int) -> list[list[int]]:
    """Token ids of each text (with the tokenizer's BOS), truncated to max_seq_len."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    out = [tok(t, truncation=True, max_length=max_seq_len).input_ids for t in texts]
    return [ids for ids in out if ids]


def hf_kv_absmax(
    model: PreTrainedModel, sequences: Sequence[Sequence[int]], algorithm: KvAlgorithm = "max"
) -> KvAbsmax:
    """Per-layer, per-KV-head |K| (post-rotary, as cached) and |V| statistics of the HF model over `sequences`."""
    import torch

    cfg = model.config
    stats = KvAbsmax(cfg.num_hidden_layers, cfg.num_key_value_heads, algorithm=algorithm)
    with torch.no_grad():
        for ids in sequences:
            out = model(torch.tensor([list(ids)]), use_cache=True)
            for i, layer in enumerate(out.past_key_values.layers):
                stats.update(i, layer.keys.float().numpy(), layer.values.float().numpy())
    return stats


def _quantizer_amax(model: PreTrainedModel) -> dict[str, float]:
    from modelopt.torch.quantization.nn import TensorQuantizer

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, TensorQuantizer) and mod.is_enabled and getattr(mod, "amax", None) is not None:
            out[name] = float(mod.amax.float().max())
    return out


# Linear layers that deployment fuses into one GEMM (qkv, gate_up): both exports give them one shared weight scale.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def unify_fused_amax(model: PreTrainedModel) -> int:
    """Give each fused group the max of its weight amaxes (what both exports do when writing the checkpoint), so
    the saved fake-quant model computes exactly what the exported checkpoints hold. Returns groups changed."""
    import torch

    changed = 0
    for _, module in model.named_modules():
        for group in FUSED_GROUPS:
            found = [getattr(getattr(module, n, None), "weight_quantizer", None) for n in group]
            quantizers = [q for q in found if q is not None and q.is_enabled and q.amax is not None]
            if len(quantizers) < len(group):
                continue
            shared = torch.stack([q.amax.float().max() for q in quantizers]).max()
            for q in quantizers:
                q.amax = shared.clone().to(q.amax.dtype).reshape(q.amax.shape)
            changed += 1
    return changed


def fix_trtllm_config(trt_dir: Path, hf_config: dict[str, Any]) -> dict[str, Any]:
    """Restore rotary_base (and max_position_embeddings) from the HF config; returns what was changed."""
    path = trt_dir / "config.json"
    cfg = json.loads(path.read_text())
    changed: dict[str, Any] = {}
    theta = rope_theta(hf_config)
    if theta is not None and cfg.get("rotary_base") != theta:
        changed["rotary_base"] = {"was": cfg.get("rotary_base"), "now": theta}
        cfg["rotary_base"] = theta
    if "max_position_embeddings" in hf_config and "max_position_embeddings" not in cfg:
        cfg["max_position_embeddings"] = hf_config["max_position_embeddings"]
        changed["max_position_embeddings"] = {"was": None, "now": hf_config["max_position_embeddings"]}
    path.write_text(json.dumps(cfg, indent=4) + "\n")
    return changed


def trtllm_kv_cache_scales(model: PreTrainedModel, trt_dir: Path) -> list[dict[str, float]]:
    """Per layer: the calibrated KV scales (k/v amax / 448, unclamped) and what the TRT-LLM export wrote."""
    from safetensors import safe_open

    amax = _quantizer_amax(model)
    layers = []
    with safe_open(str(trt_dir / "rank0.safetensors"), "pt") as f:
        keys = set(f.keys())
        for i in range(model.config.num_hidden_layers):
            k = amax.get(f"model.layers.{i}.self_attn.k_bmm_quantizer")
            v = amax.get(f"model.layers.{i}.self_attn.v_bmm_quantizer")
            if k is None or v is None:
                raise BuildFailed(
                    f"layer {i}: ModelOpt inserted no calibrated k/v_bmm_quantizer (FP8 KV cache)"
                )
            entry = {
                "k_amax": k,
                "v_amax": v,
                "k_scale": k / FP8_MAX,
                "v_scale": v / FP8_MAX,
                "kv_scale": max(k, v) / FP8_MAX,
            }
            name = f"transformer.layers.{i}.attention.kv_cache_scaling_factor"
            if name in keys:
                entry["exported_kv_cache_scaling_factor"] = float(f.get_tensor(name).float().max())
            layers.append(entry)
    return layers


def calibrate_fp8(
    hf_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    texts: Sequence[str],
    max_seq_len: int,
    trtllm_dtype: str = "float16",
    algorithm: str = "max",
    tp_size: int = 1,
    pp_size: int = 1,
) -> Fp8CalibrationResult:
    """Calibrate FP8 weights/activations/KV with ModelOpt on CPU and export the HF and TRT-LLM checkpoints."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint

    hf_dir, out_dir = Path(hf_dir).resolve(), Path(out_dir).resolve()
    if algorithm != "max":
        raise BadInput(f"calibration.algorithm {algorithm!r}: ModelOpt FP8 calibration supports 'max' only")
    if trtllm_dtype not in TRTLLM_DTYPES:
        raise BadInput(f"trtllm dtype {trtllm_dtype!r}: use one of {', '.join(TRTLLM_DTYPES)}")
    if not texts:
        raise BadInput("calibrate_fp8: the calibration set is empty")
    hf_config = json.loads((hf_dir / "config.json").read_text()) if (hf_dir / "config.json").is_file() else {}
    decoder = DECODER_TYPES.get(hf_config.get("model_type", ""))
    if decoder is None:
        raise BadInput(
            f"{hf_dir}: model_type {hf_config.get('model_type')!r} has no ModelOpt decoder mapping; "
            f"supported: {', '.join(sorted(DECODER_TYPES))}"
        )
    t0 = time.perf_counter()
    model = load_hf_model(hf_dir)
    source_dtype = next(model.parameters()).dtype
    sequences = tokenize(hf_dir, texts, max_seq_len)
    stats = KvAbsmax(model.config.num_hidden_layers, model.config.num_key_value_heads)

    def forward_loop(m: PreTrainedModel) -> None:
        with torch.no_grad():
            for ids in sequences:
                out = m(torch.tensor([ids]), use_cache=True)
                for i, layer in enumerate(out.past_key_values.layers):
                    stats.update(i, layer.keys.float().numpy(), layer.values.float().numpy())

    log = io.StringIO()  # ModelOpt prints its whole config and per-rank chatter; keep it for calibration.log
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        mtq.quantize(model, fp8_quant_config(), forward_loop)
    t_cal = time.perf_counter() - t0
    amax_calibrated = _quantizer_amax(model)
    fused = unify_fused_amax(model)
    amax = _quantizer_amax(model)

    with atomic_dir(out_dir, publish=_publish) as tmp:
        mto.save(model, str(tmp / STATE_NAME))
        trt_tmp = tmp / TRTLLM_DIR_NAME
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            export_tensorrt_llm_checkpoint(
                model,
                decoder,
                dtype=getattr(torch, trtllm_dtype),
                export_dir=str(trt_tmp),
                inference_tensor_parallel=tp_size,
                inference_pipeline_parallel=pp_size,
            )
        fixes = fix_trtllm_config(trt_tmp, hf_config)
        kv_cache = trtllm_kv_cache_scales(model, trt_tmp)
        (tmp / KV_CACHE_SCALES_NAME).write_text(
            json.dumps(
                {
                    "note": "FP8 KV per-tensor scales = amax/448 as calibrated; TRT-LLM's export clamps "
                    "kv_cache_scaling_factor to >= 1.0 (exported_kv_cache_scaling_factor)",
                    "layers": kv_cache,
                },
                indent=1,
            )
            + "\n"
        )
        hf_tmp = tmp / HF_DIR_NAME
        with torch.inference_mode(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            export_hf_checkpoint(model, dtype=source_dtype, export_dir=str(hf_tmp))
        tokenizer_files = copy_tokenizer_files(hf_dir, hf_tmp)
        kv = stats.to_scales("fp8", source="hf-transformers fp32 cache (post-rotary K), calibration pass")
        kv.write(tmp / KV_SCALES_NAME)
        meta = {
            "source": str(hf_dir),
            "samples": len(sequences),
            "tokens": sum(len(s) for s in sequences),
            "max_seq_len": max_seq_len,
            "algorithm": algorithm,
            "quant_cfg": "FP8_DEFAULT_CFG + FP8_KV_CFG",
            "decoder_type": decoder,
            "trtllm_dtype": trtllm_dtype,
            "hf_export_dtype": str(source_dtype).removeprefix("torch."),
            "trtllm_config_fixes": fixes,
            "tokenizer_files": tokenizer_files,
            "amax": amax,
            "amax_calibrated": amax_calibrated,
            "fused_groups_shared_scale": fused,
            "calibration_seconds": round(t_cal, 3),
            "total_seconds": round(time.perf_counter() - t0, 3),
            "tools": package_versions(_TOOLS),
        }
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1) + "\n")
        (tmp / "calibration.log").write_text(log.getvalue())
        for p in (tmp, *tmp.rglob("*")):
            p.chmod(0o755 if p.is_dir() else 0o644)
    return Fp8CalibrationResult(
        out_dir=out_dir,
        hf_checkpoint_dir=out_dir / HF_DIR_NAME,
        trtllm_checkpoint_dir=out_dir / TRTLLM_DIR_NAME,
        kv_scales=kv,
        trtllm_kv_scales=kv_cache,
        modelopt_state_path=out_dir / STATE_NAME,
        meta=meta,
    )


def _publish(tmp: Path, out_dir: Path) -> None:
    """Move the finished temp folder into place: a rename when out_dir is new, else entry by entry (each
    os.replace is atomic), so an existing out_dir (e.g. a build stage's folder) keeps its other files."""
    if not out_dir.exists():
        os.replace(tmp, out_dir)
        return
    for item in sorted(tmp.iterdir()):
        target = out_dir / item.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(item, target)
    tmp.rmdir()


def load_fake_quant_model(calib_dir: Path, source_hf_dir: Path | None = None) -> PreTrainedModel:
    """The ModelOpt fake-quant model of a calibrate_fp8 output folder (mto.restore over the fp32 source)."""
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq

    meta_path = calib_dir / META_NAME
    if not meta_path.is_file() or not (calib_dir / STATE_NAME).is_file():
        raise BadInput(f"{calib_dir}: not a calibrate_fp8 output (needs {META_NAME} and {STATE_NAME})")
    src = source_hf_dir or Path(json.loads(meta_path.read_text())["source"])
    model = load_hf_model(src)
    model = mto.restore(model, str(calib_dir / STATE_NAME))
    mtq.fold_weight(model)  # quantize-dequantize the weights once instead of on every forward (same numbers)
    model.eval()
    return model
