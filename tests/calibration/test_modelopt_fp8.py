"""ModelOpt FP8 + FP8 KV calibration on CPU: both exports, scales, bit-identical unquantized tensors, the fixes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from llmkiln.calibration.modelopt_fp8 import FP8_MAX, fix_trtllm_config
from llmkiln.kv_scales import KvScales

pytestmark = pytest.mark.slow
FP8 = torch.float8_e4m3fn
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def _amax(res, name: str) -> float:
    return res.meta["amax"][name]


def test_outputs_are_complete(fp8_calibration) -> None:
    res = fp8_calibration
    for rel in ("hf_checkpoint/config.json", "hf_checkpoint/hf_quant_config.json", "hf_checkpoint/model.safetensors",
                "hf_checkpoint/tokenizer.json", "trtllm_checkpoint/config.json", "trtllm_checkpoint/rank0.safetensors",
                "kv_scales.json", "kv_cache_scales.json", "modelopt_state.pth", "calibration.json"):  # fmt: skip
        assert (res.out_dir / rel).is_file(), rel
    assert not list(res.out_dir.parent.glob(".tmp-*"))
    assert res.meta["samples"] == 16 and res.meta["tokens"] > 16 * 50


def test_hf_export_quantization_block_dtypes_and_scales(fp8_calibration, stories_dir: Path) -> None:
    res = fp8_calibration
    hf = res.hf_checkpoint_dir
    qcfg = json.loads((hf / "hf_quant_config.json").read_text())["quantization"]
    assert qcfg["quant_algo"] == "FP8" and qcfg["kv_cache_quant_algo"] == "FP8"
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "FP8"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    tensors = load_file(str(hf / "model.safetensors"))
    source = load_file(str(stories_dir / "model.safetensors"))
    for layer in range(5):
        for lin in LINEARS:
            p = f"model.layers.{layer}.{lin}"
            assert tensors[f"{p}.weight"].dtype == FP8, p
            w_scale = tensors[f"{p}.weight_scale"].item()
            assert w_scale == pytest.approx(_amax(res, f"{p}.weight_quantizer") / FP8_MAX, rel=1e-6)
            i_scale = tensors[f"{p}.input_scale"].item()
            assert i_scale == pytest.approx(_amax(res, f"{p}.input_quantizer") / FP8_MAX, rel=1e-6)
            # the stored fp8 weight is exactly fake-quant(source weight): fp8(w / scale) * scale
            expected = (source[f"{p}.weight"] / w_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            assert torch.equal(tensors[f"{p}.weight"].view(torch.uint8), expected.view(torch.uint8)), p
        attn = f"model.layers.{layer}.self_attn"
        k = tensors[f"{attn}.k_proj.k_scale"].item()
        v = tensors[f"{attn}.v_proj.v_scale"].item()
        assert k == pytest.approx(_amax(res, f"{attn}.k_bmm_quantizer") / FP8_MAX, rel=1e-6)
        assert v == pytest.approx(_amax(res, f"{attn}.v_bmm_quantizer") / FP8_MAX, rel=1e-6)
    # unquantized tensors are bit-identical to the source (fp32 export dtype)
    unquantized = [n for n in source if "norm" in n or "embed" in n]
    assert unquantized
    for name in unquantized:
        assert tensors[name].dtype == source[name].dtype and torch.equal(tensors[name], source[name]), name


def test_trtllm_export_block_dtypes_scales_and_rotary_base(fp8_calibration, stories_dir: Path) -> None:
    res = fp8_calibration
    trt = res.trtllm_checkpoint_dir
    cfg = json.loads((trt / "config.json").read_text())
    hf_cfg = json.loads((stories_dir / "config.json").read_text())
    assert cfg["quantization"]["quant_algo"] == "FP8" and cfg["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert cfg["architecture"] == "LlamaForCausalLM" and cfg["dtype"] == "float16"
    assert cfg["rotary_base"] == hf_cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert res.meta["trtllm_config_fixes"]["rotary_base"]["was"] is None  # the export really dropped it
    tensors = load_file(str(trt / "rank0.safetensors"))
    source = load_file(str(stories_dir / "model.safetensors"))
    for layer in range(5):
        t, h = f"transformer.layers.{layer}", f"model.layers.{layer}"
        for name in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
            assert tensors[f"{t}.{name}.weight"].dtype == FP8, name
        qkv_amax = max(_amax(res, f"{h}.self_attn.{x}_proj.weight_quantizer") for x in "qkv")
        assert tensors[f"{t}.attention.qkv.weights_scaling_factor"].item() == pytest.approx(
            qkv_amax / FP8_MAX, rel=1e-6
        )
        dense = tensors[f"{t}.attention.dense.activation_scaling_factor"].item()
        assert dense == pytest.approx(_amax(res, f"{h}.self_attn.o_proj.input_quantizer") / FP8_MAX, rel=1e-6)
        proj = tensors[f"{t}.mlp.proj.weights_scaling_factor"].item()
        assert proj == pytest.approx(_amax(res, f"{h}.mlp.down_proj.weight_quantizer") / FP8_MAX, rel=1e-6)
        for norm_t, norm_h in (
            ("input_layernorm", "input_layernorm"),
            ("post_layernorm", "post_attention_layernorm"),
        ):
            a, b = tensors[f"{t}.{norm_t}.weight"], source[f"{h}.{norm_h}.weight"].to(torch.float16)
            assert torch.equal(a, b), norm_t
    emb = tensors["transformer.vocab_embedding.weight"]
    assert torch.equal(emb, source["model.embed_tokens.weight"].to(torch.float16))


def test_calibrated_kv_scales_are_kept_beside_the_clamped_export(fp8_calibration) -> None:
    res = fp8_calibration
    side = json.loads((res.out_dir / "kv_cache_scales.json").read_text())["layers"]
    assert len(side) == 5 and side == res.trtllm_kv_scales
    for layer in side:
        assert layer["k_scale"] == pytest.approx(layer["k_amax"] / FP8_MAX)
        assert layer["v_scale"] == pytest.approx(layer["v_amax"] / FP8_MAX)
        assert layer["kv_scale"] < 1.0  # the real calibrated value ...
        assert layer["exported_kv_cache_scaling_factor"] == 1.0  # ... and the export's clamp to >= 1.0


def test_runtime_kv_scales_schema(fp8_calibration) -> None:

    path = fp8_calibration.out_dir / "kv_scales.json"
    ours = KvScales.read(path)
    assert ours.dtype == "fp8" and ours.num_layers == 5 and all(len(k) == 4 for k in ours.k_scale)
    absmax = np.asarray(ours.provenance["k_absmax"])
    np.testing.assert_allclose(np.asarray(ours.k_scale), absmax / 448.0)
    loaded = KvScales.read(path, num_layers=5, kv_heads=4)
    np.testing.assert_allclose(loaded.scales[:, 0], np.asarray(ours.k_scale, np.float32))
    # per-head absmax never exceeds the per-tensor amax ModelOpt calibrated on the same forward passes
    per_tensor = np.array([x["k_amax"] for x in fp8_calibration.trtllm_kv_scales])
    assert np.all(absmax.max(axis=1) <= per_tensor * (1 + 1e-5))


def test_fix_trtllm_config_restores_rotary_base(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "LlamaForCausalLM"}))
    changed = fix_trtllm_config(tmp_path, {"rope_theta": 500000.0, "max_position_embeddings": 8192})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["rotary_base"] == 500000.0 and cfg["max_position_embeddings"] == 8192
    assert changed["rotary_base"] == {"was": None, "now": 500000.0}
    changed = fix_trtllm_config(tmp_path, {"rope_parameters": {"rope_theta": 1e6}})
    assert json.loads((tmp_path / "config.json").read_text())["rotary_base"] == 1e6


def test_fake_quant_candidate_is_within_its_budget(fp8_calibration) -> None:
    from llmkiln.calibration.quality_run import run_quality_diff

    budget = {"max_ppl_delta_pct": 8.0, "min_top1_agreement": 0.85, "max_mean_kl": 0.06}
    run = run_quality_diff(fp8_calibration.out_dir, samples=6, continuation_tokens=8, budget_overrides=budget,
                           out_dir=fp8_calibration.out_dir / "quality")  # fmt: skip
    s = run.result.summary
    assert run.result.candidate_kind == "modelopt-fake-quant" and run.result.passed, run.result.violations
    assert s["mean_kl"] > 1e-4  # really quantized
    assert run.report["png"].read_bytes()[:4] == b"\x89PNG"
