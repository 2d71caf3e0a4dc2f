"""Hand-made runs on a shared 1504-token past for one-run-at-a-time probes of the OpenVINO runner
(bench/results/prompt-graph/graph_probe.py, bench/results/openvino-int8-weights/xeon_step_probe.py): 8 decoding
sequences whose block tables start with the same 47 blocks (the cascade graph's case), and a prompt beside them."""

from __future__ import annotations

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

PAST = 1504
SHARED = tuple(range(47))  # the past's blocks, in every table
TABLES = [SHARED + tuple(range(100 + i * 20, 120 + i * 20)) for i in range(9)]  # 8 decoders, then the prompt
Run = tuple[list[tuple[str, tuple[int, ...], int, tuple[int, ...]]], list[int]]


def cascade_runner(folder: EngineDir) -> OpenVinoPagedRunner:
    """A runner with the cascade graph, padding off, the shared past written once."""
    xml = folder.openvino_model()
    assert xml is not None, f"{folder.path}: not an openvino-cpu engine"
    r = OpenVinoPagedRunner(xml, 9, 2048, None, 0, folder.recipe().precision, cascade=True)
    r.padding.limit = 0
    r._run([("s0", tuple(range(3, 3 + PAST)), 0, TABLES[0])], [1])
    return r


def decodes() -> Run:
    """8 decodes on the shared past, one logits row each."""
    return [(f"s{i}", (7,), PAST, TABLES[i]) for i in range(8)], [1] * 8


def mixed(n: int) -> Run:
    """The 8 decodes and an n-token prompt on the shared past (a mixed step)."""
    seqs, rows = decodes()
    return [("p", tuple(range(5, 5 + n)), PAST, TABLES[8]), *seqs], [1, *rows]
