"""CPU kernel study: OpenVINO's PagedAttention model driven directly, the way an llmkiln runner would drive it
(its own scheduler and block tables; no openvino-genai pipeline).

    /tmp/wt20/venv-ov/bin/python experiments/cpu_study_openvino_paged.py /tmp/wt20/ov-bench-fp32 --out X.json

The optimum-intel IR (stateful, SDPA) is turned into the PagedAttention graph by OpenVINO's own
`paged_attention_transformation` (what openvino-genai applies on load): inputs are the step's tokens of all
sequences concatenated, `past_lens`, `subsequence_begins`, block tables (`block_indices`, `block_indices_begins`)
and per-layer block pools `key_cache.N` / `value_cache.N` [blocks, kv_heads, block_size, head_dim]; one row of
logits per sequence. The shared prefix is held ONCE: every row's block table starts with the same 46 blocks
(1472 tokens, block size 32), so a prefix hit costs no copy. Shapes as in cpu_kernel_study.py: each row holds 1600
tokens (its own 128 after the 1472 shared, prefilled one at a time or all 8 in one call), decode at batch 1/4/8,
and a 2048-token cold prefill.
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
from openvino._offline_transformations import paged_attention_transformation

BS, SHARED_BLOCKS, CTX, ROWS = 32, 46, 1600, 8


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


def _last_rows_only(model) -> None:
    """LM head only on the rows to sample (new input `logits_indices`), as openvino-genai's slice-before-matmul
    and llmkiln's last_logits rewrite do: otherwise every prompt token pays the 32000-wide product."""
    import openvino.opset13 as ops

    node = model.output("logits").get_node()
    while node.get_type_name() != "MatMul":
        node = node.input_value(0).get_node()
    idx = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    idx.output(0).get_tensor().set_names({"logits_indices"})
    node.input(0).replace_source_output(ops.gather(node.input_value(0), idx, 0).output(0))
    model.add_parameters([idx])
    model.validate_nodes_and_infer_types()


class Paged:
    def __init__(self, xml: Path, prec: str, num_blocks: int) -> None:
        core = ov.Core()
        model = core.read_model(str(xml))
        paged_attention_transformation(model, False, False, False, False, False, False)
        _last_rows_only(model)
        cfg = {"INFERENCE_PRECISION_HINT": prec, "KV_CACHE_PRECISION": prec, "INFERENCE_NUM_THREADS": 2}
        self.compiled = core.compile_model(model, "CPU", cfg)
        self.req = self.compiled.create_infer_request()
        self.caches = []
        for inp in self.compiled.inputs:
            name = inp.get_any_name()
            if "_cache." in name:
                shape = [num_blocks] + [d.get_length() for d in list(inp.get_partial_shape())[1:]]
                t = ov.Tensor(inp.get_element_type(), shape)
                self.req.set_tensor(name, t)
                self.caches.append(t)

    def run(self, seqs: list[tuple[list[int], int, list[int]]], all_rows: bool = False) -> np.ndarray:
        """seqs: (new token ids, past length, block table); returns logits [len(seqs), vocab]."""
        ids = np.concatenate([np.asarray(t, np.int64) for t, _, _ in seqs])
        pos = np.concatenate([np.arange(p, p + len(t), dtype=np.int64) for t, p, _ in seqs])
        begins = np.cumsum([0] + [len(t) for t, _, _ in seqs]).astype(np.int32)
        blocks = np.concatenate([np.asarray(b, np.int32) for _, _, b in seqs])
        bbegins = np.cumsum([0] + [len(b) for _, _, b in seqs]).astype(np.int32)
        feeds = {
            "input_ids": ids,
            "position_ids": pos,
            "past_lens": np.asarray([p for _, p, _ in seqs], np.int32),
            "subsequence_begins": begins,
            "block_indices": blocks,
            "block_indices_begins": bbegins,
            "max_context_len": np.asarray(max(p + len(t) for t, p, _ in seqs), np.int32),
            "logits_indices": np.arange(len(ids), dtype=np.int64)
            if all_rows
            else (begins[1:] - 1).astype(np.int64),
        }
        for name, value in feeds.items():
            self.req.set_tensor(name, ov.Tensor(value))
        self.req.infer()
        return np.asarray(self.req.get_tensor("logits").data[:, 0], dtype=np.float32)


