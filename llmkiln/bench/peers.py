"""Peers on the same ONNX file (and the same source weights) and the same requests, measured in-process.

- ``onnxruntime-genai-engine``: og.Engine (onnxruntime-genai 0.18's request engine), one thread driving
  ``engine.run``; at most `concurrency` requests in flight (a closed loop, like the client), its static batch
  sized to the concurrency. (Its dynamic batching needs a paged-KV export, not this ONNX file.)
- ``onnxruntime-genai-generator``: one og.Generator per request, `concurrency` worker threads sharing one og.Model.
- ``transformers``: HF transformers on torch CPU, the source checkpoint in fp32, one request at a time (plain
  transformers has no request batching); `concurrency` requests wait in a FIFO queue, so TTFT includes the wait.

All peers decode greedily for exactly the request's max_tokens (EOS ignored where the API allows) and tokenize
the prompt with the engine's tokenizer (BOS included, as the server does). Times are perf_counter_ns of this
process: send = when the request enters the peer, tokens = when each token is available to the caller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from llmkiln.bench.report import BenchReport, RunInfo, make_report
from llmkiln.bench.stats import RequestRecord, level_stats
from llmkiln.bench.workloads import BenchRequest, Workload, load_tokenizer

PEERS: tuple[str, ...] = ("onnxruntime-genai-engine", "onnxruntime-genai-generator", "transformers")


def _ids(engine_dir: Path, requests: Sequence[BenchRequest]) -> list[list[int]]:
    tok = load_tokenizer(engine_dir)
    return [tok.encode(r.prompt).ids for r in requests]


def _record(req: BenchRequest, send_ns: int) -> RequestRecord:
    return RequestRecord(
        index=req.index, group=req.group, send_ns=send_ns, num_prompt_tokens=req.num_prompt_tokens
    )


# ---------------------------------------------------------------------------------------------------------------
# onnxruntime-genai


def run_og_generator(
    engine_dir: Path, requests: Sequence[BenchRequest], concurrency: int
) -> list[RequestRecord]:
    """One og.Generator per request, `concurrency` threads (closed loop)."""
    import onnxruntime_genai as og

    model = og.Model(str(engine_dir))
    prompts = _ids(engine_dir, requests)
    lock = threading.Lock()
    pending = list(range(len(requests)))

    def one(i: int) -> RequestRecord:
        req, ids = requests[i], prompts[i]
        rec = _record(req, time.perf_counter_ns())
        try:
            params = og.GeneratorParams(model)
            params.set_search_options(
                max_length=len(ids) + req.max_tokens, min_length=len(ids) + req.max_tokens, do_sample=False
            )
            gen = og.Generator(model, params)
            gen.append_tokens(np.asarray(ids, dtype=np.int32))  # the prompt's forward pass
            while not gen.is_done() and rec.num_output_tokens < req.max_tokens:
                gen.generate_next_token()  # picks a token (and runs the model on the previous one)
                rec.token_ns.append(time.perf_counter_ns())
                rec.num_output_tokens += 1
            rec.end_ns = time.perf_counter_ns()
        except Exception as exc:  # a failed peer request is reported, not raised
            rec.error = f"{type(exc).__name__}: {exc}"
        return rec

    def worker() -> list[RequestRecord]:
        out: list[RequestRecord] = []
        while True:
            with lock:
                if not pending:
                    return out
                i = pending.pop(0)
            out.append(one(i))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = [f.result() for f in [pool.submit(worker) for _ in range(min(concurrency, len(requests)))]]
    return sorted((r for rs in results for r in rs), key=lambda r: r.index)


def run_og_engine(
    engine_dir: Path, requests: Sequence[BenchRequest], concurrency: int
) -> tuple[list[RequestRecord], dict]:
    """og.Engine with at most `concurrency` requests in flight; returns the records and the engine capabilities.

    The engine's batch is sized to the concurrency (its default is 4). NOTE: og.Engine's dynamic batching (paged
    KV, prefix caching, chunked prefill) needs a graph exported with a paged KV cache, so on this ONNX file the
    engine runs its static batch scheduler.
    """
    import json

    import onnxruntime_genai as og

    config = og.Config(str(engine_dir))
    config.overlay(json.dumps({"engine": {"static_batching": {"max_batch_size": concurrency}}}))
    model = og.Model(config)
    engine = og.Engine(model)
    caps = engine.get_capabilities()
    info = {
        "configured_max_batch_size": caps.configured_max_batch_size,
        "max_request_length": caps.max_request_length,
        "max_scheduled_tokens": caps.max_scheduled_tokens,
    }
    prompts = _ids(engine_dir, requests)
    buf = engine.create_event_buffer(max(256, 4 * concurrency))
    queue = list(range(len(requests)))
    live: dict[int, tuple[Any, RequestRecord]] = {}  # id(og request) -> (og.Request, record)
    done: list[RequestRecord] = []

    def submit() -> None:
        i = queue.pop(0)
        req = requests[i]
        rec = _record(req, time.perf_counter_ns())
        r = engine.create_request()
        opts = og.TurnOptions(r)
        opts.set_max_generated_tokens(req.max_tokens)
        opts.set_min_generated_tokens(req.max_tokens)
        opts.set_do_sample(False)
        r.begin_turn(np.asarray(prompts[i], dtype=np.int32), opts)
        live[id(r)] = (r, rec)

    while queue and len(live) < concurrency:
        submit()
    while live:
        events = engine.run(buf)
        now = time.perf_counter_ns()
        for ev in events:
            entry = live.get(id(ev.request))
            if entry is None:
                continue
            r, rec = entry
            flags = int(ev.flags.value) if hasattr(ev.flags, "value") else int(ev.flags)
            if flags & int(og.EngineEventFlags.TOKEN.value):
                rec.token_ns.append(now)
                rec.num_output_tokens += 1
            if flags & int(og.EngineEventFlags.FAILED.value):
                rec.error = f"og.Engine failed: {ev.error_code}"
            if flags & (int(og.EngineEventFlags.TURN_FINISHED.value) | int(og.EngineEventFlags.FAILED.value)):
                rec.end_ns = now
                del live[id(r)]
                r.close()
                done.append(rec)
                if queue:
                    submit()
        if not events and not engine.has_pending_requests():
            for _r, rec in live.values():
                rec.error = rec.error or "og.Engine stopped without finishing the request"
                done.append(rec)
            live.clear()
    return sorted(done, key=lambda r: r.index), info


# ---------------------------------------------------------------------------------------------------------------
# transformers


def run_transformers(
    model_dir: Path, engine_dir: Path, requests: Sequence[BenchRequest], concurrency: int
) -> list[RequestRecord]:
    """Greedy decoding with a KV cache, one request at a time; `concurrency` requests queue FIFO (closed loop)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    prompts = _ids(engine_dir, requests)
    records: list[RequestRecord] = []
    # Closed loop with one worker: the first `concurrency` requests are sent at once, each later one when an
    # earlier one ends.
    start = time.perf_counter_ns()
    send = [start] * min(concurrency, len(requests))
    with torch.inference_mode():
        for i, req in enumerate(requests):
            rec = _record(req, send[i])
            try:
                ids = torch.tensor([prompts[i]], dtype=torch.long)
                out = model(input_ids=ids, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                rec.token_ns.append(time.perf_counter_ns())
                rec.num_output_tokens = 1
                while rec.num_output_tokens < req.max_tokens:
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                    rec.token_ns.append(time.perf_counter_ns())
                    rec.num_output_tokens += 1
                rec.end_ns = time.perf_counter_ns()
            except Exception as exc:
                rec.error = f"{type(exc).__name__}: {exc}"
                rec.end_ns = time.perf_counter_ns()
            records.append(rec)
            send.append(rec.end_ns)
    return records


# ---------------------------------------------------------------------------------------------------------------


def run_peer(
    name: str,
    engine_dir: Path,
    model_dir: Path | None,
    workload: Workload,
    requests: Sequence[BenchRequest],
    concurrency: int,
) -> BenchReport:
    """Run one peer at one concurrency level on `requests`; a report shaped like llmkiln's."""
    extra: dict = {"engine_dir": str(engine_dir)}
    t0 = time.perf_counter()
    if name == "onnxruntime-genai-generator":
        recs = run_og_generator(engine_dir, requests, concurrency)
    elif name == "onnxruntime-genai-engine":
        recs, caps = run_og_engine(engine_dir, requests, concurrency)
        extra["og_engine"] = caps
    elif name == "transformers":
        if model_dir is None:
            raise ValueError("the transformers peer needs the source model folder")
        import torch

        recs = run_transformers(model_dir, engine_dir, requests, concurrency)
        extra["model_dir"] = str(model_dir)
        extra["torch_threads"] = torch.get_num_threads()
    else:
        raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEERS)}")
    extra["wall_s"] = time.perf_counter() - t0
    run = RunInfo(
        label=name,
        system=name,
        workload=workload.describe(),
        mode="cold",
        warmup_requests=0,
        requests_per_level=len(requests),
        extra=extra,
    )
    records = {concurrency: recs}
    return make_report(run, [level_stats(concurrency, recs)], records)


def ratios(llmkiln: BenchReport, peer: BenchReport, concurrency: int) -> dict[str, float | None]:
    """llmkiln ÷ peer for TTFT (p50, p95, mean: lower is better) and throughput (higher is better)."""
    a, b = llmkiln.level(concurrency), peer.level(concurrency)
    if a is None or b is None:
        return {}

    def div(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else x / y

    return {
        "ttft_p50": div(a.ttft_ms.p50, b.ttft_ms.p50),
        "ttft_p95": div(a.ttft_ms.p95, b.ttft_ms.p95),
        "ttft_mean": div(a.ttft_ms.mean, b.ttft_ms.mean),
        "tpot_p50": div(a.tpot_ms.p50, b.tpot_ms.p50),
        "output_token_throughput": div(a.output_token_throughput, b.output_token_throughput),
        "request_throughput": div(a.request_throughput, b.request_throughput),
    }


Runner = Callable[..., BenchReport]
