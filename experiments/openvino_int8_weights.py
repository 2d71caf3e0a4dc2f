"""int8 weights on openvino-cpu: which layers to compress and which dynamic quantization, by quality and step time.

For each variant the engine's fp32 IR (an openvino-cpu engine folder built from the checkpoint; its IR is the
checkpoint's weights bit for bit) is copied, compressed with NNCF (`nncf.compress_weights` INT8_ASYM, per output
channel) minus the variant's kept layers, compiled with the variant's `DYNAMIC_QUANTIZATION_GROUP_SIZE`, and
measured:

- quality against the fp32 engine (the uncompressed IR at fp32): per-token KL(ref‖cand) and top-1 agreement over
  every position of the first `--texts` records of the eval set (`--tokens` tokens each);
- runner step medians (`OpenVinoPagedRunner._run`, no engine around it): one decode and 8 decodes on a 600-token
  past, and a 512-token prefill; `--rounds` rounds, variants in reversed order every other round.

One JSON line per variant on stdout, a table at the end. The build's own gate (24 texts against the HF checkpoint)
is the final word; this is the quick map of the options.

  python -m experiments.openvino_int8_weights --engine engines/smollm2-ov-bf16 \
      --variants checkpoint,emb,emb-dq0,emb-down,emb-down-dq0,emb-ends
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from llmkiln.calibration.datasets import load_jsonl, resolve_dataset
from llmkiln.calibration.quality_diff import token_kl
from llmkiln.engine_dir import OPENVINO_BIN, OPENVINO_XML, EngineDir

# variant -> (what the compression keeps as exported, dynamic quantization group; None = OpenVINO's default)
# keep: "emb" the token embedding (+ a tied LM head), "down" every mlp.down_proj, "ends" the first and last layer
VARIANTS: dict[str, tuple[tuple[str, ...] | None, int | None]] = {
    "checkpoint": (None, None),  # no compression
    "all": ((), None),
    "emb": (("emb",), None),
    "emb-dq0": (("emb",), 0),
    "emb-dq16": (("emb",), 16),
    "emb-down": (("emb", "down"), None),
    "emb-down-dq0": (("emb", "down"), 0),
    "emb-ends": (("emb", "ends"), None),
}


def _kept(model: Any, keep: tuple[str, ...]) -> list[str]:
    """Friendly names NNCF is to leave alone, found by structure as the build finds them
    (llmkiln.build.openvino_weights): the embedding, every down_proj (the weight MatMul fed by the MLP's
    swish(gate) * up), and the first and last decoder layers (the first and last 7 weight MatMuls: q, k, v, o,
    gate, up, down)."""
    from llmkiln.build.openvino_weights import _down_projections, _embedding_nodes, _weight_matmuls

    emb = _embedding_nodes(model)
    names: list[str] = list(emb) if "emb" in keep else []
    if "down" in keep:
        names += _down_projections(model)
    if "ends" in keep:
        weight_mms = [op for op in _weight_matmuls(model) if op.get_friendly_name() not in emb]
        names += [op.get_friendly_name() for op in weight_mms[:7] + weight_mms[-7:]]
    return names


def make_ir(src: Path, dst: Path, keep: tuple[str, ...] | None) -> int:
    """dst/openvino_model.* = src's IR compressed except `keep`; returns how many weights were compressed."""
    import nncf
    import openvino as ov

    from llmkiln.build.openvino_weights import compressed_tensors

    dst.mkdir(parents=True, exist_ok=True)
    if keep is None:
        for name in (OPENVINO_XML, OPENVINO_BIN):
            shutil.copyfile(src / name, dst / name)
        return 0
    model = ov.Core().read_model(str(src / OPENVINO_XML))
    names = _kept(model, keep)
    out = nncf.compress_weights(
        model,
        mode=nncf.CompressWeightsMode.INT8_ASYM,
        ignored_scope=nncf.IgnoredScope(names=names, validate=False),
    )
    ov.save_model(out, str(dst / OPENVINO_XML), compress_to_fp16=False)
    return compressed_tensors(out)


def runner(xml: Path, precision: str, dq: int | None) -> Any:
    from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

    extra = None if dq is None else {"DYNAMIC_QUANTIZATION_GROUP_SIZE": dq}
    return OpenVinoPagedRunner(xml, 8, 1024, None, 0, precision, compile_extra=extra)


