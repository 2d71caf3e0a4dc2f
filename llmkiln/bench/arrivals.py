"""When requests are sent: a closed loop (a fixed number in flight, a new one as one ends) or an open loop
(Poisson arrivals at a given rate, seeded, whatever the server's speed), as serving benchmarks do it.

Both drive any `send(request) -> RequestRecord` coroutine (the Triton gRPC client, the OpenAI client) and return
the records in request order. The open loop sends request i at its arrival time even when earlier ones are still
running (up to `max_in_flight`, a safety bound; a request that has to wait for it is sent late, and its TTFT
counts from its scheduled arrival, so a saturated server shows up as higher TTFT, not as a slower schedule).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence

from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import BenchRequest
from llmkiln.errors import BadInput

Send = Callable[[BenchRequest], Awaitable[RequestRecord]]
Done = Callable[[RequestRecord], None]


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (seconds from the start) of n requests of a Poisson process with `rate` requests/s."""
    if not rate > 0:
        raise BadInput(f"--request-rate must be a positive number of requests per second, got {rate}")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


async def closed_loop(
    send: Send, requests: Sequence[BenchRequest], concurrency: int, on_done: Done | None = None
) -> list[RequestRecord]:
    """At most `concurrency` requests in flight; a new one starts as one ends."""
    queue = list(requests)
    records: list[RequestRecord] = []

    async def worker() -> None:
        while queue:
            rec = await send(queue.pop(0))
            records.append(rec)
            if on_done is not None:
                on_done(rec)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(queue)))))
    return sorted(records, key=lambda r: r.index)


async def open_loop(
    send: Send,
    requests: Sequence[BenchRequest],
    rate: float,
    seed: int = 0,
    max_in_flight: int = 256,
    on_done: Done | None = None,
) -> list[RequestRecord]:
    """Send request i at the i-th Poisson arrival (see the module docstring)."""
    offsets = poisson_offsets(len(requests), rate, seed)
    gate = asyncio.Semaphore(max_in_flight)
    start_ns = time.perf_counter_ns()

    async def one(req: BenchRequest, offset_s: float) -> RequestRecord:
        due_ns = start_ns + int(offset_s * 1e9)
        await asyncio.sleep(max(0.0, (due_ns - time.perf_counter_ns()) / 1e9))
        async with gate:
            rec = await send(req)
        rec.send_ns = min(rec.send_ns, due_ns)  # queueing behind max_in_flight counts as latency
        if on_done is not None:
            on_done(rec)
        return rec

    records = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
    return sorted(records, key=lambda r: r.index)
