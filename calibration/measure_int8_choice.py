"""Measure the two INT8 options for the CPU ONNX engine on stories260K and print one JSON line per variant.

  builder-int8   onnxruntime-genai builder -p int8: 8-bit weight-only MatMulNBits, accuracy_level=1 (what we ship)
  static-int8    onnxruntime.quantization.quantize_static on the fp32 engine: QDQ, per-channel symmetric int8
                 weights + int8 activations calibrated (MinMax) on calibration/stories-calib.jsonl
  fp32           the unquantized engine

Quality: the quality diff against HF fp32 on calibration/stories-eval.jsonl. Speed: median over 5 interleaved
rounds of a 256-token prefill and of one decode step after 255 tokens (CPU, intra-op threads = onnxruntime default).
Run: .venv/bin/python calibration/measure_int8_choice.py [ENGINES_DIR]
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from llmkiln.build.pipeline import build_engine
from llmkiln.calibration.candidates import OnnxScorer, open_scorer
from llmkiln.calibration.datasets import load_jsonl, resolve_dataset
from llmkiln.calibration.quality_diff import quality_diff


def static_int8(fp32: Path, out: Path, scorer: OnnxScorer) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            feeds = []
            for rec in load_jsonl(resolve_dataset("stories-calib"))[:32]:
                ids = scorer.encode(rec.text)[:256]
                feed = {
                    "input_ids": np.array([ids], np.int64),
                    "attention_mask": np.ones((1, len(ids)), np.int64),
                }
                feeds.append({**feed, **scorer.gen._empty_past()})
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(fp32, out)
    (out / "model.onnx").unlink()
    (out / "model.onnx.data").unlink()
    quantize_static(
        str(fp32 / "model.onnx"), str(out / "model.onnx"), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
        op_types_to_quantize=["MatMul"], calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )  # fmt: skip
    return out


def timings(scorer: OnnxScorer, ids: list[int], reps: int = 20) -> tuple[float, float]:
    scorer.logits(ids)
    t = time.perf_counter()
    for _ in range(reps):
        scorer.logits(ids)
    prefill = (time.perf_counter() - t) / reps
    _, past = scorer.gen.forward(ids[:-1], scorer.gen._empty_past())
    t = time.perf_counter()
    for _ in range(reps * 5):
        scorer.gen.forward(ids[-1:], past)
    return prefill, (time.perf_counter() - t) / (reps * 5)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "engines")
    fp32 = build_engine("stories-fp32", root).engine_dir
    variants = {"builder-int8": build_engine("stories-int8", root).engine_dir, "fp32": fp32}
    variants["static-int8"] = static_int8(fp32, root / ".static-int8", OnnxScorer(fp32))
    ref = open_scorer(Path("../shared/models/stories260K").resolve() if len(sys.argv) < 3 else sys.argv[2])
    evals = load_jsonl(resolve_dataset("stories-eval"))
    scorers = {k: OnnxScorer(v) for k, v in variants.items()}
    ids = scorers["fp32"].encode(" ".join(r.text for r in evals))[:256]
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in scorers}
    for _ in range(5):
        for name, sc in scorers.items():
            times[name].append(timings(sc, ids))
    for name, sc in scorers.items():
        s = quality_diff(sc, ref, evals).summary
        print(json.dumps({
            "variant": name,
            "prefill_256_ms": round(statistics.median(t[0] for t in times[name]) * 1e3, 3),
            "decode_step_ms": round(statistics.median(t[1] for t in times[name]) * 1e3, 3),
            "mean_kl": s["mean_kl"], "top1": s["top1_agreement"], "ppl_delta_pct": s["ppl_delta_pct"],
            "greedy_exact": s["greedy_exact_match"], "mean_first_divergence": s["mean_first_divergence"],
        }))  # fmt: skip


if __name__ == "__main__":
    main()
