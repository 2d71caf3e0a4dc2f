"""The stub's heartbeat: how `kiln serve` tells a stuck or stopped python-backend stub from a busy one.

Inside the stub a daemon thread writes `heartbeat_file` (a config parameter, like the drain file) every
HEARTBEAT_S seconds: wall time, the last time the stub's event loop ran a callback the thread posted to it, the
requests in flight and how long the engine has gone without a step while they are (EngineHost.health). The
launcher's watchdog (llmkiln.serve.server) reads it: a stale file (the stub is stopped or cannot run Python at
all), an event loop that stopped answering while requests are in flight, or an engine without a step for longer
than `serve.stall_timeout_s` mean the server is stuck. It then answers 503 at the HTTP front, kills the stub
(Triton fails the requests in flight with an error) and tritonserver, and `kiln serve` exits 1 naming the cause:
no request hangs silently. Nothing here needs the stub's main thread; the judgement is made in another process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from asyncio import AbstractEventLoop
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class Beat:
    t: float  # when the thread wrote it (time.time())
    loop_t: float  # when the stub's event loop last ran the thread's callback (0: no loop known yet)
    in_flight: int
    stalled_s: float  # the engine's seconds without a step while requests are in flight

    def problem(self, now: float, bound_s: float) -> str | None:
        """Why the stub is stuck, or None."""
        if now - self.t > bound_s:
            return f"the python backend stub wrote no heartbeat for {now - self.t:.0f} s (stopped or stuck)"
        if self.in_flight and self.loop_t and now - self.loop_t > bound_s:
            return (
                f"the stub's event loop has not run for {now - self.loop_t:.0f} s with {self.in_flight} "
                "request(s) in flight"
            )
        if self.stalled_s > bound_s:
            return f"the engine made no step for {self.stalled_s:.0f} s with {self.in_flight} request(s) in flight"
        return None


def read_beat(path: Path) -> Beat | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Beat(float(data["t"]), float(data["loop_t"]), int(data["in_flight"]), float(data["stalled_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Heartbeat:
    """The writer thread (in the stub). `loop()` returns the stub's event loop once known (None before)."""

    def __init__(
        self,
        path: Path,
        loop: Callable[[], AbstractEventLoop | None],
        in_flight: Callable[[], int],
        stalled_s: Callable[[], float],
    ) -> None:
        self.path, self._loop, self._in_flight, self._stalled = path, loop, in_flight, stalled_s
        self._loop_t = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmkiln-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._write()
        self._thread.start()
        return self

    def _mark(self) -> None:
        self._loop_t = time.time()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            loop = self._loop()
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._mark)
                except RuntimeError:  # the loop closed meanwhile
                    pass
            self._write()

    def _write(self) -> None:
        loop_t = self._loop_t if self._loop() is not None else time.time()  # no loop yet: nothing waits on it
        data = {
            "t": time.time(),
            "loop_t": loop_t,
            "in_flight": self._in_flight(),
            "stalled_s": self._stalled(),
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # the folder went away: the server is being stopped

    def stop(self) -> None:
        self._stop.set()
