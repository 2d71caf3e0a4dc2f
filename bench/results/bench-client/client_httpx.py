"""CPU a streamed chunk costs llmkiln.bench.openai_client (httpx, asyncio's loop): 200 requests at c=8 against
sse_server.py.   PYTHONPATH=. python client_httpx.py PORT"""

import asyncio
import resource
import sys
import time

import httpx

from llmkiln.bench import openai_client
from llmkiln.bench.workloads import BenchRequest

URL = f"http://127.0.0.1:{sys.argv[1]}/v1"


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main() -> None:
    reqs = [BenchRequest(i, "hello " * 1500, 64, 1500, "g") for i in range(200)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        sem = asyncio.Semaphore(8)

        async def one(r: BenchRequest):
            async with sem:
                return await openai_client.run_one(client, URL, "m", r, "completions", 60)

        c0, w0 = cpu_s(), time.time()
        recs = await asyncio.gather(*(one(r) for r in reqs))
        cpu = cpu_s() - c0
    tokens = sum(len(r.token_ns) for r in recs)
    errors = [r.error for r in recs if r.error][:2]
    print(
        f"tokens {tokens} cpu {cpu:.2f}s = {cpu / tokens * 1e6:.0f} us/token wall {time.time() - w0:.1f}s {errors}"
    )


asyncio.run(main())
