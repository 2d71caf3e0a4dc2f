"""llmkiln's runtime in-process, driven like the OpenVINO GenAI peer: engine against engine, no server, no client.

    python -m experiments.cpu_peer_llmkiln_inprocess --out DIR --engine engines/bench-ov-bf16 \
        --concurrency 8,16,32 --requests 64,64,128 --warmup 16 --user-tokens 30-40 --output-spread 16 \
        --set scheduler.max_batch_size=32

The served systems of experiments.cpu_peers pay for a front door (HTTP/gRPC, streaming, detokenizing) and share
the machine's cores with the benchmark client; experiments.cpu_peer_openvino_genai's pipeline pays neither (its
harness adds requests and reads tokens in-process). This is llmkiln's runtime measured the same way: the engine
folder loaded in this process (llmkiln.runtime.loader.load_engine, the recipe's settings plus `--set`), the very
requests of cpu_peers' workload for the same sizes (its split_workload: warm-up, then each level), each prompt
encoded as the server does (BOS included) and submitted as token ids, greedy, EOS ignored; a closed loop of
`concurrency` requests in flight per level.

Two harnesses (`--harness`):
- `stepped` (the default): exactly the GenAI peer's loop — this thread calls `engine.step()` (no engine thread),
  stamps each step's tokens with the time the step returned, and submits a finished request's successor before
  the next step. Engine against engine, the same harness on both sides.
- `async`: the engine's own scheduler thread, one client coroutine per lane on an event loop in this thread
  (token times when each event reaches the loop), as the served front doors drive it. A successor is submitted
  once the loop has seen its predecessor end, by which time the engine's next step is usually running: it waits
  that step out (at c=8 about 20 ms of TTFT on the Xeon), and the loop's wake-ups share the cores with the
  engine's compute threads. Named llmkiln-inproc-async-<precision>.
The gap between this and the served llmkiln systems is the serving cost; the gap to OpenVINO GenAI is the
engine's.

With $LLMKILN_PROFILE=FILE the engine writes its step profile there, as a served engine does (llmkiln.runtime.profile;
bench/results/cpu-speed-zen5/ttft/contention/step_shapes.py reads it).

Writes OUT/llmkiln-inproc[-async]-<precision>[-int8].json (BenchReport; -int8: an engine with int8 weights) and,
when OUT/summary.json exists (a cpu_peers run in the same folder), adds the system to it and rewrites SUMMARY.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from experiments.cpu_peers import CpuPeersConfig, resummarize, split_workload
from experiments.cpu_peers_summary import level_metrics
from llmkiln.bench.report import RunInfo, make_report, save_report
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.bench.workloads import BenchRequest, Workload, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.cli.options import engines_dir_option, recipe_sets
from llmkiln.engine_dir import resolve_engine
from llmkiln.runtime.engine import LLMEngine
from llmkiln.runtime.handle import RequestHandle
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.profile import PROFILE_ENV
from llmkiln.runtime.request import SamplingParams

KIND = "llmkiln-inprocess"


async def _one(engine: LLMEngine, req: BenchRequest, ids: list[int]) -> RequestRecord:
    rec = RequestRecord(index=req.index, group=req.group, send_ns=time.perf_counter_ns())
    rec.num_prompt_tokens = req.num_prompt_tokens
    handle = engine.submit(ids, SamplingParams(max_tokens=req.max_tokens, ignore_eos=True))
    async with contextlib.aclosing(handle.aiter()) as events:
        async for ev in events:
            if ev.token_id is not None:
                rec.token_ns.append(time.perf_counter_ns())
                rec.num_output_tokens += 1
            if ev.finished:
                break
    rec.end_ns = time.perf_counter_ns()
    rec.num_cached_tokens = handle.num_cached_tokens
    if handle.error:
        rec.error = handle.error
    elif rec.num_output_tokens != req.max_tokens:
        rec.error = f"{rec.num_output_tokens} tokens instead of {req.max_tokens}"
    return rec


def stepped_loop(
    engine: LLMEngine,
    requests: Sequence[BenchRequest],
    ids: dict[int, list[int]],
    concurrency: int,
    params: Callable[[BenchRequest], SamplingParams] | None = None,
    outs: dict[int, list[int]] | None = None,
) -> list[RequestRecord]:
    """The closed loop as OpenVINO GenAI's harness runs its pipeline (cpu_peer_openvino_genai_worker.closed_loop):
    no engine thread; this thread calls `engine.step()`, stamps the tokens each step produced with the time the
    step returned, and a finished request's successor is submitted before the next step. `params`: each request's
    sampling (default: exactly max_tokens, EOS ignored; otherwise any count from 1 to max_tokens is a success);
    `outs`: filled with each request's output ids."""
    pending = list(requests)
    live: dict[int, tuple[BenchRequest, RequestRecord, RequestHandle, int]] = {}  # index -> (.., events seen)
    out: list[RequestRecord] = []

    def submit() -> None:
        req = pending.pop(0)
        rec = RequestRecord(index=req.index, group=req.group, send_ns=time.perf_counter_ns())
        rec.send_wall_ns = time.time_ns()
        rec.num_prompt_tokens = req.num_prompt_tokens
        sampling = (
            params(req) if params is not None else SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
        )
        handle = engine.submit(ids[req.index], sampling)
        live[req.index] = (req, rec, handle, 0)
        if outs is not None:
            outs[req.index] = []

    while pending and len(live) < concurrency:
        submit()
    while live:
        if not engine.step():
            raise RuntimeError("the engine had nothing to run while requests were in flight")
        now = time.perf_counter_ns()
        for index in list(live):
            req, rec, handle, seen = live[index]
            events = handle.events_since(seen)
            live[index] = (req, rec, handle, seen + len(events))
            for ev in events:
                if ev.token_id is not None:
                    rec.token_ns.append(now)
                    rec.num_output_tokens += 1
                    if outs is not None:
                        outs[index].append(ev.token_id)
            if events and events[-1].finished:
                rec.end_ns = now
                rec.num_cached_tokens = handle.num_cached_tokens
                if handle.error:
                    rec.error = handle.error
                elif params is None and rec.num_output_tokens != req.max_tokens:
                    rec.error = f"{rec.num_output_tokens} tokens instead of {req.max_tokens}"
                elif not 0 < rec.num_output_tokens <= req.max_tokens:
                    rec.error = f"{rec.num_output_tokens} tokens (max_tokens {req.max_tokens})"
                out.append(rec)
                del live[index]
        while pending and len(live) < concurrency:
            submit()
    return sorted(out, key=lambda r: r.index)


