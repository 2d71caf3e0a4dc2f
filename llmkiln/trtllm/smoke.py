"""The checks scripts/gpu_verify.sh runs against a served TensorRT-LLM model (python -m llmkiln.trtllm.smoke).

- `versions RECIPE`: the host against the pins and the recipe (llmkiln.trtllm.host; exit 3 on a mismatch).
- `probe --url URL --kind engine|llmapi|cpu --recipe RECIPE --out DIR`: over Triton's HTTP generate_stream,
  (1) the first request that starts with the recipe's warmup prefix must already reuse KV blocks: only the
  warmup, run before READY, can have put them there; (2) per round, a fresh long prefix (the recipe prefix behind
  a unique tag) is sent twice with different questions: the first is the cold request (its time to first
  token), the second must reuse KV blocks (> 0, from the model's kv_cache_reused_block(s) output) and is the
  warm one. Writes cold vs warm TTFT, every sample and the machine into DIR/<time>-<recipe>.json. Exit 1 when
  a check fails. No timing assertion: the times are recorded, not judged.

`kind` picks the model's I/O: the tensorrtllm ensemble, the llmapi model, or llmkiln's CPU model (same names as
the ensemble; used to test this module on a CPU host).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

from llmkiln.errors import KilnError
from llmkiln.recipe import load_recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.host import check_host


@dataclass(frozen=True)
class Protocol:
    """A served model's input/output names for a streamed request with perf metrics."""

    model: str
    max_tokens: str
    stream: str
    perf: str
    reused: str


KINDS = {
    "engine": Protocol("ensemble", "max_tokens", "stream", "return_perf_metrics", "kv_cache_reused_blocks"),
    "llmapi": Protocol(
        "tensorrt_llm",
        "sampling_param_max_tokens",
        "streaming",
        "sampling_param_return_perf_metrics",
        "kv_cache_reused_block",
    ),  # fmt: skip
    "cpu": Protocol("llmkiln", "max_tokens", "stream", "return_perf_metrics", "kv_cache_reused_blocks"),
}
QUESTIONS = ("What is the capital of France?", "Name three colors of the rainbow.")


@dataclass
class Sample:
    """One streamed request: time to the first event, to the last, and the KV blocks it reused."""

    ttft_s: float
    total_s: float
    reused_blocks: int
    events: int


def _scalar(value: Any) -> int:
    while isinstance(value, list):
        value = value[0] if value else 0
    return int(float(value))  # the llmapi model sends its perf outputs as strings


def stream(url: str, proto: Protocol, text: str, max_tokens: int, timeout_s: float = 120) -> Sample:
    """POST /v2/models/<model>/generate_stream and read the server-sent events."""
    body = {"text_input": text, proto.max_tokens: max_tokens, proto.stream: True, proto.perf: True}
    req = urllib.request.Request(f"{url}/v2/models/{proto.model}/generate_stream", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})  # fmt: skip
    t0 = time.perf_counter()
    first, reused, events = None, 0, 0
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise KilnError(f"{proto.model}: the server answered with an error: {event['error']}")
            first = first if first is not None else time.perf_counter() - t0
            events += 1
            if event.get(proto.reused) is not None:
                reused = max(reused, _scalar(event[proto.reused]))
    if first is None:
        raise KilnError(f"{proto.model}: no response event for a streamed request")
    return Sample(first, time.perf_counter() - t0, reused, events)


def probe(url: str, kind: str, prefix: str, rounds: int, max_tokens: int = 8) -> dict[str, Any]:
    """The checks of the module docstring; returns the samples and the problems found."""
    proto = KINDS[kind]
    problems = []
    primed = stream(url, proto, prefix + QUESTIONS[0], max_tokens)
    if primed.reused_blocks <= 0:
        problems.append(
            "the first request with the warmup prefix reused no KV blocks: warmup did not prime the cache "
            "before READY"
        )
    cold, warm = [], []
    for _ in range(rounds):
        fresh = f"[session {uuid.uuid4().hex}] {prefix}"
        cold.append(stream(url, proto, fresh + QUESTIONS[0], max_tokens))
        warm.append(stream(url, proto, fresh + QUESTIONS[1], max_tokens))
        if warm[-1].reused_blocks <= 0:
            problems.append(f"round {len(warm)}: the second request with a shared prefix reused no KV blocks")
    return {
        "kind": kind,
        "model": proto.model,
        "rounds": rounds,
        "primed_by_warmup": asdict(primed),
        "cold": [asdict(s) for s in cold],
        "warm": [asdict(s) for s in warm],
        "cold_ttft_median_s": median(s.ttft_s for s in cold) if cold else None,
        "warm_ttft_median_s": median(s.ttft_s for s in warm) if warm else None,
        "problems": problems,
    }


def machine() -> dict[str, Any]:
    """What the results were measured on: nvidia-smi's view of the GPUs, the host, the installed versions."""
    out: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    if shutil.which("nvidia-smi"):
        q = "name,driver_version,memory.total,compute_cap"
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=30, check=False)  # fmt: skip
        out["gpus"] = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    out["pins"] = {k: pins.pin(k) for k in ("container", "tensorrt_llm", "tensorrt")}
    return out


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmkiln.trtllm.smoke")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("versions")
    v.add_argument("recipe")
    p = sub.add_parser("probe")
    p.add_argument("--url", required=True)
    p.add_argument("--kind", choices=sorted(KINDS), required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    recipe, _ = load_recipe(args.recipe)
    if args.cmd == "versions":
        print(json.dumps(asdict(check_host(recipe))))
        return 0
    if not recipe.warmup.prefixes:
        print(f"recipe {recipe.name} has no warmup.prefixes to probe", file=sys.stderr)
        return 2
    result = probe(args.url, args.kind, recipe.warmup.prefixes[0], args.rounds, recipe.warmup.max_tokens)
    result |= {
        "recipe": recipe.name,
        "machine": machine(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{recipe.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{path}: cold TTFT median {result['cold_ttft_median_s']:.4f} s, warm {result['warm_ttft_median_s']:.4f} s, "
          f"reused blocks on the primed request {result['primed_by_warmup']['reused_blocks']}")  # fmt: skip
    for problem in result["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except KilnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
