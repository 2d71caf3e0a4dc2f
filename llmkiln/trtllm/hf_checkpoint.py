"""The ModelOpt unified HF checkpoint as TensorRT-LLM's PyTorch backend reads it (backend trtllm-llmapi).

`calibrate_fp8` exports it with transformers 5, which keeps rope settings only under `rope_parameters`. The
pinned container reads config.json with its own transformers (4.57 in TensorRT-LLM 1.2.x requirements), which
knows only the top-level `rope_theta` and `rope_scaling`: without them a Llama-3 checkpoint would load with
theta 10000 and no llama3 scaling. `normalize_config` writes both from rope_parameters (same values), and
drops a `rope_scaling` whose rope_type is "default" (TensorRT-LLM 1.1 raises on it; absent means default).
`validate_hf_checkpoint` checks what the loader needs: config.json, hf_quant_config.json with FP8 weights and
FP8 KV, weights, tokenizer files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmkiln.atomic import write_text_atomic
from llmkiln.errors import BuildFailed
from llmkiln.hashing import sha256_file
from llmkiln.trtllm.checkpoint import rope_settings

QUANT_CONFIG = "hf_quant_config.json"


def normalize_config(cfg: dict[str, Any]) -> list[str]:
    """Make `cfg` readable by transformers 4.x as well as 5.x (in place); returns what changed."""
    changed = []
    theta, scaling = rope_settings(cfg)
    if cfg.get("rope_theta") != theta:
        cfg["rope_theta"] = theta
        changed.append(f"rope_theta={theta}")
    legacy = cfg.get("rope_scaling")
    if scaling is None:
        if legacy is not None:
            cfg.pop("rope_scaling")
            changed.append("rope_scaling (rope_type default) removed")
    else:
        want = {"rope_type": scaling["type"], **{k: v for k, v in scaling.items() if k != "type"}}
        if legacy != want:
            cfg["rope_scaling"] = want
            changed.append(f"rope_scaling={want}")
    return changed


def normalize_checkpoint(ckpt: Path) -> list[str]:
    path = Path(ckpt) / "config.json"
    cfg = json.loads(path.read_text())
    changed = normalize_config(cfg)
    if changed:
        write_text_atomic(path, json.dumps(cfg, indent=2) + "\n")
    return changed


def validate_hf_checkpoint(ckpt: Path) -> dict[str, Any]:
    """What a PyTorch-backend load needs; BuildFailed naming the file otherwise. Returns the manifest part."""
    ckpt = Path(ckpt)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise BuildFailed(f"HF checkpoint {ckpt}: {msg}")

    need((ckpt / "config.json").is_file(), "config.json is missing")
    need((ckpt / QUANT_CONFIG).is_file(), f"{QUANT_CONFIG} is missing (not a ModelOpt export)")
    quant = json.loads((ckpt / QUANT_CONFIG).read_text()).get("quantization") or {}
    need(
        quant.get("quant_algo") == "FP8",
        f"{QUANT_CONFIG}: quant_algo {quant.get('quant_algo')!r}, want 'FP8'",
    )
    need(
        quant.get("kv_cache_quant_algo") == "FP8",
        f"{QUANT_CONFIG}: kv_cache_quant_algo {quant.get('kv_cache_quant_algo')!r}, want 'FP8'",
    )
    weights = sorted(p.name for p in ckpt.glob("*.safetensors"))
    need(bool(weights), "no *.safetensors weights")
    need((ckpt / "tokenizer.json").is_file() or (ckpt / "tokenizer.model").is_file(), "no tokenizer files")
    cfg = json.loads((ckpt / "config.json").read_text())
    need("rope_theta" in cfg, "config.json has no top-level rope_theta (run normalize_checkpoint)")
    return {
        "quant_algo": quant["quant_algo"],
        "kv_cache_quant_algo": quant["kv_cache_quant_algo"],
        "exclude_modules": quant.get("exclude_modules"),
        "rope_theta": cfg["rope_theta"],
        "rope_scaling": cfg.get("rope_scaling"),
        "sha256": {p.name: sha256_file(p) for p in sorted(ckpt.iterdir()) if p.is_file()},
    }
