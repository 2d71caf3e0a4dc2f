"""The way in, one request at a time: streamed completions with a ~1500-token prompt through llmkiln's OpenAI
front (text, as clients send it; token ids) and straight to Dynamo's frontend behind it (token ids; text, which
it tokenizes without the BOS), and the time until the worker's generate has each (the worker's serve records):

    PYTHONPATH=. python bench/results/cpu-speed-zen5/ttft/way_in.py engines/bench-ov-bf16 20

(20 requests per mode and round, two rounds; c=1, 4 output tokens; a new connection per request.)"""

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from tokenizers import Tokenizer

from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir

MODES = ("front-text", "direct-ids", "direct-text", "front-ids")


async def send(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, float]:
    wall, t0 = time.time_ns(), time.perf_counter()
    ttft = float("nan")
    async with session.post(url + "/completions", json=body) as resp:
        async for line in resp.content:
            if line.startswith(b"data:") and b"choices" in line:
                ttft = (time.perf_counter() - t0) * 1e3
                break
        async for _ in resp.content:
            pass
    return wall, ttft


async def run(front: str, direct: str, model: str, tok: Tokenizer, n: int) -> dict[str, list]:
    rng = random.Random(0)
    words = "the a cat dog sat on mat red blue green house tree river stone light dark".split()
    system = " ".join(rng.choice(words) for _ in range(1400))
    out: dict[str, list] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(2):
            for mode in MODES:
                for _ in range(n):
                    text = system + " " + " ".join(rng.choice(words) for _ in range(90))
                    ids = [1] + tok.encode(text, add_special_tokens=False).ids
                    body = {
                        "model": model,
                        "max_tokens": 4,
                        "stream": True,
                        "temperature": 0,
                        "prompt": ids if mode.endswith("ids") else text,
                    }
                    out.setdefault(mode, []).append(
                        await send(s, front if mode.startswith("front") else direct, body)
                    )
                    await asyncio.sleep(0.05)
    return out


def main() -> None:
    engine, n = Path(sys.argv[1]).resolve(), int(sys.argv[2])
    prof = Path(tempfile.mkdtemp(prefix="way-in-"))
    tok = Tokenizer.from_file(str(engine / "tokenizer.json"))
    with serve_dynamo_engine(
        engine, DynamoOptions(workers=1, grace_period_s=1.0, profile_dir=prof)
    ) as launcher:
        model = launcher.spec.served_model_name or EngineDir(engine).recipe().serve.model_name
        sent = asyncio.run(run(launcher.url, f"http://{launcher.spec.frontend_address}/v1", model, tok, n))
    time.sleep(0.5)
    recs = [json.loads(x) for f in prof.glob("*.jsonl") for x in f.read_text().splitlines() if x.strip()]
    serves = sorted((r for r in recs if r.get("kind") == "serve"), key=lambda r: r["received"])
    sends = sorted((wall, mode, ttft) for mode, v in sent.items() for wall, ttft in v)
    by: dict[str, list[tuple[float, float, float]]] = {}
    for (wall, mode, ttft), sv in zip(sends, serves[-len(sends) :], strict=True):
        by.setdefault(mode, []).append(
            ((sv["received"] - wall) / 1e6, ttft, (sv["first_sent"] - sv["received"]) / 1e6)
        )
    for mode, v in by.items():
        print(
            f"{mode:12s} client -> worker p50 {statistics.median(x[0] for x in v):5.1f}  worker -> first chunk p50 "
            f"{statistics.median(x[2] for x in v):5.1f}  TTFT p50 {statistics.median(x[1] for x in v):5.1f} ms (n={len(v)})"
        )


if __name__ == "__main__":
    main()
