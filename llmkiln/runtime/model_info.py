"""What the runtime needs to know about an exported model, read from the engine folder's genai_config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmkiln.errors import BadInput


@dataclass(frozen=True)
class ModelInfo:
    """Shapes and names of the builder's decoder graph."""

    model_file: str
    num_layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    input_ids_name: str = "input_ids"
    attention_mask_name: str = "attention_mask"
    past_key_fmt: str = "past_key_values.%d.key"
    past_value_fmt: str = "past_key_values.%d.value"
    logits_name: str = "logits"
    present_key_fmt: str = "present.%d.key"
    present_value_fmt: str = "present.%d.value"

    @classmethod
    def from_engine_dir(cls, engine_dir: Path) -> ModelInfo:
        path = Path(engine_dir) / "genai_config.json"
        try:
            cfg = json.loads(path.read_text())
            model = cfg["model"]
            dec = model["decoder"]
            eos = model.get("eos_token_id", [])
            eos_ids = tuple(int(x) for x in (eos if isinstance(eos, list) else [eos]))
            ins, outs = dec.get("inputs", {}), dec.get("outputs", {})
            return cls(
                model_file=str(dec.get("filename", "model.onnx")),
                num_layers=int(dec["num_hidden_layers"]),
                kv_heads=int(dec["num_key_value_heads"]),
                head_size=int(dec["head_size"]),
                vocab_size=int(model["vocab_size"]),
                context_length=int(model["context_length"]),
                eos_token_ids=eos_ids,
                bos_token_id=model.get("bos_token_id"),
                input_ids_name=ins.get("input_ids", "input_ids"),
                attention_mask_name=ins.get("attention_mask", "attention_mask"),
                past_key_fmt=ins.get("past_key_names", "past_key_values.%d.key"),
                past_value_fmt=ins.get("past_value_names", "past_key_values.%d.value"),
                logits_name=outs.get("logits", "logits"),
                present_key_fmt=outs.get("present_key_names", "present.%d.key"),
                present_value_fmt=outs.get("present_value_names", "present.%d.value"),
            )
        except FileNotFoundError:
            raise BadInput(
                f"{path}: missing; is {engine_dir} an engine folder built by `kiln build`?"
            ) from None
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            raise BadInput(f"{path}: not a usable genai_config.json ({type(exc).__name__}: {exc})") from None
