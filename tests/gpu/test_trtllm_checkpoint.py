"""The TensorRT-LLM checkpoint from ModelOpt's FP8 export: config fields, tensor names, scales, rotary_base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmkiln.errors import BuildFailed
from llmkiln.trtllm.checkpoint import (
    FP8_LINEARS,
    finalize_checkpoint,
    read_safetensors_header,
    rope_settings,
    validate_checkpoint,
)

pytestmark = pytest.mark.slow


@pytest.fixture()
def ckpt(cpu_build, tmp_path: Path) -> Path:
    """A private copy of the build's checkpoint (tests may damage it)."""
    dst = tmp_path / "checkpoint"
    shutil.copytree(cpu_build.pending / "checkpoint", dst)
    return dst


def test_config_fields(cpu_build) -> None:
    cfg = json.loads((cpu_build.pending / "checkpoint" / "config.json").read_text())
    hf = cpu_build.hf_config()
    assert cfg["architecture"] == "LlamaForCausalLM"
    assert cfg["dtype"] == "float16"
    assert cfg["quantization"]["quant_algo"] == "FP8"
    assert cfg["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert cfg["mapping"] == {"world_size": 1, "tp_size": 1, "pp_size": 1}
    base, _ = rope_settings(hf)
    assert cfg["rotary_base"] == pytest.approx(base)
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size"):
        assert cfg[key] == hf[key]
    assert cfg["num_key_value_heads"] == hf["num_key_value_heads"]


def test_tensor_names_dtypes_and_scales(cpu_build) -> None:
    ckpt = cpu_build.pending / "checkpoint"
    cfg = json.loads((ckpt / "config.json").read_text())
    header = read_safetensors_header(ckpt / "rank0.safetensors")
    assert "transformer.vocab_embedding.weight" in header and "transformer.ln_f.weight" in header
    for i in range(cfg["num_hidden_layers"]):
        p = f"transformer.layers.{i}"
        assert header[f"{p}.attention.qkv.weight"]["dtype"] == "F8_E4M3"
        for lin in FP8_LINEARS:
            assert header[f"{p}.{lin}.weight"]["dtype"] == "F8_E4M3"
            assert header[f"{p}.{lin}.weights_scaling_factor"]["shape"] in ([1], [])
            assert header[f"{p}.{lin}.activation_scaling_factor"]["dtype"] == "F32"
        assert f"{p}.attention.kv_cache_scaling_factor" in header
        assert header[f"{p}.input_layernorm.weight"]["dtype"] == "F16"
    s = validate_checkpoint(ckpt, cpu_build.hf_config(), dtype="float16")
    assert len(s.kv_cache_scales) == cfg["num_hidden_layers"]
    assert all(v >= 1.0 for v in s.kv_cache_scales)  # ModelOpt's export clamps KV scales to >= 1.0
    lo, hi = s.weight_scale_range
    assert 0 < lo <= hi
    assert s.activation_scale_range[0] > 0


def test_calibrated_kv_scales_are_kept_next_to_the_clamped_export(cpu_build) -> None:
    path = cpu_build.pending / "calibration" / "kv_cache_scales.json"
    assert path.is_file(), (
        f"calibrate_fp8 must keep the calibrated KV scales beside the export: {path} is missing"
    )
    layers = json.loads(path.read_text())["layers"]
    exported = validate_checkpoint(cpu_build.pending / "checkpoint", cpu_build.hf_config(), dtype="float16")
    assert len(layers) == len(exported.kv_cache_scales)
    for layer, clamped in zip(layers, exported.kv_cache_scales, strict=True):
        assert layer["kv_scale"] == pytest.approx(max(layer["k_amax"], layer["v_amax"]) / 448.0)
        assert clamped == pytest.approx(max(layer["kv_scale"], 1.0))


def test_rotary_base_restored_when_missing(cpu_build, ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.pop("rotary_base")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    hf_dir = ckpt.parent / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(cpu_build.hf_config()))
    s = finalize_checkpoint(ckpt, hf_dir, dtype="float16")
    assert s.restored == ["rotary_base"]
    assert json.loads((ckpt / "config.json").read_text())["rotary_base"] == pytest.approx(
        rope_settings(cpu_build.hf_config())[0]
    )
    assert finalize_checkpoint(ckpt, hf_dir, dtype="float16").restored == []  # idempotent


def test_rotary_base_disagreeing_with_hf_is_an_error(cpu_build, ckpt: Path, tmp_path: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rotary_base"] = 12345.0
    (ckpt / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cpu_build.hf_config()))
    with pytest.raises(BuildFailed, match="rotary_base=12345"):
        finalize_checkpoint(ckpt, tmp_path / "hf", dtype="float16")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"quantization": {"quant_algo": "W8A16", "kv_cache_quant_algo": "FP8"}}, "quant_algo 'W8A16'"),
        ({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None}}, "kv_cache_quant_algo None"),
        ({"dtype": "bfloat16"}, "dtype 'bfloat16'"),
        ({"architecture": "GPT2LMHeadModel"}, "architecture 'GPT2LMHeadModel'"),
        ({"mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}, "mapping"),
    ],
)
def test_bad_config_is_rejected(cpu_build, ckpt: Path, edit: dict, message: str) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(edit)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BuildFailed, match=message):
        validate_checkpoint(ckpt, cpu_build.hf_config(), dtype="float16")


