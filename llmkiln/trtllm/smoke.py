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

- `options FILE --model DIR`: FILE (llm_api_options.yaml or Dynamo's llm_api.yaml) through the installed
  TensorRT-LLM the way its consumers read it (`update_llm_args_with_extra_options`, then `TorchLlmArgs(**args)`):
  nested keys, enums and the speculative_config union are validated by TensorRT-LLM itself; prints the pydantic
  error and exits 1 if it rejects anything.
- `speculative ENGINE --out DIR`: the LLM API on ENGINE's checkpoint twice, without and with the recipe's
  speculative_config: output tokens/s, and the acceptance rate (accepted / drafted tokens, from the iteration
  stats' specDecodingStats) of the speculative run. Writes DIR/<time>-<recipe>-speculative.json. GPU host only.
  Exit 1 unless the speculative run drafted tokens (drafted > 0): a run that drafted nothing measured no
  speculation (the config was dropped, or iteration stats were off) and proves nothing.
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


def read_options(path: Path, model: Path) -> dict[str, Any]:
    """LLM(**kwargs) as trtllm-serve --extra_llm_api_options and dynamo.trtllm --extra-engine-args build them."""
    import yaml

    try:
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_options
    except ImportError:  # a TensorRT-LLM without the helper: the file's keys as they are
        return {"model": str(model)} | (yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    return dict(update_llm_args_with_extra_options({"model": str(model)}, str(path)))


def validate_options(path: Path, model: Path) -> str | None:
    """None when the installed TorchLlmArgs accepts the file, else its error (pydantic's text)."""
    from tensorrt_llm.llmapi import TorchLlmArgs

    try:
        TorchLlmArgs(**read_options(path, model))
    except Exception as exc:  # pydantic.ValidationError, or a validator's ValueError/AssertionError
        return f"{type(exc).__name__}: {exc}"
    return None


SPEC_PROMPTS = (
    "Repeat the following list exactly, twice: red, orange, yellow, green, blue, indigo, violet.",
    "Copy this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Count from one to thirty in words, separated by commas.",
    "Write the alphabet in capital letters, each letter followed by a comma.",
)


def _spec_counts(stats: list[Any]) -> tuple[int, int]:
    """(drafted, accepted) tokens summed over iteration stats (dicts or JSON strings, TensorRT-LLM's names)."""
    drafted = accepted = 0
    for item in stats:
        it = json.loads(item) if isinstance(item, str) else item
        spec = it.get("specDecodingStats") or {}
        drafted += int(spec.get("numDraftTokens", 0))
        accepted += int(spec.get("numAcceptedTokens", 0))
    return drafted, accepted


def measure_speculative(engine: Path, max_tokens: int = 128, repeats: int = 4) -> dict[str, Any]:
    """Output tokens/s without and with speculative_config, and the acceptance rate with it (GPU host)."""
    from tensorrt_llm import LLM, SamplingParams

    opts = read_options(engine / "llm_api_options.yaml", engine / "hf_checkpoint")
    if not opts.get("speculative_config"):
        raise KilnError(
            f"{engine}/llm_api_options.yaml has no speculative_config: the recipe needs a speculative: section"
        )
    prompts = list(SPEC_PROMPTS) * repeats
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    runs: dict[str, Any] = {}
    for label in ("without", "with"):
        kwargs = dict(opts) | {"enable_iter_perf_stats": True}
        if label == "without":
            kwargs.pop("speculative_config")
        llm = LLM(**kwargs)
        try:
            llm.generate(prompts[:2], params)  # warm: CUDA graphs, autotuner
            llm.get_stats(timeout=2)  # drop the warmup's iteration stats
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            seconds = time.perf_counter() - t0
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            drafted, accepted = _spec_counts(llm.get_stats(timeout=2))
        finally:
            llm.shutdown()
        runs[label] = {
            "output_tokens": tokens,
            "seconds": round(seconds, 4),
            "output_tokens_per_s": round(tokens / seconds, 2),
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        }
    runs["speedup"] = round(runs["with"]["output_tokens_per_s"] / runs["without"]["output_tokens_per_s"], 3)
    spec = opts["speculative_config"]  # a dict (1.3: validated later) or already a config object (1.2.1)
    runs["speculative_config"] = dict(spec) if isinstance(spec, dict) else repr(spec)
    return runs


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
    o = sub.add_parser("options")
    o.add_argument("file", type=Path)
    o.add_argument("--model", type=Path, required=True)
    sp = sub.add_parser("speculative")
    sp.add_argument("engine", type=Path)
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    if args.cmd == "options":
        error = validate_options(args.file, args.model)
        if error:
            print(
                f"FAILED: {args.file}: the installed TensorRT-LLM rejects these options:\n{error}",
                file=sys.stderr,
            )
            return 1
        print(f"{args.file}: accepted by the installed TorchLlmArgs")
        return 0
    if args.cmd == "speculative":
        return _speculative(args.engine, args.out, args.max_tokens)
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


def speculative_problems(result: dict[str, Any]) -> list[str]:
    """Why a measure_speculative result proves nothing about speculation (empty: it does)."""
    spec = result["with"]
    if spec["drafted_tokens"] <= 0:
        return [
            f"the speculative run drafted no tokens (drafted {spec['drafted_tokens']}, accepted "
            f"{spec['accepted_tokens']}): speculative_config {result.get('speculative_config')!r} was not "
            "in effect, or the iteration stats carry no specDecodingStats"
        ]
    return []


def _speculative(engine: Path, out: Path, max_tokens: int) -> int:
    result = measure_speculative(engine, max_tokens) | {
        "engine": str(engine),
        "machine": machine(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    result["problems"] = speculative_problems(result)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{engine.name}-speculative.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    w, s = result["without"], result["with"]
    print(f"{path}: {w['output_tokens_per_s']} -> {s['output_tokens_per_s']} output tok/s "
          f"(x{result['speedup']}), acceptance rate {s['acceptance_rate']} "
          f"({s['accepted_tokens']} accepted / {s['drafted_tokens']} drafted)")  # fmt: skip
    for problem in result["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except KilnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
