"""Models the quality diff can compare, behind one small interface (`Scorer`).

- `HfScorer`: an HF folder run with transformers in fp32 (the default reference).
- `FakeQuantScorer`: a calibrate_fp8 output folder: the ModelOpt fake-quant model (mto.restore over the source).
- `OnnxScorer`: an engine folder: the builder's ONNX graph with onnxruntime; one prefill gives every position's
  logits, greedy continuation grows the KV one token at a time (runtime.simple.SimpleGenerator).
- `OpenVinoScorer`: an openvino-cpu engine folder: its IR as OpenVINO's PagedAttention graph, in the recipe's
  precision (fp32 / bf16), one slot (runtime.openvino_runner).

`open_scorer(path)` picks the right one from what the folder holds (BadInput when it is none of them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from llmkiln.calibration.modelopt_fp8 import META_NAME, STATE_NAME, load_fake_quant_model, load_hf_model
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.runtime.simple import SimpleGenerator

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Scorer(Protocol):
    """Full-sequence logits and greedy continuation of one model."""

    kind: str
    path: Path

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def logits(self, ids: list[int]) -> np.ndarray:
        """[len(ids), vocab] float32: the next-token logits at every position, from one forward."""
        ...

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """n greedily chosen next tokens after ids (EOS does not stop it)."""
        ...


class HfScorer:
    """An HF causal LM in fp32 on CPU."""

    kind = "hf-fp32"

    def __init__(self, path: Path, model: PreTrainedModel | None = None) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.model = model if model is not None else load_hf_model(self.path)
        tok_dir = self.path if (self.path / "tokenizer_config.json").is_file() else self._source_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))

    def _source_dir(self) -> Path:
        return self.path

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # a list of ids decodes to one text
        return text

    def logits(self, ids: list[int]) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0].float().numpy()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        import torch

        out: list[int] = []
        with torch.no_grad():
            res = self.model(torch.tensor([ids]), use_cache=True)
            for _ in range(n):
                tok = int(res.logits[0, -1].argmax())
                out.append(tok)
                res = self.model(torch.tensor([[tok]]), past_key_values=res.past_key_values, use_cache=True)
        return out


class FakeQuantScorer(HfScorer):
    """The ModelOpt fake-quant model of a calibrate_fp8 output folder."""

    kind = "modelopt-fake-quant"

    def __init__(self, calib_dir: Path, source: Path | None = None) -> None:
        self.calib_dir = Path(calib_dir)
        self.source = source or Path(json.loads((self.calib_dir / META_NAME).read_text())["source"])
        super().__init__(self.calib_dir, model=load_fake_quant_model(self.calib_dir, self.source))

    def _source_dir(self) -> Path:
        return self.source


class OnnxScorer:
    """An engine folder (model.onnx from the onnxruntime-genai builder) run with onnxruntime."""

    kind = "onnx-engine"

    def __init__(self, engine_dir: Path) -> None:
        self.path = Path(engine_dir)
        self.gen = SimpleGenerator(self.path)

    def encode(self, text: str) -> list[int]:
        return self.gen.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.gen.decode(ids)

    def logits(self, ids: list[int]) -> np.ndarray:
        return np.asarray(self.gen.prompt_logits(ids), dtype=np.float32)

    def greedy(self, ids: list[int], n: int) -> list[int]:
        return list(self.gen.generate(ids, n, stop_at_eos=False))

    def present_kv(self, ids: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The cached K/V of every layer after one prefill of ids: [(key, value)], each [1, kv_heads, T, head]."""
        _, past = self.gen.forward(ids, self.gen._empty_past())
        n = self.gen.info.num_layers
        return [(past[f"past_key_values.{i}.key"], past[f"past_key_values.{i}.value"]) for i in range(n)]


class OpenVinoScorer:
    """An openvino-cpu engine folder run by its runtime's OpenVINO runner, in `precision` (fp32 / bf16)."""

    kind = "openvino-engine"

    def __init__(self, engine_dir: Path, precision: str | None = None, max_len: int = 2048) -> None:
        from tokenizers import Tokenizer

        from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner  # imports openvino

        self.path = Path(engine_dir)
        folder = EngineDir(self.path)
        xml, tok = folder.openvino_model(), folder.tokenizer_file()
        if xml is None or tok is None:
            raise BadInput(
                f"{self.path}: no openvino_model.xml/.bin + tokenizer.json; build it with `kiln build`"
            )
        self.precision = precision or folder.recipe().precision
        self.kind = f"openvino-engine-{self.precision}"
        self.max_len = min(max_len, folder.genai_config().context_length)
        self.runner = OpenVinoPagedRunner(xml, 1, self.max_len, None, 0, precision=self.precision)
        self.tokenizer = Tokenizer.from_file(str(tok))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def logits(self, ids: list[int]) -> np.ndarray:
        return self.runner.prompt_logits(ids[: self.max_len])

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out: list[int] = []
        logits = self.runner.prompt_logits(ids)[-1]
        for _ in range(n):
            out.append(int(np.argmax(logits)))
            logits = self.runner.next_logits(out[-1], len(ids) + len(out) - 1)
        return out


def is_engine(path: Path) -> bool:
    return EngineDir(path).has_onnx_model()


def is_openvino_engine(path: Path) -> bool:
    return EngineDir(path).openvino_model() is not None


def is_fake_quant(path: Path) -> bool:
    return (path / META_NAME).is_file() and (path / STATE_NAME).is_file()


def open_scorer(path: str | Path) -> Scorer:
    """The scorer for an engine folder, a calibrate_fp8 folder (or its hf_checkpoint/), or an HF folder."""
    p = Path(path)
    if not p.is_dir():
        raise BadInput(
            f"{p}: no such folder; give an engine folder, a calibration folder or an HF model folder"
        )
    if is_engine(p):
        return OnnxScorer(p)
    if is_openvino_engine(p):
        return OpenVinoScorer(p)
    if is_fake_quant(p):
        return FakeQuantScorer(p)
    if (p / "hf_quant_config.json").is_file() and is_fake_quant(p.parent):
        return FakeQuantScorer(p.parent)
    if (p / "hf_quant_config.json").is_file():
        raise BadInput(
            f"{p}: a ModelOpt HF export without its calibration folder; pass the calibrate output folder "
            "(with calibration.json and modelopt_state.pth) so the fake-quant model can be rebuilt"
        )
    if (p / "config.json").is_file():
        return HfScorer(p)
    raise BadInput(
        f"{p}: not an engine folder (model.onnx or openvino_model.xml + genai_config.json), a calibration folder "
        "(calibration.json + modelopt_state.pth) or an HF model folder (config.json)"
    )


def default_reference(candidate: Path) -> Path:
    """The fp32 HF source of a candidate: the engine manifest's source.path, or a calibration's source."""
    for base in (candidate, candidate.parent):
        if is_fake_quant(base):
            return Path(json.loads((base / META_NAME).read_text())["source"])
    manifest = EngineDir(candidate).manifest()
    if manifest is not None and Path(manifest.source.path).is_dir():
        return Path(manifest.source.path)
    raise BadInput(
        f"{candidate}: cannot tell its fp32 source model (no manifest.json source.path and no calibration.json); "
        "pass --reference HF_DIR"
    )
