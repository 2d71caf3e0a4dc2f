"""Hand-made runs on a shared 1504-token past for one-run-at-a-time probes of the OpenVINO runner
(bench/results/prompt-graph/graph_probe.py, bench/results/openvino-int8-weights/xeon_step_probe.py): 8 decoding
sequences whose block tables start with the same 47 blocks (the cascade graph's case), and a prompt beside them.
`prefix_with_decoders`: the same past with any number of decoders that have tokens of their own written after it;
`median_run_ms`: a plan's step time (bench/results/cpu-speed-zen5/op-balance/step_probe.py,
bench/results/cpu-speed-zen5/ttft/contention/noise_probe.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from pathlib import Path

from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

PAST = 1504
SHARED = tuple(range(47))  # the past's blocks, in every table
TABLES = [SHARED + tuple(range(100 + i * 20, 120 + i * 20)) for i in range(9)]  # 8 decoders, then the prompt
Seq = tuple[str, tuple[int, ...], int, tuple[int, ...]]  # (id, tokens, past, block table)
Run = tuple[list[Seq], list[int]]


def _runner(
    folder: EngineDir,
    slots: int,
    cascade: bool = True,
    precision: str | None = None,
    compile_extra: Mapping[str, object] | None = None,
) -> OpenVinoPagedRunner:
    """A runner of `slots` sequences (with the cascade graph unless `cascade` is False; computing in `precision`,
    default the recipe's; `compile_extra`: compile properties over the runner's), padding off (each run's shape as
    given)."""
    xml = folder.openvino_model()
    assert xml is not None, f"{folder.path}: not an openvino-cpu engine"
    precision = precision or folder.recipe().precision
    r = OpenVinoPagedRunner(
        xml, slots, 2048, None, 0, precision, cascade=cascade, compile_extra=compile_extra
    )
    r.padding.limit = 0
    return r


def cascade_runner(folder: EngineDir) -> OpenVinoPagedRunner:
    """A runner with the cascade graph, padding off, the shared past written once."""
    r = _runner(folder, 9)
    r._run([("s0", tuple(range(3, 3 + PAST)), 0, TABLES[0])], [1])
    return r


def decodes() -> Run:
    """8 decodes on the shared past, one logits row each."""
    return [(f"s{i}", (7,), PAST, TABLES[i]) for i in range(8)], [1] * 8


def mixed(n: int) -> Run:
    """The 8 decodes and an n-token prompt on the shared past (a mixed step)."""
    seqs, rows = decodes()
    return [("p", tuple(range(5, 5 + n)), PAST, TABLES[8]), *seqs], [1, *rows]


def prefix_with_decoders(
    engine: Path,
    decoders: int,
    own_tokens: int,
    cascade: bool = True,
    precision: str | None = None,
    compile_extra: Mapping[str, object] | None = None,
) -> tuple[OpenVinoPagedRunner, list[tuple[int, ...]], tuple[int, ...]]:
    """A runner (48 sequences, padding off; the cascade graph unless `cascade` is False; `precision`: compute and
    KV pools, default the recipe's; `compile_extra`: compile properties over the runner's, e.g. PERF_COUNT) with
    the 1504-token past written and `decoders` sequences of `own_tokens` tokens each on it: (the runner, the
    decoders' block tables, a turn's table after the past)."""
    r = _runner(EngineDir(engine), 48, cascade, precision, compile_extra)
    prefix = tuple(range(PAST // r.block_size))
    own_blocks = -(-own_tokens // r.block_size)
    nxt = len(prefix)
    r._run([("p", token_ids(r, 1, PAST), 0, prefix)], [1], cascade=False)
    tables = []
    for i in range(decoders):
        tables.append(prefix + tuple(range(nxt, nxt + own_blocks + 1)))
        nxt += own_blocks + 1
        r._run([(f"s{i}", token_ids(r, 200 + i, own_tokens), PAST, tables[i])], [1], cascade=False)
    return r, tables, prefix + tuple(range(nxt, nxt + 8))


def token_ids(r: OpenVinoPagedRunner, start: int, n: int) -> tuple[int, ...]:
    """n consecutive token ids from `start`, within the model's vocabulary."""
    return tuple((start + j) % r.vocab_size for j in range(n))


def decodes_on(tables: list[tuple[int, ...]], n: int, own_tokens: int) -> list[Seq]:
    """The first n of prefix_with_decoders' decoders, one token each after their `own_tokens` on the past."""
    return [(f"s{i}", (7,), PAST + own_tokens, tables[i]) for i in range(n)]


def run_ms(r: OpenVinoPagedRunner, plan: list[Seq], cascade: bool = True, prompt: bool = False) -> float:
    """The wall time of one run of `plan` (one logits row each) on the cascade graph, or on PagedAttention's when
    `cascade` is False. `prompt`: the run carries prompt tokens, as the engine marks its prefill runs — only such a
    run goes to the graph's prompt copy where the runner has one (scheduler.prompt_graph)."""
    t = time.perf_counter()
    r._run(plan, [1] * len(plan), cascade=cascade, prompt=prompt)
    return (time.perf_counter() - t) * 1e3


def median_run_ms(
    r: OpenVinoPagedRunner, plan: list[Seq], runs: int = 15, warm: int = 3, cascade: bool = True
) -> float:
    """The median wall time of `runs` runs of `plan` (one logits row each) on the cascade graph, or on
    PagedAttention's when `cascade` is False, after `warm`."""
    for _ in range(warm):
        run_ms(r, plan, cascade)
    return statistics.median(run_ms(r, plan, cascade) for _ in range(runs))
