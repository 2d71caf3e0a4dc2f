"""What a short prompt costs in a decode step, one OpenVINO run at a time (bench/results/served-ttft/README.md,
"Mixed steps"). One 1504-token shared prefix, nine sequences with 40 tokens of their own after it.

    python bench/results/served-ttft/mixed-steps/probe.py sizes ENGINE   # run cost against its token count M
    python bench/results/served-ttft/mixed-steps/probe.py twin ENGINE    # decodes and mixed runs alternating

`sizes` (two rounds, median of 12 runs each): M tokens as one prompt with no past (PagedAttention's graph), as one
prompt on the shared prefix (cascade graph), and as 7 decodes + a prompt of M - 7 tokens on it (cascade graph).
`twin` (8 rounds, orders alternating): 7 decodes alternating with 7 decodes + a 30-40-token prompt, the mixed runs
on the same compiled graph or on a second compilation (scheduler.prompt_graph), unpadded or padded to 48 tokens.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

PREFIX, OWN = 1504, 40
LENS = (30, 38, 33, 40, 35, 31, 37, 34)
Seq = tuple[str, tuple[int, ...], int, tuple[int, ...]]


def main(mode: str, engine: Path) -> None:
    folder = EngineDir(engine)
    r = OpenVinoPagedRunner(
        folder.openvino_model(),
        40,
        2048,
        None,
        0,
        folder.recipe().precision,
        cascade=True,
        prompt_graph=mode == "twin",
    )
    r.padding.limit = 0
    prefix = tuple(range(PREFIX // r.block_size))
    nxt = len(prefix)
    r._run([("p", tuple(range(1, PREFIX + 1)), 0, prefix)], [1])
    shared = []
    for i in range(9):
        shared.append(prefix + tuple(range(nxt, nxt + 8)))
        nxt += 8
        r._run([(f"s{i}", tuple(range(200 + i, 200 + i + OWN)), PREFIX, shared[i])], [1])
    cold = tuple(range(nxt, nxt + 8))

    def dec(n: int = 7) -> list[Seq]:
        return [(f"s{i}", (5 + i,), PREFIX + OWN, shared[i]) for i in range(n)]

    def ms(plan: list[Seq], rows: list[int], cascade: bool | None = None, prompt: bool = False) -> float:
        t = time.perf_counter()
        r._run(plan, rows, cascade=cascade, prompt=prompt)
        return (time.perf_counter() - t) * 1000

    if mode == "sizes":
        sizes = (8, 16, 24, 28, 31, 32, 33, 34, 36, 40, 44, 48, 56, 64, 65, 72, 80, 96)

        def med(plan: list[Seq], cascade: bool) -> float:
            return statistics.median([ms(plan, [1] * len(plan), cascade) for _ in range(15)][3:])

        for _ in range(2):
            print(
                "paged no past    ",
                " ".join(
                    f"{m}:{med([('c', tuple(range(100, 100 + m)), 0, cold)], False):.1f}" for m in sizes
                ),
            )
            print(
                "cascade on past  ",
                " ".join(
                    f"{m}:{med([('m', tuple(range(100, 100 + m)), PREFIX + OWN, shared[8])], True):.1f}"
                    for m in sizes
                ),
            )
            print(
                "cascade 7 dec + (total M)",
                " ".join(
                    f"{m}:{med([*dec(), ('m', tuple(range(100, 100 + m - 7)), PREFIX + OWN, shared[8])], True):.1f}"
                    for m in sizes
                    if m > 8
                ),
                flush=True,
            )
        return

    def mixed(m: int, pad_to: int) -> tuple[list[Seq], list[int]]:
        plan: list[Seq] = [*dec(), ("m", tuple(range(100, 100 + m)), PREFIX + OWN, shared[8])]
        rows = [1] * 8
        if pad_to:
            plan.append(("", (0,) * (pad_to - 7 - m), 0, (r._pad_block,)))
            rows.append(0)
        return plan, rows

    res: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    settings = ((False, 0), (True, 48), (True, 0), (False, 48))
    for rnd in range(8):
        for twin, pad in settings if rnd % 2 == 0 else settings[::-1]:
            d, m = [], []
            for k in range(24):
                d.append(ms(dec(), [1] * 7))
                m.append(ms(*mixed(LENS[k % 8], pad), prompt=twin))
            res.setdefault((twin, pad), []).append((statistics.median(d[4:]), statistics.median(m[4:])))
    for (twin, pad), v in res.items():
        sums = [a + b for a, b in v]
        print(
            f"twin={twin!s:5} pad={pad:2d}  decodes {statistics.median(a for a, _ in v):6.2f}  "
            f"mixed {statistics.median(b for _, b in v):6.2f}  sum {statistics.median(sums):6.2f}  "
            f"per round {' '.join(f'{x:.1f}' for x in sums)}"
        )


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
