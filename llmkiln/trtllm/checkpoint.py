"""From ModelOpt's TensorRT-LLM export to a validated TensorRT-LLM checkpoint (config.json + rank*.safetensors).

ModelOpt's `export_tensorrt_llm_checkpoint` writes the unified checkpoint layout trtllm-build reads
(../shared/reference/trtllm-triton.md §1.2). Two known defects are repaired here, idempotently:
- under transformers 5.x the export drops `rotary_base` (rope_theta moved into `rope_parameters`), and with it any
  `rotary_scaling` (Llama-3.1 "llama3" rope). Both are restored from the HF config; a value that is present but
  disagrees with the HF config is an error. A `rotary_scaling` of rope_type "default" is normalized to null
  (TensorRT-LLM 1.1 raises on it; null is the default rope).
- nothing else is changed: ModelOpt clamps KV scales to >= 1.0 on export; the calibrated values are kept next to
  the checkpoint by the calibration stage and reported here, never written into the checkpoint.

Then the checkpoint is validated: config fields (architecture, dtype, quantization FP8/FP8, mapping, rotary_base,
shapes agreeing with the HF config), one rank file per rank, every tensor a Llama engine needs under its
TensorRT-LLM name (transformer.layers.<i>.attention.qkv.weight …), FP8 weights with positive finite per-tensor
weight/activation scales, and a KV-cache scale per layer. Tensor metadata is read from the safetensors header
(no 8 GB load); only the scalar scales are read as tensors.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BuildFailed

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
FP8_LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
LAYER_NORMS = ("input_layernorm.weight", "post_layernorm.weight")
FP8_DTYPE = "F8_E4M3"  # safetensors' name for torch.float8_e4m3fn
DTYPE_NAMES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}


@dataclass
class CheckpointSummary:
    """What the checkpoint holds: recorded in the manifest and the plan file."""

    path: str
    architecture: str
    dtype: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    tp_size: int
    pp_size: int
    num_layers: int
    rotary_base: float
    rotary_scaling: dict[str, Any] | None
    rank_files: list[str]
    num_tensors: int
    restored: list[str] = field(default_factory=list)
    kv_cache_scales: list[float] = field(default_factory=list)
    weight_scale_range: tuple[float, float] = (0.0, 0.0)
    activation_scale_range: tuple[float, float] = (0.0, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fail(ckpt: Path, msg: str) -> BuildFailed:
    return BuildFailed(f"TensorRT-LLM checkpoint {ckpt}: {msg}")


def rope_settings(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rotary_base, rotary_scaling or None) from an HF config (transformers 5 `rope_parameters` or 4.x keys)."""
    params = hf_config.get("rope_parameters") or {}
    legacy = hf_config.get("rope_scaling") or {}
    theta = params.get("rope_theta", hf_config.get("rope_theta"))
    if theta is None:
        theta = 10000.0  # transformers' LlamaConfig default
    rope_type = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    if rope_type == "default":
        return float(theta), None
    source = params if params.get("rope_type") else legacy
    scaling = {k: v for k, v in source.items() if k not in ("rope_theta", "rope_type", "type")}
    return float(theta), {"type": rope_type, **scaling}


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """{tensor name: {dtype, shape, data_offsets}} from a safetensors file's JSON header."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError) as exc:
        raise BuildFailed(f"{path}: not a readable safetensors file ({exc})") from exc
    header.pop("__metadata__", None)
    return header


def restore_rope(ckpt_dir: Path, hf_config: dict[str, Any]) -> list[str]:
    """Put rotary_base (and rotary_scaling) from the HF config into config.json; returns the keys restored."""
    cfg_path = ckpt_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    base, scaling = rope_settings(hf_config)
    restored = []
    if "rotary_base" not in cfg:
        cfg["rotary_base"] = base
        restored.append("rotary_base")
    elif not math.isclose(float(cfg["rotary_base"]), base, rel_tol=1e-6):
        raise _fail(
            ckpt_dir, f"config.json rotary_base={cfg['rotary_base']} but the HF config says rope_theta={base}"
        )
    current = cfg.get("rotary_scaling")
    if isinstance(current, dict) and (current.get("rope_type") or current.get("type")) == "default":
        # TensorRT-LLM 1.1 raises on rotary_scaling {rope_type: default}; absent (null) means default rope
        cfg["rotary_scaling"] = None
        restored.append("rotary_scaling (rope_type default -> null)")
    elif scaling is not None and not current:
        cfg["rotary_scaling"] = scaling
        restored.append("rotary_scaling")
    if restored:
        # a new inode (temp + rename): never modifies a hard-linked earlier file in place
        write_text_atomic(cfg_path, json.dumps(cfg, indent=2) + "\n")
    return restored


def _expect(cond: bool, ckpt: Path, msg: str) -> None:
    if not cond:
        raise _fail(ckpt, msg)


def _check_config(ckpt: Path, cfg: dict[str, Any], hf: dict[str, Any], dtype: str, tp: int, pp: int) -> None:
    arch = cfg.get("architecture")
    _expect(
        arch in LLAMA_ARCHITECTURES, ckpt, f"architecture {arch!r}; expected one of {LLAMA_ARCHITECTURES}"
    )
    _expect(
        cfg.get("dtype") == dtype, ckpt, f"dtype {cfg.get('dtype')!r}; the recipe asks trtllm.dtype={dtype!r}"
    )
    quant = cfg.get("quantization") or {}
    _expect(
        quant.get("quant_algo") == "FP8",
        ckpt,
        f"quantization.quant_algo {quant.get('quant_algo')!r}, want 'FP8'",
    )
    _expect(
        quant.get("kv_cache_quant_algo") == "FP8",
        ckpt,
        f"quantization.kv_cache_quant_algo {quant.get('kv_cache_quant_algo')!r}, want 'FP8'",
    )
    mapping = cfg.get("mapping") or {}
    want = {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
    got = {k: mapping.get(k) for k in want}
    _expect(got == want, ckpt, f"mapping {got}; the recipe asks {want} (trtllm.tp_size/pp_size)")
    _expect("rotary_base" in cfg, ckpt, "config.json has no rotary_base (run restore_rope first)")
    pairs = {
        "num_hidden_layers": "num_hidden_layers",
        "num_attention_heads": "num_attention_heads",
        "hidden_size": "hidden_size",
        "intermediate_size": "intermediate_size",
        "vocab_size": "vocab_size",
    }
    for ck, hk in pairs.items():
        _expect(
            cfg.get(ck) == hf.get(hk), ckpt, f"{ck}={cfg.get(ck)} but the HF config has {hk}={hf.get(hk)}"
        )
    kv = hf.get("num_key_value_heads") or hf.get("num_attention_heads")
    _expect(
        cfg.get("num_key_value_heads") == kv,
        ckpt,
        f"num_key_value_heads={cfg.get('num_key_value_heads')}, HF {kv}",
    )


def _check_tensors(
    ckpt: Path, cfg: dict[str, Any], headers: dict[str, dict[str, dict[str, Any]]], tp: int
) -> tuple[list[str], dict[str, str]]:
    """Required names/dtypes/shapes across all rank files; returns (scale tensor names, name -> rank file)."""
    where: dict[str, str] = {}
    meta: dict[str, dict[str, Any]] = {}
    for rank_file, header in headers.items():
        for name, info in header.items():
            where.setdefault(name, rank_file)
            meta.setdefault(name, info)
    dtype_name = DTYPE_NAMES[cfg["dtype"]]
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_size") or hidden // heads
    shapes = {
        "attention.qkv": [(heads + 2 * kv_heads) * head_dim // tp, hidden],
        "attention.dense": [hidden, heads * head_dim // tp],
        "mlp.fc": [inter // tp, hidden],
        "mlp.gate": [inter // tp, hidden],
        "mlp.proj": [hidden, inter // tp],
    }
    excluded = set((cfg.get("quantization") or {}).get("exclude_modules") or [])
    scales: list[str] = []
    required = ["transformer.vocab_embedding.weight", "transformer.ln_f.weight"]
    if not cfg.get("share_embedding_table"):
        required.append("lm_head.weight")
    for name in required:
        _expect(name in meta, ckpt, f"tensor {name} is missing")
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"transformer.layers.{i}"
        for norm in LAYER_NORMS:
            n = f"{prefix}.{norm}"
            _expect(n in meta, ckpt, f"tensor {n} is missing")
            _expect(
                meta[n]["dtype"] == dtype_name, ckpt, f"{n} has dtype {meta[n]['dtype']}, want {dtype_name}"
            )
        for lin in FP8_LINEARS:
            w = f"{prefix}.{lin}.weight"
            _expect(w in meta, ckpt, f"tensor {w} is missing")
            _expect(
                meta[w]["shape"] == shapes[lin], ckpt, f"{w} has shape {meta[w]['shape']}, want {shapes[lin]}"
            )
            if f"{prefix}.{lin}" in excluded:
                continue
            _expect(
                meta[w]["dtype"] == FP8_DTYPE,
                ckpt,
                f"{w} has dtype {meta[w]['dtype']}, want FP8 ({FP8_DTYPE})",
            )
            for kind in ("weights_scaling_factor", "activation_scaling_factor"):
                s = f"{prefix}.{lin}.{kind}"
                _expect(s in meta, ckpt, f"FP8 scale {s} is missing")
                scales.append(s)
        kv = f"{prefix}.attention.kv_cache_scaling_factor"
        _expect(kv in meta, ckpt, f"FP8 KV-cache scale {kv} is missing")
        scales.append(kv)
    return scales, where


def _read_scales(ckpt: Path, names: list[str], where: dict[str, str]) -> dict[str, float]:
    from safetensors import safe_open  # torch-backed: FP8 checkpoints need torch dtypes

    out: dict[str, float] = {}
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(where[n], []).append(n)
    for rank_file, group in by_file.items():
        with safe_open(str(ckpt / rank_file), framework="pt") as fh:
            for n in group:
                t = fh.get_tensor(n).float().flatten()
                _expect(t.numel() == 1, ckpt, f"{n} holds {t.numel()} values; per-tensor FP8 scales hold one")
                v = float(t[0])
                _expect(math.isfinite(v) and v > 0, ckpt, f"{n} = {v}; scales must be positive and finite")
                out[n] = v
    return out


def validate_checkpoint(
    ckpt_dir: Path, hf_config: dict[str, Any], *, dtype: str, tp_size: int = 1, pp_size: int = 1
) -> CheckpointSummary:
    """Check a TensorRT-LLM FP8 checkpoint folder against the HF config and the recipe; BuildFailed if wrong."""
    ckpt_dir = Path(ckpt_dir)
    cfg_path = ckpt_dir / "config.json"
    _expect(cfg_path.is_file(), ckpt_dir, "config.json is missing")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as exc:
        raise _fail(ckpt_dir, f"config.json is not JSON ({exc})") from exc
    _check_config(ckpt_dir, cfg, hf_config, dtype, tp_size, pp_size)
    world = tp_size * pp_size
    rank_files = [f"rank{r}.safetensors" for r in range(world)]
    for rf in rank_files:
        _expect((ckpt_dir / rf).is_file(), ckpt_dir, f"{rf} is missing (world size {world})")
    extra = sorted(p.name for p in ckpt_dir.glob("rank*.safetensors") if p.name not in rank_files)
    _expect(not extra, ckpt_dir, f"unexpected rank files {extra} for world size {world}")
    headers = {rf: read_safetensors_header(ckpt_dir / rf) for rf in rank_files}
    scale_names, where = _check_tensors(ckpt_dir, cfg, headers, tp_size)
    values = _read_scales(ckpt_dir, scale_names, where)
    kv = [values[n] for n in scale_names if n.endswith("kv_cache_scaling_factor")]
    w = [v for n, v in values.items() if n.endswith("weights_scaling_factor")]
    a = [v for n, v in values.items() if n.endswith("activation_scaling_factor")]
    quant = cfg["quantization"]
    return CheckpointSummary(
        path=str(ckpt_dir),
        architecture=cfg["architecture"],
        dtype=cfg["dtype"],
        quant_algo=quant.get("quant_algo"),
        kv_cache_quant_algo=quant.get("kv_cache_quant_algo"),
        tp_size=tp_size,
        pp_size=pp_size,
        num_layers=cfg["num_hidden_layers"],
        rotary_base=float(cfg["rotary_base"]),
        rotary_scaling=cfg.get("rotary_scaling"),
        rank_files=rank_files,
        num_tensors=sum(len(h) for h in headers.values()),
        kv_cache_scales=kv,
        weight_scale_range=(min(w), max(w)) if w else (0.0, 0.0),
        activation_scale_range=(min(a), max(a)) if a else (0.0, 0.0),
    )


def finalize_checkpoint(
    ckpt_dir: Path, hf_dir: Path, *, dtype: str, tp_size: int = 1, pp_size: int = 1
) -> CheckpointSummary:
    """Repair (rotary_base / rotary_scaling from the HF config) and validate a ModelOpt TensorRT-LLM export."""
    ckpt_dir, hf_dir = Path(ckpt_dir), Path(hf_dir)
    _expect((ckpt_dir / "config.json").is_file(), ckpt_dir, "config.json is missing (did the export run?)")
    hf_config = json.loads((hf_dir / "config.json").read_text())
    restored = restore_rope(ckpt_dir, hf_config)
    summary = validate_checkpoint(ckpt_dir, hf_config, dtype=dtype, tp_size=tp_size, pp_size=pp_size)
    summary.restored = restored
    return summary
