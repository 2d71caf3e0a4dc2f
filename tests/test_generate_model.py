"""`kiln model init` / generate_model: deterministic random Llamas that transformers and onnxruntime-genai load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything offline, before transformers is imported

import numpy as np
import pytest
from safetensors.numpy import load_file

from llmkiln.build.generate import MODEL_FILES, SPECS, generate_model, sha256_file, summarize_model
from llmkiln.build.tokenizer_builder import BOS_ID, EOS_ID, build_tokenizer
from llmkiln.errors import BadInput

TEXTS = [
    "Once upon a time there was a kiln.",
    "  Leading spaces, tabs\tand\nnew lines  ",
    "Numbers 4096 and 32000; punctuation?! (yes) — and unicode: café, naïve, 日本語, 🙂",
    "",
]


def hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_model("tiny-llama", tmp_path_factory.mktemp("gen") / "tiny-llama", seed=0)


def run_kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def test_folder_layout_and_config(tiny: Path) -> None:
    assert sorted(p.name for p in tiny.iterdir()) == sorted(MODEL_FILES)
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama" and cfg["dtype"] == "float32"
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (BOS_ID, EOS_ID)
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (BOS_ID, EOS_ID)


def test_weights_fp32_normal_and_norms_one(tiny: Path) -> None:
    spec = SPECS["tiny-llama"]
    weights = load_file(str(tiny / "model.safetensors"))
    assert {k: v.shape for k, v in weights.items()} == spec.tensor_shapes()
    assert all(v.dtype == np.float32 for v in weights.values())
    assert summarize_model(tiny).num_parameters == spec.num_parameters()
    norms = [v for k, v in weights.items() if k.endswith("norm.weight")]
    assert norms and all(np.all(v == 1.0) for v in norms)
    emb = weights["model.embed_tokens.weight"]
    assert abs(float(emb.std()) - 0.02) < 0.001 and abs(float(emb.mean())) < 0.001
    # untied: lm_head is its own tensor
    assert not np.array_equal(weights["lm_head.weight"], emb)


def test_same_seed_byte_identical_different_seed_different_weights(tiny: Path, tmp_path: Path) -> None:
    again = generate_model("tiny-llama", tmp_path / "again", seed=0)
    assert hashes(again) == hashes(tiny)
    other = hashes(generate_model("tiny-llama", tmp_path / "seed1", seed=1))
    base = hashes(tiny)
    assert other["model.safetensors"] != base["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in base.items() if k != "model.safetensors"
    }


def test_bench_llama_shape_and_parameter_count() -> None:
    spec = SPECS["bench-llama-125m"]
    n = spec.num_parameters()
    assert 110_000_000 <= n <= 140_000_000, n
    assert spec.max_position_embeddings == 4096
    assert spec.num_key_value_heads < spec.num_attention_heads
    assert spec.num_attention_heads * spec.head_dim == spec.hidden_size
    assert not spec.tie_word_embeddings and "lm_head.weight" in spec.tensor_shapes()


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_tokenizer_vocab_equals_config_and_every_id_decodes(kind: str) -> None:
    vocab_size = SPECS[kind].vocab_size
    tok = build_tokenizer(vocab_size)
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    assert sorted(tok.get_vocab(with_added_tokens=True).values()) == list(range(vocab_size))
    decoded = tok.decode_batch([[i] for i in range(vocab_size)], skip_special_tokens=False)
    assert all(isinstance(s, str) for s in decoded)
    assert tok.decode(list(range(vocab_size)))  # one long sequence of every id decodes too
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert ids[0] == BOS_ID
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_transformers_loads_tokenizer_and_runs_forward(tiny: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    cfg = json.loads((tiny / "config.json").read_text())
    assert len(tok) == cfg["vocab_size"] == model.config.vocab_size
    assert (tok.bos_token_id, tok.eos_token_id) == (BOS_ID, EOS_ID)
    for text in TEXTS[:3]:
        ids = tok(text)["input_ids"]
        assert ids[0] == BOS_ID
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert model.dtype == torch.float32
    ids = tok("The potter lit the kiln.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], cfg["vocab_size"])
    assert torch.isfinite(logits).all()
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert isinstance(tok.decode(out[0]), str)


@pytest.mark.slow
def test_onnxruntime_genai_builder_export_matches_transformers(tiny: Path, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxruntime_genai")
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "onnx"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(tiny), "-o", str(out)]
    cmd += ["-p", "fp32", "-e", "cpu", "-c", str(tmp_path / "cache")]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "model.onnx").is_file() and (out / "genai_config.json").is_file()
    genai = json.loads((out / "genai_config.json").read_text())["model"]
    assert (genai["bos_token_id"], genai["eos_token_id"], genai["vocab_size"]) == (BOS_ID, EOS_ID, 1024)

    tok = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    cfg = model.config
    for text in ["Once upon a time", "The potter lit the kiln and waited for the fire."]:
        ids = tok(text)["input_ids"]
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64),
        }
        for inp in sess.get_inputs():
            if inp.name.startswith("past_key_values."):
                feeds[inp.name] = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), dtype=np.float32)
            elif inp.name == "position_ids":
                feeds[inp.name] = np.arange(len(ids), dtype=np.int64)[None, :]
        onnx_logits = sess.run(["logits"], feeds)[0]
        with torch.no_grad():
            hf_logits = model(torch.tensor([ids])).logits.numpy()
        assert onnx_logits.shape == hf_logits.shape
        np.testing.assert_allclose(onnx_logits, hf_logits, atol=1e-4, rtol=0)


def test_refuses_to_overwrite_a_different_folder(tmp_path: Path, tiny: Path) -> None:
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="occupied"):
        generate_model("tiny-llama", occupied, seed=0)
    assert [p.name for p in occupied.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["occupied"]  # no temp folder left behind
    # an empty folder is filled, and regenerating the same model into it again is a no-op
    empty = tmp_path / "empty"
    empty.mkdir()
    generate_model("tiny-llama", empty, seed=0)
    generate_model("tiny-llama", empty, seed=0)
    assert hashes(empty) == hashes(tiny)
    with pytest.raises(BadInput, match="seed 3"):
        generate_model("tiny-llama", empty, seed=3)


def test_bad_kind_and_seed_are_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="tiny-llama"):
        generate_model("huge-llama", tmp_path / "x")  # type: ignore[arg-type]  # deliberately not a ModelKind
    with pytest.raises(BadInput, match="seed"):
        generate_model("tiny-llama", tmp_path / "x", seed=-1)
    assert not (tmp_path / "x").exists()


def test_cli_model_init(tmp_path: Path, tiny: Path) -> None:
    out = tmp_path / "cli-tiny"
    proc = run_kiln("model", "init", "tiny-llama", str(out), "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    weights_sha = sha256_file(out / "model.safetensors")
    assert weights_sha in proc.stdout and "988,288 parameters" in proc.stdout
    assert hashes(out) == hashes(tiny)  # byte-identical across processes too

    proc = run_kiln("model", "init", "tiny-llama", str(out), "--seed", "1")
    assert proc.returncode == 2 and "seed 1" in proc.stderr
    assert sha256_file(out / "model.safetensors") == weights_sha

    proc = run_kiln("model", "init", "giant-llama", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "giant-llama" in proc.stderr
    assert not (tmp_path / "nope").exists()
