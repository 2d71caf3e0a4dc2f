"""The runner's _run taken apart (a copy of its body): building the feeds, binding them, infer, the logits copy;
a lone sequence on a 300-token past, the token alone and with 8 drafts (9 rows), medians of 24, three rounds.

    PYTHONPATH=. python bench/results/spec-decode-xeon/c1-profile/run_split_probe.py engines/smollm2-ov-bf16
"""

import pathlib
import statistics
import sys
import time

import numpy as np
import openvino as ov

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import openvino_runner

folder = EngineDir(pathlib.Path(sys.argv[1]))
PAST = 300
r = openvino_runner.OpenVinoPagedRunner(
    folder.openvino_model(), 8, 4096, None, 0, folder.recipe().precision, cascade=False
)
r.padding.limit = 0
table = tuple(range(0, 60))
r._run([("s0", tuple(range(3, 3 + PAST)), 0, table)], [1])
bs = r.block_size


def split(seqs, rows):
    t0 = time.perf_counter()
    ids = np.concatenate([np.asarray(toks, np.int64) for _, toks, _, _ in seqs])
    pos = np.concatenate([np.arange(p, p + len(toks), dtype=np.int64) for _, toks, p, _ in seqs])
    begins = np.cumsum([0] + [len(toks) for _, toks, _, _ in seqs]).astype(np.int32)
    used = [table[: -(-(p + len(toks)) // bs)] for _, toks, p, table in seqs]
    feeds = {
        "input_ids": ids,
        "position_ids": pos,
        "past_lens": np.asarray([p for _, _, p, _ in seqs], np.int32),
        "subsequence_begins": begins,
        "block_indices": np.concatenate([np.asarray(tb, np.int32) for tb in used]),
        "block_indices_begins": np.cumsum([0] + [len(tb) for tb in used]).astype(np.int32),
        "max_context_len": np.asarray(max(p + len(toks) for _, toks, p, _ in seqs), np.int32),
        "logits_indices": np.concatenate(
            [np.arange(end - n, end, dtype=np.int64) for end, n in zip(begins[1:], rows, strict=True)]
        ),
    }
    t1 = time.perf_counter()
    req = r.req
    for name, value in feeds.items():
        req.set_tensor(name, ov.Tensor(value))
    t2 = time.perf_counter()
    req.infer()
    t3 = time.perf_counter()
    np.array(req.get_tensor("logits").data[: sum(rows), 0], dtype=np.float32)
    t4 = time.perf_counter()
    return [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3]


SH = {
    "alone": ([("s0", (5,), PAST, table)], [1]),
    "9 rows9": ([("s0", tuple(range(5, 14)), PAST, table)], [9]),
}
for _ in range(3):
    cells = []
    for k, v in SH.items():
        xs = [split(*v) for _ in range(26)][2:]
        med = [statistics.median(x[i] for x in xs) for i in range(4)]
        cells.append(f"{k}: feeds {med[0]:.3f} set {med[1]:.3f} infer {med[2]:.2f} logits {med[3]:.3f}")
    print(" | ".join(cells), flush=True)
