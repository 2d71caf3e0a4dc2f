"""CPU kernel study (issue 20): per execution path, the time of the shared-prefix workload's engine calls.

    PYTHONPATH=. .venv/bin/python -m experiments.cpu_kernel_study --paths ort,torch --out bench/results/cpu-kernels

Shapes (bench-llama-125m): (a) one decode step at batch 1/4/8, 1600 tokens of context per row of which 1500 are
a shared prefix; (b) eight 100-token suffix prefills on a 1500-token cached past, one at a time and batched;
(c) one 2048-token cold prefill. Every number is the median of `--repeats` timed calls after one warm-up call,
with min/max. Paths:

- `ort`: llmkiln's OnnxRunner (IOBinding, in-place KV pools, last-position logits) on the builder's fp32 engine
  and, with `--int8-engine`, on an int8 MatMulNBits export (accuracy_level 4 = int8 compute).
- `torch`: experiments.torch_runner.TorchLlama on the HF checkpoint, fp32 and bf16, eager, with the
  attention formulations (segment loop = varlen, block-diagonal mask, cascade / shared prefix). `--compile` adds
  torch.compile (inductor) of the decode step and the cold prefill.
- `hf`: transformers' own LlamaForCausalLM (SDPA) cold prefill, fp32 and bf16 (the uncompiled reference).
- OpenVINO runs in its own venv: experiments/cpu_study_openvino.py (results merged by --merge).

`--quality` scores the lower precisions on stories260K with the quality diff's metric code
(llmkiln.calibration.quality_diff: KL(fp32 || candidate), top-1 agreement, greedy exact match).

`--quick` runs every path on tiny shapes (a 48-token prefix, 4 rows, a 64-token cold prompt, two quality examples;
`QUICK`), all in this process: with stories260K as the model, seconds. Its numbers measure nothing; it checks
that the study still runs (`scripts/cpu_kernel_study.sh --quick`, tests/experiments/test_cpu_kernel_study.py).
The result keys keep the full study's names (`cold_prefill_2048`, `suffix_prefill_8_*`) whatever the shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shapes:
    """The workload: a `prefix`-token shared past, `rows` suffixes of `suffix` tokens on it, decode batches of
    `batches` rows, a `cold`-token prompt; the onnxruntime runner's KV pools hold `max_len` tokens per slot; the
    linear layer `gemm` is (tokens, in, out); quality on the first `samples` texts (all: None), each cut to
    `quality_len` tokens, `continuation` greedy tokens."""

    prefix: int = 1500
    suffix: int = 100
    rows: int = 8
    cold: int = 2048
    batches: tuple[int, ...] = (1, 4, 8)
    max_len: int = 4096
    gemm: tuple[int, int, int] = (800, 768, 2304)
    samples: int | None = None
    quality_len: int = 256
    continuation: int = 32


FULL = Shapes()
QUICK = Shapes(48, 8, 4, 64, (1, 4), 256, (32, 64, 192), samples=2, quality_len=32, continuation=4)
BATCHES = FULL.batches  # the summary table's columns
MAX_ID = 30000  # random prompt ids come from [10, min(MAX_ID, vocabulary size))


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    fn()  # warm-up
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


def load_info() -> dict[str, Any]:
    load = os.getloadavg()
    return {"utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "loadavg_1m": round(load[0], 2)}


# ---------------------------------------------------------------------------------------------- onnxruntime
def study_ort(engine: Path, repeats: int, label: str, sh: Shapes = FULL) -> dict[str, Any]:
    from llmkiln.engine_dir import EngineDir
    from llmkiln.runtime.plan import DecodeItem, PrefillChunk, SchedulerOutput
    from llmkiln.runtime.runner import OnnxRunner

    info = EngineDir(engine).genai_config()
    runner = OnnxRunner(engine, info, sh.rows, sh.max_len, 16, 16 * 2**20, intra_op_threads=2)
    rng = np.random.default_rng(0)
    hi = min(MAX_ID, info.vocab_size)
    prefix = rng.integers(10, hi, sh.prefix).tolist()
    sufs = [tuple(rng.integers(10, hi, sh.suffix).tolist()) for _ in range(sh.rows)]
    for start in range(0, sh.prefix, 512):
        part = tuple(prefix[start : start + 512])
        runner.execute(SchedulerOutput(prefills=[PrefillChunk("p", 0, start, part, False)]))
    for layer in range(info.num_layers):
        runner.k[layer][1:] = runner.k[layer][0]
        runner.v[layer][1:] = runner.v[layer][0]
    res: dict[str, Any] = {"path": label, "start": load_info()}

    def one_at_a_time() -> None:
        for s in range(sh.rows):
            runner.execute(SchedulerOutput(prefills=[PrefillChunk(f"r{s}", s, sh.prefix, sufs[s], True)]))

    res["suffix_prefill_8_one_at_a_time"] = timed(one_at_a_time, max(2, repeats // 3))
    res["suffix_prefill_8_batched"] = {
        "ms": None,
        "note": "GroupQueryAttention rejects B>1 with S>1 and a past",
    }
    ctx = sh.prefix + sh.suffix
    for b in sh.batches:
        plan = SchedulerOutput(decodes=[DecodeItem(f"r{s}", s, 100, ctx) for s in range(b)])
        res[f"decode_b{b}"] = timed(lambda plan=plan: runner.execute(plan), repeats)
    cold = tuple(rng.integers(10, hi, sh.cold).tolist())
    plan = SchedulerOutput(prefills=[PrefillChunk("c", 0, 0, cold, True)])
    res["cold_prefill_2048"] = timed(lambda: runner.execute(plan), max(2, repeats // 4))
    res["end"] = load_info()
    runner.close()
    return res


# ---------------------------------------------------------------------------------------------- torch
def study_torch(
    model_dir: Path, dtype: str, repeats: int, compile_: bool, sh: Shapes = FULL
) -> dict[str, Any]:
    import torch

    from experiments import torch_runner as tr

    torch.set_num_threads(2)
    m = tr.TorchLlama(model_dir, dtype, num_slots=sh.rows, max_len=sh.cold + 64)
    g = torch.Generator().manual_seed(0)
    hi = min(MAX_ID, m.vocab_size)
    prefix = torch.randint(10, hi, (sh.prefix,), generator=g)
    sufs = [torch.randint(10, hi, (sh.suffix,), generator=g) for _ in range(sh.rows)]
    m.forward(
        prefix,
        torch.arange(sh.prefix),
        tr.SegmentAttention([tr.Segment(0, 0, sh.prefix, 0)]),
        torch.tensor([0]),
    )
    for layer in range(m.num_layers):
        m.k[layer][1:] = m.k[layer][0]
        m.v[layer][1:] = m.v[layer][0]
    res: dict[str, Any] = {"path": f"torch eager {dtype}", "start": load_info()}
    spos = torch.arange(sh.prefix, sh.prefix + sh.suffix)

    def one_at_a_time() -> None:
        for s in range(sh.rows):
            m.forward(
                sufs[s],
                spos,
                tr.SegmentAttention([tr.Segment(s, sh.prefix, sh.suffix, 0)]),
                torch.tensor([sh.suffix - 1]),
            )

    res["suffix_prefill_8_one_at_a_time"] = timed(one_at_a_time, max(2, repeats // 3))
    flat, pos = torch.cat(sufs), spos.repeat(sh.rows)
    segs = [tr.Segment(s, sh.prefix, sh.suffix, s * sh.suffix) for s in range(sh.rows)]
    last = torch.tensor([s.t0 + s.n - 1 for s in segs])
    variants = {
        "segments": tr.SegmentAttention(segs),
        "block_diagonal": tr.BlockDiagonalAttention(segs, m.group, m.dtype),
        "cascade": tr.CascadeAttention(segs, 0, sh.prefix),
    }
    for name, att in variants.items():
        res[f"suffix_prefill_8_batched_{name}"] = timed(
            lambda att=att: m.forward(flat, pos, att, last), max(2, repeats // 3)
        )
    ctx = sh.prefix + sh.suffix
    for b in sh.batches:
        dsegs = [tr.Segment(s, ctx, 1, s) for s in range(b)]
        ids, dpos, rows = torch.full((b,), 100), torch.full((b,), ctx), torch.arange(b)
        for name, att in {
            "dense": tr.DenseDecodeAttention(dsegs, m.dtype),
            "cascade": tr.BatchedCascadeDecode(dsegs, 0, sh.prefix, m.dtype),
        }.items():
            res[f"decode_b{b}_{name}"] = timed(
                lambda att=att, ids=ids, dpos=dpos, rows=rows: m.forward(ids, dpos, att, rows), repeats
            )
    cold = torch.randint(10, hi, (sh.cold,), generator=g)
    catt = tr.SegmentAttention([tr.Segment(0, 0, sh.cold, 0)])
    cpos, clast = torch.arange(sh.cold), torch.tensor([sh.cold - 1])
    res["cold_prefill_2048"] = timed(lambda: m.forward(cold, cpos, catt, clast), max(2, repeats // 4))
    if compile_:
        fwd = torch.compile(m.forward, dynamic=False)
        for b in (1, sh.rows):
            dsegs = [tr.Segment(s, ctx, 1, s) for s in range(b)]
            ids, dpos, rows = torch.full((b,), 100), torch.full((b,), ctx), torch.arange(b)
            for name, att in {
                "dense": tr.DenseDecodeAttention(dsegs, m.dtype),
                "cascade": tr.BatchedCascadeDecode(dsegs, 0, sh.prefix, m.dtype),
            }.items():
                t = time.perf_counter()
                fwd(ids, dpos, att, rows)
                compile_s = time.perf_counter() - t
                r = timed(lambda att=att, ids=ids, dpos=dpos, rows=rows: fwd(ids, dpos, att, rows), repeats)
                res[f"compiled_decode_b{b}_{name}"] = {**r, "compile_s": round(compile_s, 1)}
        att = variants["cascade"]
        t = time.perf_counter()
        fwd(flat, pos, att, last)
        compile_s = time.perf_counter() - t
        r = timed(lambda: fwd(flat, pos, att, last), max(2, repeats // 3))
        res["compiled_suffix_prefill_8_batched_cascade"] = {**r, "compile_s": round(compile_s, 1)}
    res["end"] = load_info()
    return res


def study_gemm(repeats: int, sh: Shapes = FULL, bf16: bool = True) -> dict[str, Any]:
    """GFLOP/s of one linear layer's product (800 tokens x 768 -> 2304, the batched suffixes' QKV) per library
    (oneDNN bf16 with `bf16`: it needs AVX-512 or AVX-NE-CONVERT)."""
    import torch
    import torch.nn.functional as F

    n, k, o = sh.gemm
    res: dict[str, Any] = {"path": f"linear layer {n}x{k}x{o}", "start": load_info()}
    flops = 2 * n * k * o
    w, x = torch.randn(o, k), torch.randn(n, k)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    products: dict[str, Callable[[], object]] = {
        "torch F.linear fp32 (MKL sgemm)": lambda: F.linear(x, w),
        "oneDNN fp32 (packed weight)": lambda: torch.ops.mkldnn._linear_pointwise(
            x, packed, None, "none", [], ""
        ),
    }
    if bf16:
        wb, xb = w.bfloat16(), x.bfloat16()
        packed_b = torch.ops.mkldnn._reorder_linear_weight(wb, None)
        products["oneDNN bf16 (packed weight)"] = lambda: torch.ops.mkldnn._linear_pointwise(
            xb, packed_b, None, "none", [], ""
        )
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, fn in products.items():
            r = timed(fn, repeats * 3)
            res[f"{name}, {threads} thread(s)"] = {**r, "gflops": round(flops / r["ms"] / 1e6, 1)}
    res["end"] = load_info()
    return res


def study_hf(model_dir: Path, dtype: str, repeats: int, sh: Shapes = FULL) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dt, attn_implementation="sdpa").eval()
    hi = min(MAX_ID, model.config.vocab_size)
    ids = torch.randint(10, hi, (1, sh.cold), generator=torch.Generator().manual_seed(0))
    res: dict[str, Any] = {"path": f"transformers eager {dtype} (SDPA)", "start": load_info()}
    with torch.inference_mode():
        res["cold_prefill_2048"] = timed(lambda: model(ids, logits_to_keep=1), max(2, repeats // 4))
    res["end"] = load_info()
    return res


# ---------------------------------------------------------------------------------------------- quality
class TorchScorer:
    """A Scorer (llmkiln.calibration.candidates) over TorchLlama: one forward for all logits, greedy by decode."""

    def __init__(self, model_dir: Path, dtype: str) -> None:
        from transformers import AutoTokenizer

        from experiments import torch_runner as tr

        self.tr = tr
        self.kind, self.path = f"torch-{dtype}", Path(model_dir)
        self.model = tr.TorchLlama(model_dir, dtype, num_slots=1, max_len=512)
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def logits(self, ids: list[int]) -> np.ndarray:
        import torch

        n = len(ids)
        att = self.tr.SegmentAttention([self.tr.Segment(0, 0, n, 0)])
        return self.model.forward(torch.tensor(ids), torch.arange(n), att, torch.arange(n)).numpy()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        import torch

        tr, m = self.tr, self.model
        L = len(ids)
        row = m.forward(
            torch.tensor(ids),
            torch.arange(L),
            tr.SegmentAttention([tr.Segment(0, 0, L, 0)]),
            torch.tensor([L - 1]),
        )
        out: list[int] = []
        for _ in range(n):
            tok = int(row[0].argmax())
            out.append(tok)
            row = m.forward(
                torch.tensor([tok]),
                torch.tensor([L]),
                tr.SegmentAttention([tr.Segment(0, L, 1, 0)]),
                torch.tensor([0]),
            )
            L += 1
        return out


def quality(
    stories: Path,
    int8_stories: Path | None,
    ov_logits: Path | None,
    ov_paged_logits: Path | None = None,
    sh: Shapes = FULL,
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
) -> dict[str, Any]:
    from llmkiln.calibration.candidates import HfScorer, OnnxScorer, Scorer
    from llmkiln.calibration.datasets import load_jsonl, resolve_dataset
    from llmkiln.calibration.quality_diff import quality_diff, token_kl

    records = load_jsonl(resolve_dataset("calibration/stories-eval.jsonl"))
    ref = HfScorer(stories)
    out: dict[str, Any] = {}
    cands: dict[str, Scorer] = {f"torch {dt}": TorchScorer(stories, dt) for dt in dtypes}
    if int8_stories is not None:
        cands["ort int8 accuracy_level 4"] = OnnxScorer(int8_stories)
    for name, cand in cands.items():
        r = quality_diff(
            cand,
            ref,
            records,
            dataset="calibration/stories-eval.jsonl",
            max_seq_len=sh.quality_len,
            continuation_tokens=sh.continuation,
            samples=sh.samples,
        )
        s = r.summary
        out[name] = {
            k: s[k]
            for k in (
                "mean_kl",
                "max_kl",
                "top1_agreement",
                "ppl_delta_pct",
                "greedy_exact_match",
                "mean_first_divergence",
            )
            if k in s
        }
    for label, path in (("openvino", ov_logits), ("openvino paged", ov_paged_logits)):
        if path is None or not path.is_file():
            continue
        data = np.load(path)
        acc: dict[str, dict[str, list[float]]] = {}
        for key in sorted({k.rsplit("/", 1)[0] for k in data.files if k.endswith("/ids")}):
            rl = ref.logits(data[f"{key}/ids"].tolist())
            for prec in ("f32", "bf16"):
                if f"{key}/{prec}" in data.files:
                    cl = data[f"{key}/{prec}"]
                    d = acc.setdefault(f"{label} {prec}", {"kl": [], "top1": []})
                    d["kl"].append(float(token_kl(rl, cl).mean()))
                    d["top1"].append(float((rl.argmax(-1) == cl.argmax(-1)).mean()))
        for name, d in acc.items():
            out[name] = {"mean_kl": float(np.mean(d["kl"])), "top1_agreement": float(np.mean(d["top1"]))}
    return out


def export(src: Path, out: Path, precision: str, accuracy_level: str | None) -> None:
    """The onnxruntime-genai builder's export of `src` (llmkiln's build stage function), tokenizer files beside."""
    import shutil

    from llmkiln.build.onnx_export import export_onnx

    if (out / "model.onnx").is_file():
        return
    extra = {"accuracy_level": accuracy_level} if accuracy_level else {}
    export_onnx(src, out, precision, "cpu", extra, log_path=out.with_suffix(".log"))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"):
        if (src / f).is_file():
            shutil.copy(src / f, out / f)


def eval_ids(stories: Path, out: Path, max_len: int = 256) -> None:
    """Tokenized eval texts for the OpenVINO script (its venv has no tokenizer)."""
    from transformers import AutoTokenizer

    from llmkiln.calibration.datasets import load_jsonl, resolve_dataset

    tok = AutoTokenizer.from_pretrained(str(stories))
    recs = load_jsonl(resolve_dataset("calibration/stories-eval.jsonl"))
    out.write_text(json.dumps({r.id: list(tok(r.text).input_ids)[:max_len] for r in recs}))


def _ms(d: dict[str, Any], key: str) -> str:
    v = d.get(key)
    if not isinstance(v, dict) or v.get("ms") is None:
        return "—"
    return f"{v['ms']:.0f}" if v["ms"] >= 100 else f"{v['ms']:.1f}"


def summarize(folder: Path) -> str:
    """The study's table (markdown) from the JSON files of one run."""

    def load(name: str) -> dict[str, Any]:
        f = folder / f"{name}.json"
        return json.loads(f.read_text()) if f.is_file() else {}

    q = load("quality")
    rows = [
        "| path | precision | decode B=1 | B=4 | B=8 | 8 suffix prefills, one at a time | 8 suffix prefills, batched "
        "| cold 2048 prefill | KL / top-1 vs fp32 (stories260K) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]

    def qcell(name: str) -> str:
        d = q.get(name)
        return "exact (reference)" if d is None else f"{d['mean_kl']:.1e} / {d['top1_agreement']:.3f}"

    for name, label, prec, qname in (
        ("ort-fp32", "onnxruntime 1.32 CPU EP, llmkiln runner (IOBinding)", "fp32", None),
        (
            "ort-int8-acc4",
            "same, MatMulNBits int8, accuracy_level 4",
            "int8 compute",
            "ort int8 accuracy_level 4",
        ),
    ):
        d = load(name)
        if d:
            cells = [_ms(d, f"decode_b{b}") for b in BATCHES]
            rows.append(
                f"| {label} | {prec} | {' | '.join(cells)} | {_ms(d, 'suffix_prefill_8_one_at_a_time')} | "
                f"rejected (GQA: B>1 with a past) | {_ms(d, 'cold_prefill_2048')} | {qcell(qname) if qname else '—'} |"
            )
    for dt in ("fp32", "bf16"):
        d = load(f"torch-{dt}")
        if d:
            cells = [
                f"{_ms(d, f'decode_b{b}_dense')} / **{_ms(d, f'decode_b{b}_cascade')}**" for b in BATCHES
            ]
            batched = " / ".join(
                _ms(d, f"suffix_prefill_8_batched_{v}") for v in ("segments", "block_diagonal", "cascade")
            )
            rows.append(
                f"| torch 2.13 eager, llmkiln TorchLlama (oneDNN linear); decode dense / **cascade**; batched: "
                f"varlen segments / block-diagonal mask / cascade | {dt} | {' | '.join(cells)} | "
                f"{_ms(d, 'suffix_prefill_8_one_at_a_time')} | {batched} | {_ms(d, 'cold_prefill_2048')} | "
                f"{qcell('torch ' + dt)} |"
            )
    for dt in ("fp32", "bf16"):
        d = load(f"hf-{dt}")
        if d:
            rows.append(
                f"| transformers 5.14 eager (SDPA) | {dt} | — | — | — | — | — | {_ms(d, 'cold_prefill_2048')} | — |"
            )
    ov = load("openvino")
    for prec, qname in (("f32", "openvino f32"), ("bf16", "openvino bf16")):
        d = ov.get(prec)
        if d:
            rows.append(
                f"| OpenVINO {ov.get('openvino', '')[:8]} on the builder's ONNX (plain infer requests) | {prec} | "
                f"{_ms(d, 'decode_b1')} | {_ms(d, 'decode_b4') if _ms(d, 'decode_b4') != '—' else 'exception'} | "
                f"{_ms(d, 'decode_b8') if _ms(d, 'decode_b8') != '—' else 'exception'} | "
                f"{_ms(d, 'suffix_prefill_8_one_at_a_time')} | exception | {_ms(d, 'cold_prefill_2048')} | "
                f"{qcell(qname)} |"
            )
    pa = load("openvino-paged")
    for prec in ("f32", "bf16"):
        d = pa.get(prec)
        if d:
            cells = [_ms(d, f"decode_b{b}") for b in BATCHES]
            rows.append(
                f"| **OpenVINO PagedAttention model driven with llmkiln-style block tables** (shared prefix blocks) | "
                f"{prec} | {' | '.join(cells)} | {_ms(d, 'suffix_prefill_8_one_at_a_time')} | "
                f"{_ms(d, 'suffix_prefill_8_batched')} | {_ms(d, 'cold_prefill_2048')} | {qcell('openvino paged ' + prec)} |"
            )
    og = load("openvino-genai")
    for prec in ("f32", "bf16"):
        d = og.get(prec)
        if d:
            dec = [f"{d[f'b{b}']['decode_step_ms']:.1f}" for b in BATCHES]
            pre8 = sum(d["b8"]["prefill_steps_ms"])
            rows.append(
                f"| openvino-genai ContinuousBatchingPipeline (PagedAttention, prefix cache) | {prec} | "
                f"{' | '.join(dec)} | {8 * sum(d['b1']['prefill_steps_ms']):.0f} (8 x one) | {pre8:.0f} | "
                f"{d['cold_prefill_2048_ms']:.0f} | — |"
            )
    order = ["ort", "torch-fp32", "torch-bf16", "ov-fp32", "ov-bf16"]
    extra = sorted(f.stem[5:] for f in folder.glob("loop-*.json") if f.stem[5:] not in order)
    loops = [load(f"loop-{r}") for r in order + extra]
    if any(loops):
        rows += [
            "",
            "| runner (in-process) | concurrency | TTFT p50 | TTFT p95 | output tok/s | mean decode step "
            "| mean prefill step | prefix hit rate | load (1 min) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for d in loops:
            if d:
                rows.append(
                    f"| {d['runner']} | {d['concurrency']} | {d['ttft_p50_ms']:.0f} ms | {d['ttft_p95_ms']:.0f} ms | {d['output_tok_s']:.1f} | "
                    f"{d['mean_decode_step_ms']:.1f} ms | {d['mean_prefill_step_ms']:.0f} ms | "
                    f"{d['prefix_cache_hit_rate']:.2f} | {d['loadavg_1m'][0]}–{d['loadavg_1m'][1]} ({d['utc']}) |"
                )
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--paths",
        default="ort,torch,hf",
        help="comma-separated: gemm, ort, ort-int8, torch, hf, quality; exports (the int8 graphs), ov-inputs "
        "(stories260K's fp32 graph and tokenized eval texts, for the OpenVINO venv's scripts)",
    )
    ap.add_argument("--model", type=Path, default=Path("/tmp/wt20/bench-llama-125m"))
    ap.add_argument("--engine", type=Path, default=Path("/tmp/wt20/engines/bench-optimized"))
    ap.add_argument("--int8-engine", type=Path, default=Path("/tmp/wt20/exports/bench-int8-acc4"))
    ap.add_argument("--stories", type=Path, default=Path("../shared/models/stories260K"))
    ap.add_argument("--stories-int8", type=Path, default=Path("/tmp/wt20/exports/stories-int8-acc4"))
    ap.add_argument("--ov-logits", type=Path, default=None)
    ap.add_argument("--ov-paged-logits", type=Path, default=None)
    ap.add_argument(
        "--dtypes",
        default="fp32,bf16",
        help="the torch, transformers and quality paths' precisions (and oneDNN bf16 in gemm)",
    )
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--quick", action="store_true", help="tiny shapes, one timed call, every path in this process"
    )
    ap.add_argument("--out", type=Path, required=True, help="a folder; one JSON file per path")
    ap.add_argument(
        "--summarize", action="store_true", help="only write OUT/SUMMARY.md from OUT's JSON files"
    )
    args = ap.parse_args()
    sh = QUICK if args.quick else FULL
    if args.quick:
        args.repeats = 1
    if args.summarize:
        (args.out / "SUMMARY.md").write_text(summarize(args.out))
        print((args.out / "SUMMARY.md").read_text())
        return
    args.out.mkdir(parents=True, exist_ok=True)
    paths = args.paths.split(",")
    dtypes = args.dtypes.split(",")
    jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if "ort" in paths:
        jobs.append(("ort-fp32", lambda: study_ort(args.engine, args.repeats, "onnxruntime runner fp32", sh)))
    if "ort-int8" in paths:
        jobs.append(
            (
                "ort-int8-acc4",
                lambda: study_ort(
                    args.int8_engine,
                    args.repeats,
                    "onnxruntime runner int8 (MatMulNBits accuracy_level 4)",
                    sh,
                ),
            )
        )
    if "gemm" in paths:
        jobs.append(("gemm", lambda: study_gemm(args.repeats, sh, "bf16" in dtypes)))
    for dt in dtypes:
        if "torch" in paths:
            jobs.append(
                (f"torch-{dt}", lambda dt=dt: study_torch(args.model, dt, args.repeats, args.compile, sh))
            )
        if "hf" in paths:
            jobs.append((f"hf-{dt}", lambda dt=dt: study_hf(args.model, dt, args.repeats, sh)))
    if "exports" in paths:  # the int8 (accuracy_level 4) graphs
        export(args.model, args.int8_engine, "int8", "4")
        export(args.stories, args.stories_int8, "int8", "4")
    if "ov-inputs" in paths:  # what the OpenVINO venv's scripts read: the stories fp32 graph, tokenized texts
        export(args.stories, args.stories_int8.parent / "stories-fp32", "fp32", None)
        eval_ids(args.stories, args.out / "stories-eval-ids.json")
    if "quality" in paths:
        jobs.append(
            (
                "quality",
                lambda: quality(
                    args.stories, args.stories_int8, args.ov_logits, args.ov_paged_logits, sh, tuple(dtypes)
                ),
            )
        )
    if args.quick:  # nothing is measured: no process per path
        for name, job in jobs:
            print(f"== {name} (quick)", flush=True)
            (args.out / f"{name}.json").write_text(json.dumps(job(), indent=1) + "\n")
        return
    for name, job in jobs:
        # each path in its own process: one path's allocations and thread pools do not disturb the next
        if os.environ.get("KILN_STUDY_CHILD") == name:
            (args.out / f"{name}.json").write_text(json.dumps(job(), indent=1) + "\n")
            return
    if os.environ.get("KILN_STUDY_CHILD"):
        return
    for name, _ in jobs:
        print(f"== {name} ({load_info()})", flush=True)
        env = {**os.environ, "KILN_STUDY_CHILD": name, "OMP_NUM_THREADS": "2"}
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see docs/cpu-engine.md, thread contention
        subprocess.run(
            [sys.executable, "-m", "experiments.cpu_kernel_study", *sys.argv[1:]], env=env, check=True
        )
        print((args.out / f"{name}.json").read_text(), flush=True)


if __name__ == "__main__":
    main()
