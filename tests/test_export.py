"""The ONNX export: logits equal HF transformers, weights bit-identical (fp32), int8/int4 differ measurably,
and the graph contract the runtimes rely on (inputs, positions derived from the attention mask)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPTS = [
    "Once upon a time",
    "The little dog ran to the park and",
    "Lily liked to play with her red ball. One day, she saw a big tree.",
    "Tom and Sue were friends.",
]


@pytest.fixture(scope="module")
def hf_model(stories_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(stories_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def fp32(engine_factory):
    from llmkiln.runtime.simple import SimpleGenerator

    return SimpleGenerator(engine_factory("stories-fp32"))


def _hf_logits(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].numpy()


def test_logits_match_hf_transformers(fp32, hf_model) -> None:
    for prompt in PROMPTS:
        ids = fp32.encode(prompt)
        assert ids[0] == 1  # the tokenizer's post-processor adds BOS
        ours = fp32.prompt_logits(ids)
        ref = _hf_logits(hf_model, ids)
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0, err_msg=prompt)


def test_decode_steps_match_hf(fp32, hf_model) -> None:
    """Token-by-token decoding through the KV cache gives the same logits as one HF forward."""
    ids = fp32.encode(PROMPTS[2])
    logits, past = fp32.forward(ids[:3], fp32._empty_past())
    rows = [logits[-1]]
    for token in ids[3:]:
        logits, past = fp32.forward([token], past)
        rows.append(logits[-1])
    ref = _hf_logits(hf_model, ids)[2:]
    np.testing.assert_allclose(np.stack(rows), ref, atol=1e-4, rtol=0)


def _hf_reference(name: str, hf: dict[str, np.ndarray]) -> np.ndarray | None:
    """The HF tensor an ONNX initializer must equal bit for bit (MatMul weights are stored transposed)."""
    if m := re.fullmatch(r"model\.layers\.(\d+)\.attn\.qkv_proj\.MatMul\.weight", name):
        p = f"model.layers.{m[1]}.self_attn"
        return np.concatenate(
            [hf[f"{p}.q_proj.weight"], hf[f"{p}.k_proj.weight"], hf[f"{p}.v_proj.weight"]]
        ).T
    if m := re.fullmatch(r"model\.layers\.(\d+)\.attn\.([qkvo])_proj\.MatMul\.weight", name):
        return hf[f"model.layers.{m[1]}.self_attn.{m[2]}_proj.weight"].T
    if m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.(gate|up|down)_proj\.MatMul\.weight", name):
        return hf[f"model.layers.{m[1]}.mlp.{m[2]}_proj.weight"].T
    if re.fullmatch(r"model\.layers\.\d+\.(input|post_attention)_layernorm\.weight", name):
        return hf[name]
    if re.fullmatch(r"model\.layers\.\d+\.final_norm_layernorm\.weight", name):
        return hf["model.norm.weight"]
    if name == "lm_head.MatMul.weight":
        return hf.get("lm_head.weight", hf["model.embed_tokens.weight"]).T
    if name == "model.embed_tokens.weight":
        return hf[name]
    return None


def test_fp32_weights_bit_identical(engine_factory, stories_dir: Path) -> None:
    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    engine = engine_factory("stories-fp32")
    hf = load_file(stories_dir / "model.safetensors")
    model = onnx.load(str(engine / "model.onnx"), load_external_data=True)
    compared, covered = 0, set()
    for init in model.graph.initializer:
        ref = _hf_reference(init.name, hf)
        if ref is None:
            assert init.name in ("cos_cache", "sin_cache") or init.name.startswith("/model/"), init.name
            continue
        ours = numpy_helper.to_array(init)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, init.name
        assert ours.tobytes() == np.ascontiguousarray(ref).tobytes(), (
            f"{init.name} differs from the HF weights"
        )
        compared += 1
        covered.add(init.name)
    assert compared >= 5 * 7 + 2
    # every HF tensor (the tied embedding via lm_head) reached the graph
    assert "lm_head.MatMul.weight" in covered


def test_graph_io_contract(engine_factory) -> None:
    import onnx

    model = onnx.load(str(engine_factory("stories-fp32") / "model.onnx"), load_external_data=False)
    inputs = [i.name for i in model.graph.input]
    assert inputs[:2] == ["input_ids", "attention_mask"]
    assert sorted(inputs[2:]) == sorted(
        f"past_key_values.{i}.{kv}" for i in range(5) for kv in ("key", "value")
    )
    assert "logits" in [o.name for o in model.graph.output]


def test_batched_right_padded_prefill_and_decode(fp32) -> None:
    """Positions come from the mask: a right-padded batch in a shared KV buffer equals each sequence alone."""
    a, b = fp32.encode(PROMPTS[2]), fp32.encode(PROMPTS[3])
    seq, cap, kv = len(a), 64, (fp32.info.kv_heads, fp32.info.head_size)
    feed = {
        "input_ids": np.array([a, b + [0] * (seq - len(b))], np.int64),
        "attention_mask": np.array([[1] * seq, [1] * len(b) + [0] * (seq - len(b))], np.int64),
    }
    for i in range(fp32.info.num_layers):
        for part in ("key", "value"):
            feed[f"past_key_values.{i}.{part}"] = np.zeros((2, kv[0], cap, kv[1]), np.float32)
    names = [o.name for o in fp32.session.get_outputs()]
    out = dict(zip(names, fp32.session.run(None, feed), strict=True))
    np.testing.assert_allclose(out["logits"][0], fp32.prompt_logits(a), atol=1e-5)
    np.testing.assert_allclose(out["logits"][1, : len(b)], fp32.prompt_logits(b), atol=1e-5)

    step = {
        "input_ids": np.array([[7], [9]], np.int64),
        "attention_mask": np.array([[1] * (seq + 1), [1] * (len(b) + 1) + [0] * (seq - len(b))], np.int64),
    }
    for i in range(fp32.info.num_layers):
        for part in ("key", "value"):
            step[f"past_key_values.{i}.{part}"] = out[f"present.{i}.{part}"]
    out2 = dict(zip(names, fp32.session.run(None, step), strict=True))
    np.testing.assert_allclose(out2["logits"][0, 0], fp32.prompt_logits(a + [7])[-1], atol=1e-4)
    np.testing.assert_allclose(out2["logits"][1, 0], fp32.prompt_logits(b + [9])[-1], atol=1e-4)


@pytest.mark.parametrize("recipe", ["stories-int8", "stories-int4"])
def test_quantized_engines_build_generate_and_differ(engine_factory, fp32, recipe: str) -> None:
    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.simple import SimpleGenerator

    engine = engine_factory(recipe)
    manifest = EngineDir(engine).require_manifest().to_json()
    assert manifest["precision"] == recipe.split("-")[1]
    assert manifest["export"]["op_counts"].get("MatMulNBits", 0) > 0
    assert manifest["export"]["extra_options"] == {"accuracy_level": "1"}
    assert (engine / "model.onnx.data").stat().st_size < (
        engine_factory("stories-fp32") / "model.onnx.data"
    ).stat().st_size

    quant = SimpleGenerator(engine)
    ids = fp32.encode(PROMPTS[0])
    diff = np.abs(quant.prompt_logits(ids) - fp32.prompt_logits(ids)).max()
    assert diff > 1e-3, f"{recipe} logits equal fp32 (max diff {diff})"
    tokens = list(quant.generate(ids, 16))
    assert len(tokens) == 16 and quant.decode(tokens).strip()


def test_default_recipe_generated_model_matches_hf(engine_factory) -> None:
    """tiny-fp32 (the `make engine` default): a generated Llama, head_size 16 → rotary fused in GQA."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.simple import SimpleGenerator

    engine = engine_factory("tiny-fp32")
    manifest = EngineDir(engine).require_manifest().to_json()
    assert manifest["source"]["generated"] == "tiny-llama" and manifest["source"]["seed"] == 0
    assert manifest["export"]["rope"] == "fused in GQA"
    assert "RotaryEmbedding" not in manifest["export"]["op_counts"]
    gen = SimpleGenerator(engine)
    hf = AutoModelForCausalLM.from_pretrained(manifest["source"]["path"], dtype=torch.float32).eval()
    ids = gen.encode("Once upon a time, a little model learned to speak.")
    np.testing.assert_allclose(gen.prompt_logits(ids), _hf_logits(hf, ids), atol=1e-4, rtol=0)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert list(gen.generate(ids, 16, stop_at_eos=False)) == ref[0, len(ids) :].tolist()
