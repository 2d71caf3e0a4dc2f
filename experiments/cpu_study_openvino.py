"""CPU kernel study, the OpenVINO part: the builder's ONNX (GroupQueryAttention) compiled by OpenVINO's CPU plugin.

Runs in its own venv (numpy + openvino only; it imports nothing of llmkiln):

    /usr/bin/python3.11 -m venv /tmp/wt20/venv-ov && /tmp/wt20/venv-ov/bin/pip install "openvino==2026.4.*" numpy
    /tmp/wt20/venv-ov/bin/python experiments/cpu_study_openvino.py ENGINE/model.onnx --out DIR/openvino.json
    /tmp/wt20/venv-ov/bin/python experiments/cpu_study_openvino.py STORIES/model.onnx --logits IDS.json \
        --out DIR/openvino-stories-logits.npz

Same shapes as experiments/cpu_kernel_study.py: decode at batch 1/4/8 on a 1600-token past, eight 100-token
suffix prefills on a 1500-token past (one at a time, and as one batch of 8), a 2048-token cold prefill; for
`f32` and the `bf16` inference precision hint. Pasts are passed as inputs (plain infer requests, no shared
buffers), as in ../shared/reference/cpu-engines.md. With --logits: full-sequence logits of the given token ids per
precision, for the quality diff's metric code in the main venv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import openvino as ov


def timed(fn, repeats: int) -> dict:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return {
        "ms": round(statistics.median(ts), 2),
        "min": round(min(ts), 2),
        "max": round(max(ts), 2),
        "n": repeats,
    }


def compile_model(path: Path, precision: str):
    core = ov.Core()
    t = time.perf_counter()
    model = core.read_model(str(path))
    cfg = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY"}
    compiled = core.compile_model(model, "CPU", cfg)
    return compiled, time.perf_counter() - t


def feeds(compiled, B: int, S: int, past: int, cfg: dict, rng) -> dict:
    L, kvh, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_size"]
    f = {
        "input_ids": rng.integers(10, min(30000, cfg["vocab_size"]), (B, S)).astype(np.int64),
        "attention_mask": np.ones((B, past + S), np.int64),
    }
    names = {i.get_any_name() for i in compiled.inputs}
    for i in range(L):
        for kind in ("key", "value"):
            f[f"past_key_values.{i}.{kind}"] = (rng.standard_normal((B, kvh, past, hd)) * 0.5).astype(
                np.float32
            )
    return {k: v for k, v in f.items() if k in names}


def run(args) -> None:
    gcfg = json.loads((args.model.parent / "genai_config.json").read_text())["model"]
    dec = gcfg["decoder"]
    cfg = {
        "num_hidden_layers": dec["num_hidden_layers"],
        "num_key_value_heads": dec["num_key_value_heads"],
        "head_size": dec["head_size"],
        "vocab_size": gcfg["vocab_size"],
    }
    rng = np.random.default_rng(0)
    out: dict = {
        "openvino": ov.__version__,
        "optimization_capabilities": ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"),
        "loadavg_start": os.getloadavg()[0],
    }
    if args.logits:
        ids = json.loads(Path(args.logits).read_text())
        arrays = {}
        for prec in ("f32", "bf16"):
            compiled, _ = compile_model(args.model, prec)
            req = compiled.create_infer_request()
            for key, toks in ids.items():
                f = feeds(compiled, 1, len(toks), 0, cfg, rng)
                f["input_ids"] = np.asarray([toks], np.int64)
                res = req.infer(f)
                arrays[f"{key}/{prec}"] = np.asarray(res[compiled.output("logits")])[0].astype(np.float32)
                arrays[f"{key}/ids"] = np.asarray(toks)
        np.savez(args.out, **arrays)
        return
    for prec in args.precisions.split(","):
        compiled, secs = compile_model(args.model, prec)
        r: dict = {"compile_s": round(secs, 2)}
        for name, (B, S, past, reps) in {
            # batch-1 shapes first: after a failed batch>1 infer the compiled model rejects later shapes too
            "decode_b1": (1, 1, 1600, args.repeats),
            "suffix_prefill_1": (1, 100, 1500, max(2, args.repeats // 2)),
            "cold_prefill_2048": (1, 2048, 0, max(2, args.repeats // 4)),
            "decode_b4": (4, 1, 1600, args.repeats),
            "decode_b8": (8, 1, 1600, args.repeats),
            "suffix_prefill_8_batched": (8, 100, 1500, max(2, args.repeats // 3)),
        }.items():
            f = feeds(compiled, B, S, past, cfg, rng)
            req = compiled.create_infer_request()  # a fresh one per shape: a failed infer poisons a request
            try:
                r[name] = timed(lambda f=f, req=req: req.infer(f), reps)
            except Exception as exc:
                r[name] = {"ms": None, "error": " ".join(str(exc).split())[:400]}
        if r["suffix_prefill_1"].get("ms") is not None:
            r["suffix_prefill_8_one_at_a_time"] = {
                "ms": round(8 * r["suffix_prefill_1"]["ms"], 1),
                "note": "8 x the one-request median",
            }
        out[prec] = r
        print(prec, json.dumps(r), flush=True)
    out["loadavg_end"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--precisions", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--logits", default=None)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
