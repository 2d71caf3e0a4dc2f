"""CPU a streamed chunk costs a bare aiohttp client: 200 requests at c=8 against sse_server.py, on asyncio's loop,
or on uvloop with a second argument.   python client_aiohttp.py PORT [uv]"""

import asyncio
import json
import resource
import sys
import time

import aiohttp

URL = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def one(session: aiohttp.ClientSession) -> int:
    tokens, buf = 0, b""
    body = {"model": "m", "prompt": "hello " * 1500, "max_tokens": 64, "stream": True}
    async with session.post(URL, json=body) as r:
        async for data in r.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data:"):
                    continue
                payload = event[5:].strip()
                if payload == b"[DONE]":
                    return tokens
                for choice in json.loads(payload).get("choices") or []:
                    if choice.get("text"):
                        tokens += 1
                        time.perf_counter_ns()
    return tokens


async def main() -> None:
    async with aiohttp.ClientSession() as session:
        sem = asyncio.Semaphore(8)

        async def limited() -> int:
            async with sem:
                return await one(session)

        c0, w0 = cpu_s(), time.time()
        tokens = sum(await asyncio.gather(*(limited() for _ in range(200))))
        cpu = cpu_s() - c0
    print(
        f"aiohttp tokens {tokens} cpu {cpu:.2f}s = {cpu / tokens * 1e6:.0f} us/token wall {time.time() - w0:.1f}s"
    )


if len(sys.argv) > 2:
    import uvloop

    uvloop.install()
asyncio.run(main())
