"""Deterministic randomly initialised Llamas in Hugging Face layout, generated offline.

`generate_model(kind, out_dir, seed)` writes config.json, generation_config.json, model.safetensors (fp32) and a
byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json, special_tokens_map.json) into out_dir. Same kind
and seed give byte-identical files; weights are drawn with numpy's Generator (normal, std 0.02; norm weights 1).
The folder is written to a temporary sibling and renamed into place only when complete.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import numpy as np
from safetensors.numpy import save_file

from llmkiln.atomic import atomic_dir
from llmkiln.build.tokenizer_builder import BOS_ID, EOS_ID, write_tokenizer
from llmkiln.errors import BadInput
from llmkiln.hashing import sha256_file
from llmkiln.recipe import GeneratedModel

ModelKind = GeneratedModel  # the recipe schema owns the list of kinds
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)
INIT_STD = 0.02
WEIGHTS_FILE = "model.safetensors"
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    WEIGHTS_FILE,
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


@dataclass(frozen=True)
class LlamaSpec:
    """Shape of a generated Llama (all the numbers config.json needs)."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight tensor's HF name and shape, in a fixed order."""
        h, q, kv = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        )
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}"
            shapes[f"{p}.input_layernorm.weight"] = (h,)
            shapes[f"{p}.self_attn.q_proj.weight"] = (q, h)
            shapes[f"{p}.self_attn.k_proj.weight"] = (kv, h)
            shapes[f"{p}.self_attn.v_proj.weight"] = (kv, h)
            shapes[f"{p}.self_attn.o_proj.weight"] = (h, q)
            shapes[f"{p}.post_attention_layernorm.weight"] = (h,)
            shapes[f"{p}.mlp.gate_proj.weight"] = (self.intermediate_size, h)
            shapes[f"{p}.mlp.up_proj.weight"] = (self.intermediate_size, h)
            shapes[f"{p}.mlp.down_proj.weight"] = (h, self.intermediate_size)
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes

    def num_parameters(self) -> int:
        """Parameter count computed from the shapes (no weights needed)."""
        return sum(int(np.prod(s)) for s in self.tensor_shapes().values())

    def hf_config(self) -> dict[str, object]:
        """config.json contents for transformers' LlamaForCausalLM."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": BOS_ID,
            "dtype": "float32",
            "eos_token_id": EOS_ID,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": INIT_STD,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "pad_token_id": None,
            "pretraining_tp": 1,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }


# Registry of generated models: one entry per llmkiln.recipe.GeneratedModel.
SPECS: dict[str, LlamaSpec] = {
    # Small and fast: tests and the default recipe. GQA 8 query heads / 4 KV heads.
    "tiny-llama": LlamaSpec(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=16,
        intermediate_size=344,
        vocab_size=1024,
        max_position_embeddings=1024,
    ),
    # About 125M parameters with a 4096-token context and GQA 12/4: the model for long-context speed work.
    "bench-llama-125m": LlamaSpec(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        intermediate_size=2048,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    # The GPU smoke model: the smallest Llama TensorRT-LLM's kernels take. head_dim 64 is in the attention
    # plugin's supported set (tiny-llama's 16 is not: "Head size 16 is not supported by MMHA"), and every GEMM
    # dimension is a multiple of 16 as FP8 GEMMs want (hidden 256, q 4x64, kv 2x64, intermediate 704, vocab 1024).
    "gpu-smoke-llama": LlamaSpec(
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=704,
        vocab_size=1024,
        max_position_embeddings=1024,
    ),
}


def get_spec(kind: str) -> LlamaSpec:
    """The spec of a generated model kind; BadInput naming the allowed kinds otherwise."""
    spec = SPECS.get(kind)
    if spec is None:
        raise BadInput(f"unknown generated model kind {kind!r}; allowed: {', '.join(MODEL_KINDS)}")
    return spec


def generate_weights(spec: LlamaSpec, seed: int) -> dict[str, np.ndarray]:
    """fp32 weights: normal(0, 0.02) for matrices, ones for RMSNorm weights.

    Each tensor has its own generator seeded from (seed, crc32(name)), so a tensor's values do not depend on the
    order or number of the others.
    """
    out: dict[str, np.ndarray] = {}
    for name, shape in spec.tensor_shapes().items():
        if len(shape) == 1:
            out[name] = np.ones(shape, dtype=np.float32)
            continue
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(INIT_STD)
        out[name] = w
    return out


def generation_config() -> dict[str, object]:
    """generation_config.json contents."""
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False, "use_cache": True}


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_folder(spec: LlamaSpec, seed: int, out: Path) -> None:
    _write_json(out / "config.json", spec.hf_config())
    _write_json(out / "generation_config.json", generation_config())
    # NOTE: one metadata key only: safetensors keeps metadata in a hash map, so several keys come out in a
    # random order and the file would not be byte-identical between runs.
    save_file(generate_weights(spec, seed), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    write_tokenizer(out, spec.vocab_size, spec.max_position_embeddings)


def _same_files(a: Path, b: Path) -> bool:
    names_a = sorted(p.name for p in a.iterdir())
    names_b = sorted(p.name for p in b.iterdir())
    return names_a == names_b and all(sha256_file(a / n) == sha256_file(b / n) for n in names_a)


def generate_model(kind: ModelKind, out_dir: Path, seed: int = 0) -> Path:
    """Write a complete HF Llama folder for `kind` and `seed` into out_dir and return out_dir.

    An existing empty out_dir is replaced; an existing folder with exactly the files this call would write is
    kept as it is; any other non-empty out_dir raises BadInput.
    """
    spec = get_spec(kind)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BadInput(f"seed must be a non-negative integer, got {seed!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir} exists and is not a folder; choose another output path")
    publish = functools.partial(_move_into_place, kind=kind, seed=seed)
    with atomic_dir(out_dir, prefix=f".{out_dir.name}.tmp-", publish=publish) as tmp:
        _write_folder(spec, seed, tmp)
    return out_dir


def _move_into_place(tmp: Path, out_dir: Path, kind: str, seed: int) -> None:
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    try:
        tmp.rename(out_dir)
        return
    except OSError:
        if not out_dir.is_dir():
            raise
    # out_dir exists and is not empty (perhaps written by a concurrent call): keep it only if identical.
    if not _same_files(tmp, out_dir):
        raise BadInput(
            f"{out_dir} already exists and does not hold the generated {kind} (seed {seed}); "
            "remove it or choose another output folder"
        )


@dataclass(frozen=True)
class ModelSummary:
    """What a generated (or any safetensors Llama) folder holds: parameter count and file hashes."""

    path: Path
    num_parameters: int
    file_sha256: dict[str, str]
    file_bytes: dict[str, int]


def safetensors_num_parameters(path: Path) -> int:
    """Parameter count from a safetensors header (no tensor data read)."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(int(np.prod(v["shape"])) for k, v in header.items() if k != "__metadata__")


def summarize_model(path: Path) -> ModelSummary:
    """Parameter count and sha256 of every file in a model folder."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file())
    return ModelSummary(
        path=path,
        num_parameters=safetensors_num_parameters(path / WEIGHTS_FILE),
        file_sha256={p.name: sha256_file(p) for p in files},
        file_bytes={p.name: p.stat().st_size for p in files},
    )