def all_logits(r: Any, texts: list[list[int]]) -> list[np.ndarray]:
    return [r.prompt_logits(ids) for ids in texts]


def step_times(r: Any, reps: int = 40) -> dict[str, float]:
    """Median ms: decode B=1 and B=8 on a 600-token past, a 512-token prefill (on fresh blocks)."""
    bps = r.blocks_per_slot
    tables = [tuple(range(i * bps, (i + 1) * bps)) for i in range(8)]
    past = 600

    def timed(
        seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]], rows: list[int], n: int = reps
    ) -> float:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            r._run(seqs, rows)
            ts.append((time.perf_counter() - t) * 1e3)
        return statistics.median(ts)

    prefill = [("p", tuple(range(1, 513)), 0, tables[0])]
    for i in range(8):  # fill the pasts once
        r._run([("f", tuple(range(1, past + 1)), 0, tables[i])], [1])
    return {
        "b1_ms": timed([("d0", (5,), past, tables[0])], [1]),
        "b8_ms": timed([(f"d{i}", (5,), past, tables[i]) for i in range(8)], [1] * 8),
        "prefill512_ms": timed(prefill, [1], max(5, reps // 4)),
    }


@click.command()
@click.option("--engine", "engine", type=click.Path(exists=True, path_type=Path), required=True)
@click.option("--variants", default="checkpoint,emb,emb-dq0,emb-down,emb-ends")
@click.option("--precision", default="bf16")
@click.option("--texts", "n_texts", default=8)
@click.option("--tokens", default=256)
@click.option("--rounds", default=2)
def main(engine: Path, variants: str, precision: str, n_texts: int, tokens: int, rounds: int) -> None:
    folder = EngineDir(engine)
    names = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise click.BadParameter(
            f"unknown variants {unknown}; known: {', '.join(VARIANTS)}", param_hint="--variants"
        )
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder.tokenizer_file()))
    recs = load_jsonl(resolve_dataset("calibration/english-eval.jsonl"))[:n_texts]
    texts = [tok.encode(r.text).ids[:tokens] for r in recs]
    src = folder.path
    with tempfile.TemporaryDirectory(prefix="int8-variants-") as tmp:
        ref_runner = runner(src / OPENVINO_XML, "fp32", None)
        ref = all_logits(ref_runner, texts)
        ref_runner.close()
        results: dict[str, dict[str, Any]] = {}
        irs: dict[str, Path] = {}
        for name in names:
            keep, _ = VARIANTS[name]
            irs[name] = Path(tmp) / name
            n = make_ir(src, irs[name], keep)
            results[name] = {"variant": name, "compressed": n, "keep": keep, "dq_group": VARIANTS[name][1]}
        for rnd in range(rounds):
            for name in names if rnd % 2 == 0 else list(reversed(names)):
                r = runner(irs[name] / OPENVINO_XML, precision, VARIANTS[name][1])
                if rnd == 0:
                    got = all_logits(r, texts)
                    kl = np.concatenate([token_kl(a, b) for a, b in zip(ref, got, strict=True)])
                    top1 = np.concatenate(
                        [a.argmax(-1) == b.argmax(-1) for a, b in zip(ref, got, strict=True)]
                    )
                    results[name].update(mean_kl=float(kl.mean()), top1=float(top1.mean()))
                    results[name]["dq_in_force"] = r.runtime_settings.get("DYNAMIC_QUANTIZATION_GROUP_SIZE")
                for k, v in step_times(r).items():
                    results[name].setdefault(k, []).append(round(v, 2))
                r.close()
        for name in names:
            res = results[name]
            for k in ("b1_ms", "b8_ms", "prefill512_ms"):
                res[k + "_mean"] = round(statistics.mean(res[k]), 2)
            print(json.dumps(res))
        print(
            f"\n| variant | compressed | mean KL | top-1 | B=1 ms | B=8 ms | prefill 512 ms |  ({precision})"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in names:
            r = results[name]
            print(
                f"| {name} | {r['compressed']} | {r['mean_kl']:.2e} | {r['top1']:.3f} | {r['b1_ms_mean']} | "
                f"{r['b8_ms_mean']} | {r['prefill512_ms_mean']} |"
            )


if __name__ == "__main__":
    main()
