"""One OpenVINO run at a time: PagedAttention's graph against the cascade attention graph on the same pools.

    python -m experiments.cascade_steps --engine engines/bench-ov-bf16 [--rounds 5] [--out DIR]

The engine's IR is loaded twice by one OpenVinoPagedRunner (`cascade=True`: both graphs share its KV pools); a
1504-token prefix (47 blocks; `--prefix` sets it) is prefilled once, and B sequences get their own blocks after it
with 40 tokens of their own (eight more with 500, and 1000, of their own: a multi-turn history; `--history` sets
those counts). Then, alternating the two graphs run by run (a slow minute lands on both), the median ms of:
decodes of B = 1, 8, 16, 32 sequences on the shared prefix; the same 8 decodes with distinct prefixes (nothing
shared: what the cascade cannot help); a mixed run (7 decodes + a 35-token prompt on the prefix); a prompt of its
own beside 7 decodes (512 tokens; `--own-prompts` sets the sizes), and with `--turns KxN` K fresh N-token turns
on the prefix beside 8 - K decodes. Per shape: which graph the runner would pick (cascade_attention.Routing for
this CPU) and the greatest logit difference between the two graphs. Writes DIR/cascade-steps.json with --out.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from experiments.cpu_peers import lscpu
from llmkiln.atomic import write_text_atomic
from llmkiln.cli.main import run_command
from llmkiln.engine_dir import EngineDir

PREFIX = 1504
OWN = 40
HISTORY = (500, 1000)  # own tokens of 8 decodes on the shared prefix (cascade_attention.Routing)
OWN_PROMPTS = (512,)  # tokens of a prompt of its own beside 7 decodes (cascade_attention.Routing)
# (k, n): k fresh n-token user turns on the prefix beside 8 - k decodes
TURNS: tuple[tuple[int, int], ...] = ()
Seq = tuple[str, tuple[int, ...], int, tuple[int, ...]]


def measure(
    engine: Path,
    rounds: int,
    runs: int,
    histories: tuple[int, ...] = HISTORY,
    own_prompts: tuple[int, ...] = OWN_PROMPTS,
    turns: tuple[tuple[int, int], ...] = TURNS,
    prefix_len: int = PREFIX,
) -> dict[str, Any]:
    from llmkiln.runtime import cascade_attention
    from llmkiln.runtime.openvino_runner import OpenVinoPagedRunner

    folder = EngineDir(engine)
    recipe = folder.recipe()
    xml = folder.openvino_model()
    if xml is None:
        raise click.BadParameter(f"{engine}: not an openvino-cpu engine")
    slots = 40 + sum(8 * (n + 1) for n in histories) // 2048  # the pools hold every history
    r = OpenVinoPagedRunner(xml, slots, 2048, None, 0, recipe.precision, cascade=True)
    if r.cascade_req is None:
        r.close()
        raise click.ClickException(
            f"cascade attention is off here: {r.runtime_settings['cascade_attention']}"
        )
    r.padding.limit = 0
    bs = r.block_size
    if prefix_len % bs or prefix_len < 2 * bs:
        r.close()
        raise click.BadParameter(
            f"--prefix {prefix_len}: a multiple of the engine's {bs}-token blocks, two or more"
        )

    def ids(start: int, n: int) -> tuple[int, ...]:
        """n token ids from `start`, within the model's vocabulary."""
        return tuple((start + j) % r.vocab_size for j in range(n))

    prefix = tuple(range(prefix_len // bs))
    nxt = len(prefix)

    def run(graph: str, plan: list[Seq]) -> tuple[np.ndarray, float]:
        t = time.perf_counter()
        out = r._run(plan, [1] * len(plan), cascade=graph == "cascade")
        return out, (time.perf_counter() - t) * 1000

    run("paged", [("p", ids(1, prefix_len), 0, prefix)])
    shared, distinct = [], []
    for i in range(33):
        own = tuple(range(nxt, nxt + 3))
        nxt += 3
        shared.append(prefix + own)
        run("paged", [(f"s{i}", ids(200 + i, OWN), prefix_len, shared[i])])
    for i in range(8):
        table = tuple(range(nxt, nxt + -(-(prefix_len + OWN) // bs)))
        nxt += len(table)
        distinct.append(table)
        run("paged", [(f"d{i}", ids(3, prefix_len + OWN), 0, table)])
    history: dict[int, list[tuple[int, ...]]] = {}  # on the shared prefix, each with a history of its own
    for own_len in histories:
        history[own_len] = []
        for i in range(8):
            n = -(-(own_len + 1) // bs)
            table = prefix + tuple(range(nxt, nxt + n))
            nxt += n
            history[own_len].append(table)
            run("paged", [(f"h{own_len}-{i}", ids(7, own_len), prefix_len, table)])
    cold = tuple(range(nxt, nxt + 20 + max(own_prompts) // bs))
    nxt += len(cold)
    turn_tables = []  # a fresh turn right after the prefix (past = prefix_len, its own blocks after it)
    turn_blocks = -(-max((n for _, n in turns), default=0) // bs)
    for _ in range(max((k for k, _ in turns), default=0)):
        turn_tables.append(prefix + tuple(range(nxt, nxt + turn_blocks)))
        nxt += turn_blocks
    assert nxt <= r.num_blocks

    def decodes(n: int, tables: list[tuple[int, ...]], own: int = OWN) -> list[Seq]:
        return [(f"s{i}", (5 + i,), prefix_len + own, tables[i]) for i in range(n)]

    shapes: dict[str, Callable[[], list[Seq]]] = {
        "1 decode, shared prefix": lambda: decodes(1, shared),
        "8 decodes, shared prefix": lambda: decodes(8, shared),
        "16 decodes, shared prefix": lambda: decodes(16, shared),
        "32 decodes, shared prefix": lambda: decodes(32, shared),
        "8 decodes, distinct prefixes": lambda: decodes(8, distinct),
        **{
            f"8 decodes, shared prefix + {n} own tokens each": (lambda n=n: decodes(8, history[n], n))
            for n in histories
        },
        "7 decodes + a 35-token prompt": lambda: [
            *decodes(7, shared),
            ("m", ids(100, 35), prefix_len + OWN, shared[32]),
        ],
        **{
            f"7 decodes + a {n}-token prompt of its own": (
                lambda n=n: [*decodes(7, shared), ("c", ids(300, n), 0, cold)]
            )
            for n in own_prompts
        },
        **{
            f"{8 - k} decodes + {k} x {n}-token turns on the prefix": (
                lambda k=k, n=n: [
                    *decodes(8 - k, shared),
                    *((f"t{i}", ids(400 + i, n), prefix_len, turn_tables[i]) for i in range(k)),
                ]
            )
            for k, n in turns
        },
    }
    out: dict[str, Any] = {}
    for name, plan in shapes.items():
        a, _ = run("paged", plan())
        b, _ = run("cascade", plan())
        times: dict[str, list[float]] = {"paged": [], "cascade": []}
        for k in range(rounds):
            for graph in ("paged", "cascade") if k % 2 == 0 else ("cascade", "paged"):
                times[graph].append(statistics.median(run(graph, plan())[1] for _ in range(runs)))
        out[name] = {
            "routed": "cascade" if cascade_attention.worth_it(plan(), bs, r.cascade_routing) else "paged",
            "paged_ms": statistics.median(times["paged"]),
            "cascade_ms": statistics.median(times["cascade"]),
            "rounds": times,
            "max_logit_difference": float(np.abs(a - b).max()),
            "logit_scale": float(np.abs(a).max()),
        }
        row = out[name]
        click.echo(
            f"{name:44s} paged {row['paged_ms']:6.2f} ms  cascade {row['cascade_ms']:6.2f} ms  "
            f"x{row['cascade_ms'] / row['paged_ms']:.2f}  routed {row['routed']:7s}  "
            f"max |dlogit| {row['max_logit_difference']:.3g}",
            err=True,
        )
    r.close()
    return {
        "engine": str(engine),
        "precision": recipe.precision,
        "prefix": prefix_len,
        "machine": lscpu(),
        "shapes": out,
    }


@click.command("cascade-steps", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--rounds", type=int, default=5, show_default=True, help="Alternations of the two graphs.")
@click.option("--runs", type=int, default=15, show_default=True, help="Runs per graph and round (median).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option(
    "--history",
    default=",".join(map(str, HISTORY)),
    show_default=True,
    help="Own tokens of the 8 decodes of the history shapes, comma-separated.",
)
@click.option(
    "--own-prompts",
    default=",".join(map(str, OWN_PROMPTS)),
    show_default=True,
    help="Tokens of the prompt of its own beside 7 decodes, comma-separated.",
)
@click.option(
    "--prefix",
    "prefix_len",
    type=int,
    default=PREFIX,
    show_default=True,
    help="Tokens of the shared prefix (a multiple of the engine's block).",
)
@click.option(
    "--turns",
    default="",
    help="KxN,...: K fresh N-token user turns on the prefix beside 8 - K decodes (e.g. 1x120,2x120).",
)
def cli(
    engine: Path,
    rounds: int,
    runs: int,
    out_dir: Path | None,
    history: str,
    own_prompts: str,
    turns: str,
    prefix_len: int,
) -> None:
    data = measure(engine, rounds, runs, _ints(history), _ints(own_prompts), _turns(turns), prefix_len)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out_dir / "cascade-steps.json", json.dumps(data, indent=2) + "\n")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated token counts, e.g. 500,1000") from None


def _turns(text: str) -> tuple[tuple[int, int], ...]:
    try:
        out = tuple((int(k), int(n)) for k, n in (x.split("x") for x in text.split(",") if x.strip()))
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: comma-separated KxN (K turns of N tokens), e.g. 1x120,2x120"
        ) from None
    if any(not 1 <= k <= 8 or n < 1 for k, n in out):
        raise click.BadParameter(f"{text!r}: K from 1 to 8 turns, N at least 1 token")
    return out


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="python -m experiments.cascade_steps")


if __name__ == "__main__":
    main()
