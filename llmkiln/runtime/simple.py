"""A single-sequence generation loop over the builder's ONNX graph with plain onnxruntime (used by `kiln generate`).

The graph (onnxruntime-genai builder, GroupQueryAttention) takes input_ids [B, S], attention_mask [B, total] and
past_key_values.{i}.key/value [B, kv_heads, past, head_dim]; it returns logits [B, S, vocab] and present.* with
the past plus the new positions. Positions are derived inside the op from the mask's row sums, so a single
sequence needs no position ids. Here the KV simply grows by one step per token (no shared buffer): simple and
exact, not fast — the batching runtime (runtime/engine.py) is the fast path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmkiln.errors import BadInput
from llmkiln.runtime.sampling import SamplingConfig, make_rng, sample_token

_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass(frozen=True)
class GraphInfo:
    """What the loop needs from genai_config.json."""

    num_layers: int
    kv_heads: int
    head_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @classmethod
    def from_engine_dir(cls, engine_dir: Path) -> GraphInfo:
        path = engine_dir / "genai_config.json"
        if not path.is_file():
            raise BadInput(
                f"{engine_dir}: no genai_config.json; is this an engine folder built by `kiln build`?"
            )
        model = json.loads(path.read_text())["model"]
        dec = model["decoder"]
        eos = model.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            num_layers=int(dec["num_hidden_layers"]),
            kv_heads=int(dec["num_key_value_heads"]),
            head_size=int(dec["head_size"]),
            context_length=int(model.get("context_length", 0)),
            eos_token_ids=eos_ids,
            bos_token_id=model.get("bos_token_id"),
        )


class SimpleGenerator:
    """Greedy or sampled generation for one sequence at a time."""

    def __init__(self, engine_dir: str | Path, intra_op_threads: int = 0) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.engine_dir = Path(engine_dir)
        model_path = self.engine_dir / "model.onnx"
        if not model_path.is_file():
            raise BadInput(f"{self.engine_dir}: no model.onnx; build it first with `kiln build RECIPE`")
        self.info = GraphInfo.from_engine_dir(self.engine_dir)
        opts = ort.SessionOptions()
        if intra_op_threads:
            opts.intra_op_num_threads = intra_op_threads
        self.session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(self.engine_dir / "tokenizer.json"))
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

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        sampling: SamplingConfig | None = None,
        seed: int | None = None,
        stop_at_eos: bool = True,
    ) -> Iterator[int]:
        """Yield up to max_tokens new token ids (stops after an EOS token when stop_at_eos)."""
        sampling = sampling or SamplingConfig()
        if not prompt_ids:
            raise BadInput("the prompt is empty: give at least one token")
        if max_tokens < 1:
            raise BadInput(f"max_tokens must be >= 1, got {max_tokens}")
        limit = self.info.context_length
        if limit and len(prompt_ids) + max_tokens > limit:
            raise BadInput(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the engine's context "
                f"length {limit}; lower --max-tokens or shorten the prompt"
            )
        rng = make_rng(seed)
        logits, past = self.forward(prompt_ids, self._empty_past())
        for n in range(max_tokens):
            token = sample_token(logits[-1], sampling.temperature, sampling.top_p, sampling.top_k, rng)
            yield token
            if (stop_at_eos and token in self.info.eos_token_ids) or n + 1 == max_tokens:
                return
            logits, past = self.forward([token], past)


def stream_text(
    engine_dir: str | Path,
    prompt: str,
    max_tokens: int = 64,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    stop_at_eos: bool = True,
) -> Iterator[str]:
    """Generate from a text prompt and yield text pieces as they complete (never half a UTF-8 character)."""
    from llmkiln.runtime.detokenizer import IncrementalDetokenizer

    gen = SimpleGenerator(engine_dir)
    prompt_ids = gen.encode(prompt)
    detok = IncrementalDetokenizer(gen.tokenizer, prompt_ids)
    for token in gen.generate(prompt_ids, max_tokens, sampling, seed, stop_at_eos):
        if piece := detok.push(token):
            yield piece
    if rest := detok.flush():
        yield rest
