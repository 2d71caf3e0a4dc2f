"""What a change of a run's token count costs the OpenVINO runner, and what padding (runtime/run_padding.py) buys.

    python -m experiments.openvino_run_shapes --engine engines/smollm2-ov-bf16 [--rounds 3]

One sequence on a 143-token past, decode runs of k tokens (k = 1 + speculative drafts), timed as a loop over
`OpenVinoPagedRunner._run`; the mean ms per run for token counts that stay constant and that wander (1..5 as
drafts come and go, 1 and 5 alternating), with the runner's padding off and on; then constant counts 1..24 (where
extra tokens start to cost). Rounds alternate the order. Prints one JSON line per round.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import click


def _runner(engine: Path, precision: str) -> Any:
    from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

    return OpenVinoPagedRunner(engine / "openvino_model.xml", 8, 1024, None, 0, precision)


def measure(engine: Path, precision: str, rounds: int, past: int = 143) -> list[dict[str, Any]]:
    from llmkiln.runtime.run_padding import RunPadding

    r = _runner(engine, precision)
    table = tuple(range(r.blocks_per_slot))
    r._run([("f", tuple(range(1, past + 58)), 0, table)], [1])
    rng = random.Random(1)
    wander = [rng.choice([1, 1, 1, 1, 1, 2, 3, 4, 5, 5]) for _ in range(60)]
    patterns = {
        "constant 1": [1] * 60,
        "constant 5": [5] * 60,
        "wandering 1..5": wander,
        "1 and 5": [1, 5] * 30,
    }

    def mean_ms(ks: list[int], limit: int) -> float:
        r.padding = RunPadding(limit=limit)
        ts = []
        for k in ks:
            t = time.perf_counter()
            r._run([("d", tuple(range(5, 5 + k)), past, table)], [k])
            ts.append((time.perf_counter() - t) * 1e3)
        return round(statistics.mean(ts), 2)

    out = []
    for i in range(rounds):
        names = list(patterns) if i % 2 == 0 else list(patterns)[::-1]
        row: dict[str, Any] = {"round": i + 1}
        for limit in (0, 4) if i % 2 == 0 else (4, 0):
            row[f"padding {limit}"] = {n: mean_ms(patterns[n], limit) for n in names}
        row["constant k (padding off)"] = {k: mean_ms([k] * 30, 0) for k in (1, 2, 4, 8, 12, 16, 24)}
        out.append(row)
    r.close()
    return out


@click.command()
@click.option("--engine", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--precision", default="bf16", show_default=True)
@click.option("--rounds", default=3, show_default=True)
def main(engine: Path, precision: str, rounds: int) -> None:
    for row in measure(engine, precision, rounds):
        click.echo(json.dumps(row))


if __name__ == "__main__":
    main()