async def closed_loop(
    engine: LLMEngine, wl: Workload, ids: dict[int, list[int]], concurrency: int
) -> list[RequestRecord]:
    """`concurrency` requests in flight until the workload is done (a new one as soon as one ends)."""
    pending = list(wl.requests)
    out: list[RequestRecord] = []

    async def lane() -> None:
        while pending:
            req = pending.pop(0)
            out.append(await _one(engine, req, ids[req.index]))

    await asyncio.gather(*(lane() for _ in range(min(concurrency, len(pending)))))
    return sorted(out, key=lambda r: r.index)


@click.command("cpu-peer-llmkiln-inprocess", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--engine", required=True, help="An engine folder (or a name under --engines-dir).")
@click.option("--concurrency", default=None, help="Closed-loop levels [default: 1,4,8].")
@click.option("--requests", "requests_", default=None, help="Requests per level [default: 24,32,64].")
@click.option("--warmup", type=int, default=None, help="Warm-up requests, not measured [default: 8].")
@click.option("--user-tokens", default=None, help="Fresh tokens per request [default: 80-120].")
@click.option(
    "--workload",
    type=click.Choice(["shared-prefix", "unique"]),
    default=None,
    help="cpu_peers' workloads [default: shared-prefix].",
)
@click.option("--prompt-tokens", default=None, help="unique: prompt length [default: 1550-1700].")
@click.option("--output-spread", type=int, default=None, help="Output tokens 32 ± this [default: 0].")
@click.option("--set", "sets", multiple=True, help="Recipe fields for the engine, SECTION.FIELD=VALUE.")
@click.option(
    "--harness",
    type=click.Choice(["stepped", "async"]),
    default="stepped",
    show_default=True,
    help="stepped: this thread runs the engine's steps and submits a finished request's successor before the next "
    "one (OpenVINO GenAI's harness); async: the engine's own thread, clients on an event loop (as a server's).",
)
@engines_dir_option
def cli(
    out_dir: Path,
    engine: str,
    concurrency: str | None,
    requests_: str | None,
    warmup: int | None,
    user_tokens: str | None,
    workload: str | None,
    prompt_tokens: str | None,
    output_spread: int | None,
    sets: tuple[str, ...],
    harness: str,
    engines_dir: Path,
) -> None:
    sizes = CpuPeersConfig.make(
        out_dir=out_dir,
        concurrency=concurrency,
        requests=requests_,
        warmup=warmup,
        user_tokens=user_tokens,
        output_spread=output_spread,
        workload=workload,
        prompt_tokens=prompt_tokens,
    )
    overrides = recipe_sets(sets, "--set") if sets else None
    folder = resolve_engine(engine, engines_dir)
    tok = load_tokenizer(folder.path)
    wl = build_workload(tok, sizes.spec())
    warm, levels = split_workload(wl, sizes.warmup, sizes.levels, sizes.requests)
    ids = {r.index: tok.encode(r.prompt, add_special_tokens=True).ids for r in wl.requests}
    t0 = time.monotonic()
    eng = load_engine(folder, overrides)
    if os.environ.get(PROFILE_ENV):  # the step profile, as a served engine writes it
        eng.enable_profile(os.environ[PROFILE_ENV])
    if harness == "async":
        eng.start()
    load_s = time.monotonic() - t0
    precision = eng.recipe.precision if eng.recipe is not None else "fp32"
    # an engine with int8 weights (recipe `weights: int8`, openvino-cpu) is a system of its own
    variant = precision + ("-int8" if eng.runtime_settings.get("weights") == "int8" else "")
    name = f"llmkiln-inproc-{variant}" if harness == "stepped" else f"llmkiln-inproc-async-{variant}"

    def loop(wl_: Workload, c: int) -> list[RequestRecord]:
        if harness == "stepped":
            return stepped_loop(eng, wl_.requests, ids, c)
        return asyncio.run(closed_loop(eng, wl_, ids, c))

    before = [round(x, 2) for x in os.getloadavg()]
    records: dict[int, list[RequestRecord]] = {}
    try:
        loop(warm, max(sizes.levels))
        for c, level in levels.items():
            records[c] = loop(level, c)
            ok = sum(r.ok for r in records[c])
            click.echo(f"{name} c={c}: {ok}/{len(records[c])} ok", err=True)
    finally:
        eng.shutdown(5.0)
    stats = [level_stats(c, records[c]) for c in sizes.levels]
    run = RunInfo(
        label=name,
        system=KIND,
        workload=wl.describe(),
        mode="warm",
        warmup_requests=sizes.warmup,
        requests_per_level=max(sizes.requests),
        api="in-process",
        extra={
            "engine_dir": str(folder.path),
            "overrides": overrides or {},
            "settings": eng.runtime_settings,
            "harness": harness,
        },
    )
    report = make_report(run, stats, records)
    save_report(report, out_dir / f"{name}.json")
    saved = out_dir / "summary.json"
    if saved.is_file():
        summary: dict[str, Any] = json.loads(saved.read_text(encoding="utf-8"))
        summary.setdefault("systems", {})[name] = {
            "kind": KIND,
            "recipe": None,
            "precision": precision,
            "engine": str(folder.path),
            "api": "in-process",
            "ready_s": load_s,
            "loadavg_before": before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "levels": {str(lv.concurrency): level_metrics(lv, records[lv.concurrency]) for lv in stats},
        }
        saved.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        click.echo(f"added {name} to {saved}; {resummarize(out_dir)} rewritten", err=True)


def main(argv: list[str] | None = None) -> None:
    run_command(cli, argv, prog_name="python -m experiments.cpu_peer_llmkiln_inprocess")


if __name__ == "__main__":
    main()
