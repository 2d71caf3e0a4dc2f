"""Hand-made runs of one sequence on a short past, for one-run-at-a-time probes of the OpenVINO runner
(bench/results/spec-decode-xeon/c1-profile: what a lone speculating sequence's step costs): its token alone, with
8 drafts (one sequence of 9 tokens), with 8 tokens of run padding (runtime.run_padding: a second sequence in the
padding block); `steady` times one of them repeated. The shared-prefix twin: experiments.shared_prefix_runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from experiments.shared_prefix_runs import Run
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

TABLE = tuple(range(60))  # the sequence's blocks
REPS = 24  # runs a median is taken over (after 2 not counted)


def lone_runner(
    folder: EngineDir,
    past: int,
    wrap: Callable[[Any], Any] | None = None,
    compile_extra: Mapping[str, object] | None = None,
) -> OpenVinoPagedRunner:
    """A runner without the cascade graph, padding off, a `past`-token sequence written; `wrap`: what to put in
    place of its infer request first (a probe's stand-in that adds or changes inputs); `compile_extra`: compile
    properties over the runner's (e.g. PERF_COUNT)."""
    xml = folder.openvino_model()
    assert xml is not None, f"{folder.path}: not an openvino-cpu engine"
    r = OpenVinoPagedRunner(
        xml, 8, 4096, None, 0, folder.recipe().precision, cascade=False, compile_extra=compile_extra
    )
    if wrap is not None:
        r.req = wrap(r.req)
    r.padding.limit = 0
    r._run([("s0", tuple(range(3, 3 + past)), 0, TABLE)], [1])
    return r


def alone(past: int) -> Run:
    """The sequence's next token, one logits row."""
    return [("s0", (5,), past, TABLE)], [1]


def drafted(past: int, rows: int = 9) -> Run:
    """Its token and 8 drafts; `rows` logits rows (9: a verification)."""
    return [("s0", tuple(range(5, 14)), past, TABLE)], [rows]


def padded(r: OpenVinoPagedRunner, past: int) -> Run:
    """Its token and 8 tokens of run padding in the runner's padding block."""
    return [("s0", (5,), past, TABLE), ("", (0,) * 8, 0, (r._pad_block,))], [1, 0]


def median_ms(fn: Callable[[], object], reps: int = REPS) -> float:
    """The median ms of `reps` calls of fn in a row (after 2 not counted)."""
    ts = []
    for _ in range(reps + 2):
        a = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - a) * 1000)
    return statistics.median(ts[2:])


def steady(r: OpenVinoPagedRunner, run: Run, reps: int = REPS) -> float:
    """The median ms of `reps` runs of `run` in a row (after 2 not counted)."""
    return median_ms(lambda: r._run(*run), reps)
