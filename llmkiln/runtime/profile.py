"""Step profile of the CPU runtime: where each engine step's time goes, and each request's way to its first token.

Off unless asked for: `LLMEngine.enable_profile(path)`, or `$LLMKILN_PROFILE=FILE` for a served engine (the
python backend reads it; `kiln profile` and the TTFT experiment set it). Then the engine appends JSON lines
to FILE:

- `{"kind": "step", ...}` one per engine step (`StepTrace`): wall-clock start, scheduling, prefix-block loads
  and saves, every prefill run (batch, tokens, past length, time), the decode batch (sequences, rows run,
  context width, time), sampling, the scheduler update, handing events to the streams; queue and running
  counts. Times are perf_counter_ns deltas in microseconds.
- `{"kind": "request", ...}` one per finished request (engine side): arrival, first scheduled, first token and
  finish (time.time_ns), prompt / cached / output tokens.
- `{"kind": "serve", ...}` one per request from the serving core (time.time_ns): when the backend got the
  request, submitted it, saw its first token event, and had handed the first response to Triton.

Lines are buffered and written when a request finishes or the engine goes idle, so a step costs a few list
appends; llmkiln.bench.profile reads the file back and aggregates it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_ENV = "LLMKILN_PROFILE"
# A request or serve record: flat JSON scalars by field name (ids, nanosecond stamps, counts, reasons).
ProfileRecord = Mapping[str, int | float | str | None]


def now_ns() -> int:
    return time.perf_counter_ns()


@dataclass
class StepTrace:
    """Phase times of one engine step (perf_counter_ns deltas), filled by the engine and the runner."""

    t_ns: int  # time.time_ns() when the step started
    schedule_ns: int = 0
    load_ns: int = 0
    loads: int = 0
    # one entry per prefill run: (batch, tokens, past length, ns, request ids)
    prefills: list[tuple[int, int, int, int, tuple[str, ...]]] = field(default_factory=list)
    decode: tuple[int, int, int, int] | None = None  # (sequences, rows run, context width, ns)
    save_ns: int = 0
    saves: int = 0
    sample_ns: int = 0
    update_ns: int = 0
    emit_ns: int = 0
    total_ns: int = 0
    waiting: int = 0
    running: int = 0

    def to_json(self) -> dict[str, object]:
        us = 1000
        return {
            "kind": "step",
            "t": self.t_ns,
            "sched_us": self.schedule_ns // us,
            "load_us": self.load_ns // us,
            "loads": self.loads,
            "prefill": [[b, n, past, ns // us, list(ids)] for b, n, past, ns, ids in self.prefills],
            "decode": None if self.decode is None else [*self.decode[:3], self.decode[3] // us],
            "save_us": self.save_ns // us,
            "saves": self.saves,
            "sample_us": self.sample_ns // us,
            "update_us": self.update_ns // us,
            "emit_us": self.emit_ns // us,
            "total_us": self.total_ns // us,
            "waiting": self.waiting,
            "running": self.running,
        }


class ServeStamps:
    """One request's way through a front door, for its `serve` record (time.time_ns()): the front door got it
    (`received`), the engine took it (`submit`), its first event reached the front door's loop (`first_seen`) and
    its first response was handed on (`first_sent`: the Triton handler stamps it as it sends, the Dynamo worker
    when Dynamo has taken the chunk). `send` adds the time of one response send where the front door times them
    (the Triton stub's); the record carries `send_us` / `sends` only then. Both front doors build their record
    here (llmkiln.serve.handler, llmkiln.dynamo.worker)."""

    __slots__ = ("received_ns", "submit_ns", "first_seen_ns", "first_sent_ns", "send_ns", "sends")

    def __init__(self, received_ns: int, submit_ns: int) -> None:
        self.received_ns, self.submit_ns = received_ns, submit_ns
        self.first_seen_ns: int | None = None
        self.first_sent_ns: int | None = None
        self.send_ns = 0
        self.sends = 0

    def seen(self) -> None:
        if self.first_seen_ns is None:
            self.first_seen_ns = time.time_ns()

    def sent(self) -> None:
        if self.first_sent_ns is None:
            self.first_sent_ns = time.time_ns()

    def send(self, ns: int) -> None:
        self.send_ns += ns
        self.sends += 1

    def record(self, request_id: str, tokens: int) -> dict[str, int | str | None]:
        rec: dict[str, int | str | None] = {
            "id": request_id,
            "received": self.received_ns,
            "submit": self.submit_ns,
            "first_seen": self.first_seen_ns,
            "first_sent": self.first_sent_ns,
            "done": time.time_ns(),
            "tokens": tokens,
        }
        if self.sends:
            rec["send_us"] = self.send_ns // 1000  # time inside the response sends (all but the last)
            rec["sends"] = self.sends
        return rec


class Profiler:
    """Appends profile records (JSON lines) to one file; thread-safe (the scheduler thread writes steps and
    requests, the serving core's event loop writes serve records)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._write({"kind": "start", "pid": os.getpid(), "t": time.time_ns()})

    def _write(self, record: Mapping[str, object]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._lines.append(line)

    def step(self, trace: StepTrace) -> None:
        self._write(trace.to_json())

    def request(self, record: ProfileRecord) -> None:
        self._write({"kind": "request", **record})

    def serve(self, record: ProfileRecord) -> None:
        self._write({"kind": "serve", **record})
        self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._lines = self._lines, []
            if lines and not self._file.closed:
                self._file.write("\n".join(lines) + "\n")
                self._file.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._file.close()
