"""`kiln bench soak` / `make soak`: steady concurrency against a served engine for N minutes, then a leak report.

Not part of CI (it runs for minutes by design). The engine is served on free loopback ports (the recipe's
warmup included); C client threads each keep one gRPC stream busy, sending the next request as soon as the last
one ended (a rotating mix of shared-prefix and unique prompts). Every 5 s the RSS of tritonserver and its python
stub is sampled. At the end, after the traffic stops and the metrics refresh, the report says:

- requests sent, succeeded, failed (with the first error messages);
- latency p50/p99 of the first and the last fifth of the run, and the drift between them;
- RSS of the first sample after the first fifth (warm) and the last one, and the drift;
- leaked slots and blocks: `llmkiln_active_slots`, `llmkiln_kv_blocks_pinned` and `llmkiln_requests_active`
  must be 0 with no traffic (cached prefix blocks may stay: they are the prefix cache, not a leak).
"""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from llmkiln.bench.client import grpc_inputs
from llmkiln.bench.serving import serve_engine

SYSTEM = "You are a friendly storyteller. You tell short, happy stories about animals and their toys.\n"
TOPICS = ("a cat", "a dog", "a red ball", "a little girl", "a big tree", "a boat", "the sun", "a bird")
LEAK_METRICS = ("llmkiln_active_slots", "llmkiln_kv_blocks_pinned", "llmkiln_requests_active")


@dataclass
class SoakReport:
    """What `kiln bench soak` prints (and writes as JSON with --out)."""

    minutes: float
    concurrency: int
    requests: int = 0
    succeeded: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    p50_ms_first: float = 0.0
    p99_ms_first: float = 0.0
    p50_ms_last: float = 0.0
    p99_ms_last: float = 0.0
    p99_drift_pct: float = 0.0
    rss_mb_warm: float = 0.0
    rss_mb_end: float = 0.0
    rss_drift_pct: float = 0.0
    leaks: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and all(v == 0 for v in self.leaks.values())

    def text(self) -> str:
        lines = [
            f"soak: {self.minutes:g} min at concurrency {self.concurrency}: {self.requests} requests, "
            f"{self.succeeded} ok, {self.failed} failed",
            f"latency p50/p99: first fifth {self.p50_ms_first:.1f}/{self.p99_ms_first:.1f} ms, last fifth "
            f"{self.p50_ms_last:.1f}/{self.p99_ms_last:.1f} ms (p99 drift {self.p99_drift_pct:+.1f}%)",
            f"RSS tritonserver + stub: warm {self.rss_mb_warm:.0f} MB, end {self.rss_mb_end:.0f} MB "
            f"(drift {self.rss_drift_pct:+.1f}%)",
            "leaked at rest: " + ", ".join(f"{k} = {v:g}" for k, v in self.leaks.items()),
        ]
        lines += [f"  error: {e}" for e in self.errors[:5]]
        lines.append("OK" if self.ok else "FAILED: errors or leaked slots/blocks")
        return "\n".join(lines)


def _rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            name = key.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def _client(url: str, model: str, stop: threading.Event, idx: int, out: list, max_tokens: int) -> None:
    """One busy stream: (start, latency s, error or None) per request into `out`."""
    q: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    n = 0
    try:
        while not stop.is_set():
            topic = TOPICS[(idx + n) % len(TOPICS)]
            prompt = (SYSTEM if n % 2 == 0 else f"Story {idx}-{n}: ") + f"Tell me about {topic}."
            t0 = time.monotonic()
            c.async_stream_infer(
                model, grpc_inputs(prompt, max_tokens, stream=True), enable_empty_final_response=True
            )
            error = None
            while True:
                try:
                    result, err = q.get(timeout=120)
                except queue.Empty:
                    error = "no response within 120 s"
                    break
                if err is not None:
                    error = str(err)
                    break
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            out.append((t0, time.monotonic() - t0, error))
            n += 1
    finally:
        c.stop_stream()
        c.close()


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1e3 if values else 0.0


def run_soak(engine_dir: Path, minutes: float, concurrency: int, max_tokens: int = 32) -> SoakReport:
    """Serve `engine_dir`, drive it for `minutes` at `concurrency`, return the report."""
    report = SoakReport(minutes=minutes, concurrency=concurrency)
    with serve_engine(engine_dir) as served:
        server = served.server
        stop = threading.Event()
        records: list[tuple[float, float, str | None]] = []
        threads = [
            threading.Thread(
                target=_client, args=(served.url, served.model, stop, i, records, max_tokens), daemon=True
            )
            for i in range(concurrency)
        ]
        t_start = time.monotonic()
        for t in threads:
            t.start()
        duration = minutes * 60
        rss: list[tuple[float, float]] = []
        while time.monotonic() - t_start < duration:
            rss.append((time.monotonic() - t_start, _rss_mb(server.leftover_processes())))
            time.sleep(min(5.0, max(duration - (time.monotonic() - t_start), 0.0)))
        rss.append((time.monotonic() - t_start, _rss_mb(server.leftover_processes())))
        stop.set()
        for t in threads:
            t.join(150)
        time.sleep(2.5)  # the engine gauges refresh every second
        values = _scrape(server.url_metrics)
        report.leaks = {name: values.get(name, float("nan")) for name in LEAK_METRICS}
    report.requests = len(records)
    report.failed = sum(1 for r in records if r[2] is not None)
    report.succeeded = report.requests - report.failed
    report.errors = sorted({r[2] for r in records if r[2] is not None})[:10]
    fifth = duration / 5
    first = [lat for t0, lat, err in records if err is None and t0 - t_start < fifth]
    last = [lat for t0, lat, err in records if err is None and t0 - t_start >= duration - fifth]
    report.p50_ms_first, report.p99_ms_first = _pct(first, 50), _pct(first, 99)
    report.p50_ms_last, report.p99_ms_last = _pct(last, 50), _pct(last, 99)
    if report.p99_ms_first:
        report.p99_drift_pct = 100 * (report.p99_ms_last / report.p99_ms_first - 1)
    warm = next((mb for t, mb in rss if t >= fifth), rss[-1][1])
    report.rss_mb_warm, report.rss_mb_end = warm, rss[-1][1]
    if warm:
        report.rss_drift_pct = 100 * (report.rss_mb_end / warm - 1)
    return report


def report_json(report: SoakReport) -> str:
    return json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n"