def study(xml: Path, prec: str, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    own = CTX // BS + 1 - SHARED_BLOCKS  # own blocks per row: up to token CTX (the decode token included)
    pg = Paged(xml, prec, SHARED_BLOCKS + ROWS * own + 2048 // BS + 1)
    res: dict = {"path": f"openvino PagedAttention model, llmkiln-style block tables, {prec}"}
    shared = list(range(SHARED_BLOCKS))
    P = SHARED_BLOCKS * BS
    prefix = rng.integers(10, 30000, P).tolist()
    pg.run([(prefix, 0, shared)])
    tables = [
        shared + list(range(SHARED_BLOCKS + r * own, SHARED_BLOCKS + (r + 1) * own)) for r in range(ROWS)
    ]
    sufs = [rng.integers(10, 30000, CTX - P).tolist() for _ in range(ROWS)]

    def one_at_a_time() -> None:
        for r in range(ROWS):
            pg.run([(sufs[r], P, tables[r][: CTX // BS])])

    res["suffix_prefill_8_one_at_a_time"] = timed(one_at_a_time, max(2, repeats // 3))
    batch = [(sufs[r], P, tables[r][: CTX // BS]) for r in range(ROWS)]
    res["suffix_prefill_8_batched"] = timed(lambda: pg.run(batch), max(2, repeats // 3))
    res["note"] = f"suffix = the {CTX - P} tokens after the {P} shared (block-aligned) ones"
    for b in (1, 4, 8):
        step = [([100], CTX, tables[r]) for r in range(b)]
        res[f"decode_b{b}"] = timed(lambda step=step: pg.run(step), repeats)
    cold_table = list(range(SHARED_BLOCKS + ROWS * own, SHARED_BLOCKS + ROWS * own + 2048 // BS))
    cold = rng.integers(10, 30000, 2048).tolist()
    res["cold_prefill_2048"] = timed(lambda: pg.run([(cold, 0, cold_table)]), max(2, repeats // 4))
    # correctness of the shared blocks: row 0's last logits from the batched step vs the same 1600 tokens
    # computed from scratch in the cold blocks
    batched = pg.run(batch)[0].copy()
    alone = pg.run([(prefix + sufs[0], 0, cold_table[: CTX // BS])])[0]
    res["check_max_abs_logit_diff_shared_vs_cold"] = float(np.max(np.abs(batched - alone)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="an optimum-intel OpenVINO export folder")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--precisions", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument(
        "--logits", default=None, help="token ids JSON: write each text's logits per precision (npz)"
    )
    args = ap.parse_args()
    if args.logits:
        ids = json.loads(Path(args.logits).read_text())
        arrays = {}
        for prec in args.precisions.split(","):
            pg = Paged(args.model / "openvino_model.xml", prec, 512 // BS + 1)
            for key, toks in ids.items():
                n = len(toks)  # every position's logits: one sequence, all rows sampled
                arrays[f"{key}/{prec}"] = pg.run(
                    [(toks, 0, list(range((n + BS - 1) // BS)))], all_rows=True
                ).copy()
                arrays[f"{key}/ids"] = np.asarray(toks)
        np.savez(args.out, **arrays)
        return
    out: dict = {"openvino": ov.__version__, "loadavg_start": os.getloadavg()[0]}
    for prec in args.precisions.split(","):
        out[prec] = study(args.model / "openvino_model.xml", prec, args.repeats)
        print(prec, json.dumps(out[prec]), flush=True)
    out["loadavg_end"] = os.getloadavg()[0]
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
