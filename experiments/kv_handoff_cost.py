"""What the prefill → decode KV hand-off costs on the decode side, in one process (`python -m
experiments.kv_handoff_cost --engine ENGINE`): a prefill host and a decode host on the same engine folder, real
NIXL agents (UCX, DRAM), `--prompts` distinct prompts of `--tokens` tokens one at a time, idle otherwise.

Per prompt: the pull (reserve + NIXL READ + hand-back, `PullStats.seconds`; the READ alone, `read_seconds`) and the
decode request's time to first token once submitted with the imported blocks (admission, any copy of the
blocks into the runner's memory, the last prompt token's compute). Before the KV-manager redesign (issue 29) the
OpenVINO runner moved the KV pool → prefix store → NIXL → prefix store → pool; after it, pool → NIXL → pool. The
script runs on either side of that change (the submit hand-off became typed, `runtime.handoff.KvHandoff`), so
the same file measures both: `PYTHONPATH=<other checkout> python experiments/kv_handoff_cost.py ...`.
Writes OUT/kv-handoff-<engine>.json and prints the medians.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import click
import numpy as np


def _submit(engine: Any, ids: list[int], params: Any, **handoff: Any) -> Any:
    try:
        from llmkiln.runtime.handoff import KvHandoff
    except ImportError:  # before the redesign: keyword arguments
        return engine.submit(ids, params, **handoff)
    return engine.submit(ids, params, handoff=KvHandoff(**handoff))


def _host(folder: Path, role: Any) -> Any:
    from llmkiln.host.engine_host import EngineHost
    from llmkiln.host.host_options import HostOptions

    try:
        from llmkiln.host.kv_transfer_options import KvTransferOptions

        return EngineHost.open(
            folder, HostOptions(role=role, kv=KvTransferOptions(max_local_prefill_tokens=0))
        )
    except ImportError:
        return EngineHost.open(folder, HostOptions(role=role, max_local_prefill_tokens=0))  # type: ignore[call-arg]


@click.command()
@click.option("--engine", required=True, help="An engine folder or a name under --engines-dir.")
@click.option("--engines-dir", type=click.Path(path_type=Path), default=None)
@click.option("--tokens", default=1536, show_default=True)
@click.option("--prompts", default=24, show_default=True)
@click.option(
    "--out", type=click.Path(path_type=Path), default=Path("bench/results/kv-handoff"), show_default=True
)
def main(engine: str, engines_dir: Path | None, tokens: int, prompts: int, out: Path) -> None:
    from llmkiln.engine_dir import resolve_engine
    from llmkiln.host.roles import WorkerRole
    from llmkiln.runtime.request import SamplingParams

    folder = resolve_engine(engine, engines_dir).path
    pre, dec = _host(folder, WorkerRole.PREFILL), _host(folder, WorkerRole.DECODE)
    one = SamplingParams(max_tokens=1, temperature=0.0)
    rng = np.random.default_rng(0)
    vocab = min(30000, pre.engine.runner.vocab_size)
    rows = []
    try:
        for i in range(prompts + 1):  # the first one opens the UCX connection: not counted
            ids = [int(t) for t in rng.integers(10, vocab, tokens)]
            h = _submit(pre.engine, ids, one, export_prefix=True)
            h.result(120)
            params = pre.kv.open_export(h.exported.result(30))
            res, stats = dec.kv.pull(params, ids)
            t0 = time.perf_counter_ns()
            hd = _submit(dec.engine, ids, one, kv_import=res)
            hd.result(120)
            first_ns = hd.timings.first_token_ns - hd.timings.arrival_ns
            if i:
                rows.append(
                    {
                        "blocks": stats.read_blocks,
                        "bytes": stats.nbytes,
                        "pull_ms": stats.seconds * 1e3,
                        "read_ms": stats.read_seconds * 1e3,
                        "decode_ttft_ms": first_ns / 1e6,
                        "submit_to_done_ms": (time.perf_counter_ns() - t0) / 1e6,
                        "cached_tokens": hd.num_cached_tokens,
                    }
                )
    finally:
        pre.shutdown(5.0)
        dec.shutdown(5.0)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out.mkdir(parents=True, exist_ok=True)
    name = folder.name
    report = {
        "engine": name,
        "tokens": tokens,
        "prompts": prompts,
        "cpu": platform.processor(),
        "median": med,
        "rows": rows,
    }
    (out / f"kv-handoff-{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    click.echo(json.dumps({"engine": name, **{k: round(v, 3) for k, v in med.items()}}))


if __name__ == "__main__":
    main()
