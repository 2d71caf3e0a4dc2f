"""A single-sequence greedy reference loop over the builder's ONNX graph with plain onnxruntime.

The quality diff scores engines with it (llmkiln.calibration), KV calibration reads its present.* outputs, and the
tests compare the batching runtime against it. The graph (onnxruntime-genai builder, GroupQueryAttention) takes
input_ids [B, S], attention_mask [B, total] and past_key_values.{i}.key/value [B, kv_heads, past, head_dim]; it
returns logits [B, S, vocab] and present.* with the past plus the new positions. Positions are derived inside the
op from the mask's row sums, so a single sequence needs no position ids. Here the KV simply grows by one step per
token (no shared buffer): simple and exact, not fast — the batching runtime (runtime/engine.py, behind
`kiln generate` and `kiln serve`) is the fast path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput

_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class SimpleGenerator:
    """Greedy or sampled generation for one sequence at a time."""

    def __init__(self, engine_dir: str | Path, intra_op_threads: int = 0) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.engine_dir = Path(engine_dir)
        folder = EngineDir(self.engine_dir)
        if not folder.has_onnx_model():
            raise BadInput(
                f"{self.engine_dir}: no model.onnx + genai_config.json; build it first with `kiln build RECIPE`"
            )
        self.info = folder.genai_config()
        model_path = folder.file(self.info.model_file)
        opts = ort.SessionOptions()
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        self.session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        tok_file = folder.tokenizer_file()
        if tok_file is None:
            raise BadInput(f"{self.engine_dir}: no tokenizer.json; rebuild the engine with `kiln build`")
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        past = next(i for i in self.session.get_inputs() if i.name.startswith("past_key_values"))
        self.kv_dtype = _ORT_TO_NUMPY.get(past.type, np.float32)

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt, with the special tokens the tokenizer's post-processor adds (e.g. BOS)."""
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _empty_past(self) -> dict[str, np.ndarray]:
        shape = (1, self.info.kv_heads, 0, self.info.head_size)
        past = {}
        for i in range(self.info.num_layers):
            past[f"past_key_values.{i}.key"] = np.zeros(shape, self.kv_dtype)
            past[f"past_key_values.{i}.value"] = np.zeros(shape, self.kv_dtype)
        return past

    def forward(
        self, ids: Sequence[int], past: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run new tokens after `past`; returns logits [len(ids), vocab] and the grown KV."""
        past_len = next(iter(past.values())).shape[2]
        feed = {
            "input_ids": np.asarray([list(ids)], dtype=np.int64),
            "attention_mask": np.ones((1, past_len + len(ids)), dtype=np.int64),
            **past,
        }
        outputs = self.session.run(None, feed)
        names = [o.name for o in self.session.get_outputs()]
        by_name = dict(zip(names, outputs, strict=True))
        present = {}
        for i in range(self.info.num_layers):
            present[f"past_key_values.{i}.key"] = by_name[f"present.{i}.key"]
            present[f"past_key_values.{i}.value"] = by_name[f"present.{i}.value"]
        return by_name["logits"][0], present

    def prompt_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits at every prompt position (one prefill), shape [len(ids), vocab]."""
        logits, _ = self.forward(ids, self._empty_past())
        return logits

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, stop_at_eos: bool = True) -> Iterator[int]:
        """Yield up to max_tokens greedily chosen token ids (stops after an EOS token when stop_at_eos)."""
        if not prompt_ids:
            raise BadInput("the prompt is empty: give at least one token")
        if max_tokens < 1:
            raise BadInput(f"max_tokens must be >= 1, got {max_tokens}")
        limit = self.info.context_length
        if limit and len(prompt_ids) + max_tokens > limit:
            raise BadInput(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the engine's context "
                f"length {limit}; lower max_tokens or shorten the prompt"
            )
        logits, past = self.forward(prompt_ids, self._empty_past())
        for n in range(max_tokens):
            token = int(np.argmax(logits[-1]))
            yield token
            if (stop_at_eos and token in self.info.eos_token_ids) or n + 1 == max_tokens:
                return
            logits, past = self.forward([token], past)