def test_missing_tensor_and_bad_scale_are_rejected(cpu_build, ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(ckpt / "rank0.safetensors")
    name = "transformer.layers.1.attention.kv_cache_scaling_factor"
    kept = {k: v for k, v in tensors.items() if k != name}
    save_file(kept, ckpt / "rank0.safetensors")
    with pytest.raises(BuildFailed, match=name.replace(".", r"\.")):
        validate_checkpoint(ckpt, cpu_build.hf_config(), dtype="float16")
    tensors[name] = tensors[name] * 0
    save_file(tensors, ckpt / "rank0.safetensors")
    with pytest.raises(BuildFailed, match="positive and finite"):
        validate_checkpoint(ckpt, cpu_build.hf_config(), dtype="float16")


def test_rope_settings_transformers5_and_legacy() -> None:
    llama3 = {
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    }
    base, scaling = rope_settings(llama3)
    assert base == 500000.0
    assert scaling == {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert rope_settings({"rope_theta": 10000.0}) == (10000.0, None)
    assert rope_settings({"rope_theta": 1e6, "rope_scaling": {"type": "linear", "factor": 2.0}}) == (
        1e6,
        {"type": "linear", "factor": 2.0},
    )


def test_rotary_scaling_of_rope_type_default_is_normalized_to_null(tmp_path: Path) -> None:
    """TensorRT-LLM 1.1 raises on rotary_scaling {rope_type: default}: the checkpoint gets null instead."""

    from llmkiln.trtllm.checkpoint import restore_rope

    (tmp_path / "config.json").write_text(
        json.dumps({"rotary_base": 10000.0, "rotary_scaling": {"rope_type": "default", "factor": 1.0}})
    )
    restored = restore_rope(tmp_path, {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})
    assert restored == ["rotary_scaling (rope_type default -> null)"]
    assert json.loads((tmp_path / "config.json").read_text())["rotary_scaling"] is None


def test_hf_checkpoint_config_gets_transformers_4_rope_keys() -> None:
    """The container's transformers 4.57 reads rope_theta / rope_scaling, not transformers 5's rope_parameters."""
    from llmkiln.trtllm.hf_checkpoint import normalize_config

    llama3 = {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}}  # fmt: skip
    changed = normalize_config(llama3)
    assert llama3["rope_theta"] == 500000.0
    assert llama3["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    assert len(changed) == 2 and normalize_config(llama3) == []  # idempotent
    default = {
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "rope_scaling": {"rope_type": "default"},
    }
    normalize_config(default)
    assert default["rope_theta"] == 10000.0 and "rope_scaling" not in default
