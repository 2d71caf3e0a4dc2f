"""c=1 served TTFT by path: through llmkiln's front (text / token ids) and straight to Dynamo's frontend (ids)."""

import random
import re as _re
import statistics
import sys
import time
from pathlib import Path

import httpx
from tokenizers import Tokenizer

from llmkiln.bench.serving import serve_dynamo_engine
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.engine_dir import EngineDir

engine = Path(sys.argv[1])
n = int(sys.argv[2])
tok = Tokenizer.from_file(str(engine / "tokenizer.json"))
rng = random.Random(0)
vocab = tok.get_vocab_size()
words = sorted(
    w.lstrip("\u2581\u0120") for w in tok.get_vocab() if _re.fullmatch("[\u2581\u0120][a-z]{3,}", w)
)
system_text = " ".join(rng.choice(words) for _ in range(1100))


def prompt_text():
    return system_text + "\nUser: " + " ".join(rng.choice(words) for _ in range(70))


def ttft(client, url, body):
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]" and first is None:
                assert '"error"' not in line, line[:300]
                first = (time.perf_counter() - t0) * 1e3
    return first


with serve_dynamo_engine(
    engine, DynamoOptions(workers=1, grace_period_s=1.0, overrides={"scheduler": {"max_batch_size": 32}})
) as L:
    model = L.spec.served_model_name or EngineDir(engine).recipe().serve.model_name
    front = L.url + "/completions"
    direct = f"http://127.0.0.1:{L.spec.frontend_port}/v1/completions"
    res = {"front text": [], "direct text": [], "front ids": [], "direct ids": []}
    lens = []
    with httpx.Client(timeout=60) as c:
        for i in range(n + 3):
            for k in res:
                text = prompt_text()
                p = text if k.endswith("text") else [1] + tok.encode(text, add_special_tokens=False).ids
                if k == "front ids":
                    lens.append(len(p))
                body = {"model": model, "prompt": p, "max_tokens": 4, "stream": True, "temperature": 0}
                v = ttft(c, direct if k.startswith("direct") else front, body)
                if i == 0:
                    print(k, "first", round(v, 1))
                if i >= 3:
                    res[k].append(v)
    print("prompt tokens", min(lens), max(lens))
    for k, v in res.items():
        print(
            f"{k:12s} TTFT p50 {statistics.median(v):6.1f}  mean {statistics.mean(v):6.1f}  min {min(v):6.1f} ms (n={len(v)})"
        )
