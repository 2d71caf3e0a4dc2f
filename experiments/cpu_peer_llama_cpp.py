"""llama.cpp's server (llama-cpp-python) as a served CPU peer of llmkiln's engine, on experiments.cpu_peers'
workload: `python -m experiments.cpu_peer_llama_cpp --model HF_DIR --gguf q4_1=A.gguf --gguf f16=B.gguf --out DIR`.

Run from the main venv (this module uses llmkiln: the workload, the OpenAI client, the reports); the server runs in
the venv of `bash scripts/llama_cpp_env.sh` (default /tmp/llmkiln-llamacpp/venv, `--venv` or
$LLMKILN_LLAMACPP_VENV; llmkiln.bench.llama_cpp_peer starts and stops it). Without that venv the run stops before
anything is measured (exit 2, naming the script).

1. The model: each `--gguf NAME=PATH` (repeated; e.g. q4_1=SmolLM2-135M-Instruct.Q4_1.gguf, f16=... from
   `bash scripts/llama_cpp_gguf.sh HF_DIR OUT.gguf f16`) is one system, `llama-cpp-NAME`, one server after the
   other on the same cores. `--model` is the Hugging Face folder the GGUFs stand for (the checkpoint llmkiln's
   engine is built from): its tokenizer.json builds the workload and is the reference for the token ids.
2. The requests: experiments.cpu_peers' (its CpuPeersConfig gives the sizes, its spec the shared-prefix workload,
   its split_workload the warm-up and per-level slices: one 1500-token system prompt + 80-120 fresh tokens, 32
   output tokens, seed 0, concurrency 1, 4, 8 with 24, 32, 64 requests; the same --concurrency, --requests and
   --warmup give the same requests per level), sent by llmkiln.bench.runner / openai_client as streaming
   completions with the prompt text — what the harness sends every OpenAI server. llama-cpp-python's completions
   take text only (no token-id prompts: llama_cpp_peer's docstring), so before measuring, every prompt of the run
   is tokenized by the running server (/extras/tokenize, the GGUF's vocabulary, the same call its completions
   make) and compared with tokenizer.json's ids as llmkiln's server encodes them (`encode(prompt)`, special tokens
   on: no BOS for SmolLM2, whose GGUF has add_bos_token false too): one difference and the system fails
   (`tokenization` in its summary entry).
3. Per GGUF: start the server (llama_cpp_peer.LlamaCppOptions: 2 threads, n_ctx 8192, logits_all off,
   interrupt_requests off, prompt cache off; `--threads`, `--ctx`, `--flash-attn`, `--prompt-cache` change them),
   ask it the chat check (greedy /v1/chat/completions of "What is the capital of France? Answer in one sentence."
   with the GGUF's chat template and its default system turn: the answer must name Paris, else the system fails),
   check the tokens, warm it (not measured), then the levels in a closed loop.
   Note what the numbers mean: this server runs one request at a time (a global lock, no batching:
   llama_cpp_peer's docstring), so at c > 1 TTFT includes the queue behind the requests ahead, and it reuses the
   previous request's KV for the shared system prompt without a prompt cache.

Results (OUT and OUT/raw as experiments.cpu_peers': default bench/results/cpu-peers and
bench/results/raw/cpu-peers; --quick: bench/results/raw/cpu-peers-quick): OUT/llama-cpp-NAME.json (BenchReport,
schema llmkiln.bench/1), RAW/llama-cpp-NAME.jsonl (per-request records), RAW/logs/llama-cpp-NAME.log (the server's
output), and the systems' entries in OUT/summary.json in cpu_peers' shape (kind "llama-cpp"): added to a cpu_peers
run already in OUT (same model and workload sizes, else exit 2 before anything runs), or a new summary with only
these systems; OUT/SUMMARY.md re-rendered (experiments.cpu_peers_summary). `--quick`: the harness end to end in
well under a minute (short prompts, one level: c=4 with 8 requests; 19 s for two GGUFs here; the numbers mean
little); `--resummarize` measures nothing and re-renders SUMMARY.md.

Notes, measured on the 2-core AMD EPYC VM (AVX2/FMA/F16C, no AVX-512) with SmolLM2-135M-Instruct, llama_cpp.Llama
in-process, 2 threads, 3 interleaved rounds (the ranges) while no other job ran:
- f16 over bf16 (scripts/llama_cpp_gguf.sh writes f16): a 512-token prompt 1124-1399 ms in f16 vs 1475-1806 ms in
  bf16 (~1.3x), decode 17.5-18.9 vs 18.3-20.4 ms/token; this CPU has no bf16 dot product, ggml converts.
- flash attention: no clear result (another job took the cores during the comparison, and every llama.cpp timing
  on this machine moves 3-10x when the 2 cores are shared, OpenMP's threads waiting on each other): off, the
  server's default; `--flash-attn` measures it on an idle machine.
- the prompt cache (`--prompt-cache`): it works (the server logs "cache save" after every request) and never hits
  on this workload (the live context always has the longer prefix: "514 prefix-match hit" without it), so it
  only adds a state copy per request: off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from tokenizers import Tokenizer

from experiments import cpu_peers_summary
from experiments.cpu_peers import LLMKILN_PACKAGES, CpuPeersConfig, lscpu, split_workload
from experiments.cpu_peers_summary import level_metrics, summary_markdown, targets
from llmkiln.bench.llama_cpp_peer import (
    CHECK_ANSWER,
    CHECK_QUESTION,
    LlamaCppOptions,
    LlamaCppServer,
    ask,
    find_venv,
    versions,
)
from llmkiln.bench.peer_server import check_tokenization, require_same_tokens
from llmkiln.bench.report import RunInfo, make_report, print_report, save_records, save_report, write_atomic
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import Workload, build_workload, load_tokenizer
from llmkiln.cli.main import run_command
from llmkiln.errors import BadInput, KilnError
from llmkiln.versions import package_versions

KIND = "llama-cpp"
SYSTEM = "llama-cpp-python"
# its row of experiments.cpu_peers_summary.FRONT_DOORS (the summary renders each system's front door from it)
FRONT_DOOR = cpu_peers_summary.FRONT_DOORS[KIND]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# the workload sizes a summary's systems must share to sit in one table
SIZE_KEYS = ("seed", "system_tokens", "user_tokens", "output_tokens", "levels", "requests", "warmup")


def system_name(name: str) -> str:
    """The report's name: llama-cpp-q4_1, llama-cpp-f16 (beside cpu_peers' vllm-fp32 / vllm-bf16)."""
    return f"llama-cpp-{name}"


def parse_gguf(text: str) -> tuple[str, Path]:
    """'q4_1=/path/model.gguf' -> ('q4_1', Path); BadInput naming the form otherwise."""
    name, sep, path = text.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not NAME_RE.match(name) or not path:
        raise BadInput(
            f"--gguf {text!r}: give NAME=PATH, e.g. q4_1=/models/SmolLM2-135M-Instruct.Q4_1.gguf "
            "(NAME: letters, digits, '_', '.', '-')"
        )
    return name, Path(path)


@dataclass(frozen=True)
class PeerConfig:
    """Sizes of the run: experiments.cpu_peers' (CpuPeersConfig: the same defaults and options, so the same
    arguments give the same requests per level; --quick here is one level, c=4 with 8 requests), plus the
    server's settings. The full defaults take about 2-3 minutes per GGUF on 2 idle cores (SmolLM2-135M: 8 warm-up
    and 120 measured requests, which the server runs one after the other, ~1 s each)."""

    sizes: CpuPeersConfig = field(default_factory=CpuPeersConfig)
    model: Path = Path()  # the Hugging Face folder (tokenizer.json)
    ggufs: tuple[tuple[str, Path], ...] = ()
    venv: Path | None = None  # None: $LLMKILN_LLAMACPP_VENV or /tmp/llmkiln-llamacpp/venv
    threads: int = 2
    n_ctx: int = 8192
    flash_attn: bool = False
    prompt_cache: bool = False
    ready_timeout_s: float = 300.0

    @property
    def out_dir(self) -> Path:
        return Path(self.sizes.out_dir)

    @property
    def raw_dir(self) -> Path:
        return Path(self.sizes.raw_dir)

    @classmethod
    def make(
        cls,
        model: Path,
        ggufs: tuple[str, ...] = (),
        quick: bool = False,
        out_dir: Path | None = None,
        concurrency: str | None = None,
        requests: str | None = None,
        warmup: int | None = None,
        venv: Path | None = None,
        threads: int = 2,
        n_ctx: int = 8192,
        flash_attn: bool = False,
        prompt_cache: bool = False,
    ) -> PeerConfig:
        if quick and concurrency is None:
            concurrency = "4"  # one level; cpu_peers' quick sizes give it 8 requests
        sizes = CpuPeersConfig.make(
            quick=quick, out_dir=out_dir, concurrency=concurrency, requests=requests, warmup=warmup
        )
        parsed = tuple(parse_gguf(g) for g in ggufs)
        names = [n for n, _ in parsed]
        if len(set(names)) != len(names):
            raise BadInput(f"--gguf: names must be distinct, got {', '.join(names)}")
        if threads <= 0 or n_ctx <= 0:
            raise BadInput(f"--threads {threads} / --ctx {n_ctx}: give positive numbers")
        need = sizes.system_tokens + sizes.user_tokens[1] + sizes.output_tokens
        if n_ctx < need:
            raise BadInput(f"--ctx {n_ctx}: the workload's longest request needs {need} positions")
        return cls(
            sizes=sizes,
            model=Path(model),
            ggufs=parsed,
            venv=venv,
            threads=threads,
            n_ctx=n_ctx,
            flash_attn=flash_attn,
            prompt_cache=prompt_cache,
        )

    def options(self, gguf: Path) -> LlamaCppOptions:
        return LlamaCppOptions(
            gguf=Path(gguf),
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_ctx=self.n_ctx,
            flash_attn=self.flash_attn,
            cache=self.prompt_cache,
        )

    def command(self) -> str:
        """The command line that repeats this run."""
        s = self.sizes
        args = ["python", "-m", "experiments.cpu_peer_llama_cpp", "--out", str(self.out_dir)]
        if s.quick:
            args.append("--quick")
        args += ["--model", str(self.model)]
        for name, path in self.ggufs:
            args += ["--gguf", f"{name}={path}"]
        args += ["--concurrency", ",".join(map(str, s.levels)), "--requests", ",".join(map(str, s.requests))]
        args += ["--warmup", str(s.warmup), "--threads", str(self.threads), "--ctx", str(self.n_ctx)]
        if self.flash_attn:
            args.append("--flash-attn")
        if self.prompt_cache:
            args.append("--prompt-cache")
        if self.venv is not None:
            args += ["--venv", str(self.venv)]
        return shlex.join(args)


# ---------------------------------------------------------------------------------------------------------------
# The summary


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _config_doc(cfg: PeerConfig) -> dict[str, Any]:
    doc = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg.sizes).items()}
    doc["llama_cpp"] = {
        "model": str(cfg.model),
        "ggufs": {n: str(p) for n, p in cfg.ggufs},
        "threads": cfg.threads,
        "n_ctx": cfg.n_ctx,
        "flash_attn": cfg.flash_attn,
        "prompt_cache": cfg.prompt_cache,
    }
    return doc


def new_summary(cfg: PeerConfig) -> dict[str, Any]:
    """A summary.json in experiments.cpu_peers' shape with no systems yet (versions and machine filled later)."""
    return {
        "config": _config_doc(cfg),
        "command": cfg.command(),
        "machine": {},
        "versions": {},
        "model": str(cfg.model),
        "systems": {},
    }


def base_summary(cfg: PeerConfig) -> dict[str, Any]:
    """OUT/summary.json when it holds a run on the same model and workload sizes (this run's systems join it),
    a new summary when there is none; BadInput when it is another model's or another workload's (one table must
    compare like with like) — checked before anything is started."""
    saved = cfg.out_dir / "summary.json"
    if not saved.is_file():
        return new_summary(cfg)
    summary = json.loads(saved.read_text(encoding="utf-8"))
    theirs = summary.get("model")
    if theirs is None or Path(theirs).resolve() != Path(cfg.model).resolve():
        raise BadInput(
            f"{saved} is a run on {theirs}, this one is on {cfg.model}: give another --out (one summary, one model)"
        )
    mine = asdict(cfg.sizes)
    differ = [k for k in SIZE_KEYS if _norm(summary.get("config", {}).get(k)) != _norm(mine[k])]
    if differ:
        raise BadInput(
            f"{saved} was measured with other workload sizes ({', '.join(differ)}): run with the same "
            "--quick/--concurrency/--requests/--warmup, or give another --out"
        )
    return summary


def _norm(v: Any) -> Any:
    return list(v) if isinstance(v, tuple | list) else v


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    """summary.json (with the targets) and SUMMARY.md in `out`."""
    summary["targets"] = targets(summary)
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "SUMMARY.md", summary_markdown(summary))
    return out / "SUMMARY.md"


def resummarize(out: Path) -> Path:
    saved = out / "summary.json"
    if not saved.is_file():
        raise BadInput(
            f"{saved}: no finished run there to summarize; run `python -m experiments.cpu_peer_llama_cpp`"
        )
    return write_summary(out, json.loads(saved.read_text(encoding="utf-8")))


# ---------------------------------------------------------------------------------------------------------------
# One GGUF


def all_prompts(warm: Workload, levels: dict[int, Workload]) -> list[str]:
    """Every prompt the run sends, warm-up first (the tokenization check covers them all)."""
    return [r.prompt for r in warm.requests] + [r.prompt for wl in levels.values() for r in wl.requests]


def _bench(
    url: str, model: str, wl: Workload, c: int, label: str, sizes: CpuPeersConfig
) -> tuple[Any, list[RequestRecord]]:
    bench = BenchConfig(
        url=url,
        model=model,
        workload=wl,
        concurrency=(c,),
        requests_per_level=len(wl.requests),
        label=label,
        timeout_s=sizes.timeout_s,
        ready_timeout_s=60.0,
        api="completions",
        seed=sizes.seed,
        progress=sys.stderr.isatty(),
    )
    report, records = run_bench(bench)
    return report, records[c]


def chat_check(url: str, model: str) -> dict[str, Any]:
    answer = ask(url, model, CHECK_QUESTION)
    return {"question": CHECK_QUESTION, "answer": answer, "ok": CHECK_ANSWER.lower() in answer.lower()}


def run_gguf(
    cfg: PeerConfig,
    name: str,
    gguf: Path,
    tok: Tokenizer,
    warm: Workload,
    levels: dict[int, Workload],
    console: Console,
) -> dict[str, Any]:
    """Serve one GGUF, check it, warm it, measure every level; its summary entry (with `error` when it failed)."""
    system = system_name(name)
    entry: dict[str, Any] = {
        "kind": KIND,
        "recipe": None,
        "precision": name,
        "gguf": str(gguf),
        "gguf_sha256": _sha256(gguf),
        "levels": {},
        "loadavg_before": _loadavg(),
    }
    console.rule(f"{system}: load average {entry['loadavg_before']}")
    records: dict[int, list[RequestRecord]] = {}
    level_reports = []
    try:
        opts = cfg.options(gguf)
        with LlamaCppServer(opts, cfg.venv, log_dir=cfg.raw_dir / "logs", name=system) as server:
            server_opts = {k: v for k, v in asdict(server.opts).items() if k not in ("extra_env",)}
            entry.update(
                ready_s=server.ready_s,
                url=server.url,
                api="completions",
                model=server.model,
                command=shlex.join(server.proc.command),
                log=str(server.proc.log_path),
                settings={k: (str(v) if isinstance(v, Path) else v) for k, v in server_opts.items()},
            )
            console.print(f"{system}: ready in {server.ready_s or 0:.1f} s at {server.url}")
            entry["chat_check"] = chat_check(server.url, server.model)
            console.print(f"  chat check: {entry['chat_check']['answer']!r}")
            if not entry["chat_check"]["ok"]:
                raise KilnError(f"{system}: the chat check's greedy answer does not name {CHECK_ANSWER}")
            entry["tokenization"] = check_tokenization(server.tokenize, tok, all_prompts(warm, levels))
            require_same_tokens(entry["tokenization"], "llama.cpp")
            console.print(
                f"  same token ids as tokenizer.json on all {entry['tokenization']['prompts']} prompts"
            )
            top = max(cfg.sizes.levels)
            _bench(
                server.url, server.model, warm, min(top, len(warm.requests)), f"{system} warm-up", cfg.sizes
            )
            for c, wl in levels.items():
                report, recs = _bench(server.url, server.model, wl, c, system, cfg.sizes)
                records[c] = recs
                level_reports.append(report.levels[0])
                entry["levels"][str(c)] = level_metrics(report.levels[0], recs)
                lv = report.levels[0]
                console.print(
                    f"  c={c}: TTFT p50 {lv.ttft_ms.p50 or 0:.0f} ms, ITL p50 {lv.itl_ms.p50 or 0:.1f} ms, "
                    f"{lv.output_token_throughput:.1f} tok/s, {lv.output_tokens_mean:.1f} tokens/request, "
                    f"{lv.num_errors} errors"
                )
            entry["loadavg_after"] = _loadavg()
    except (KilnError, OSError) as exc:  # one broken GGUF must not lose the others' results
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        entry.setdefault("loadavg_after", _loadavg())
        console.print(f"[red]{system} failed: {entry['error']}[/red]")
    if records:
        run = RunInfo(
            label=system,
            system=SYSTEM,
            url=entry.get("url"),
            model=entry.get("model"),
            workload=warm.describe(),
            mode="warm",
            warmup_requests=len(warm.requests),
            requests_per_level=max(len(wl.requests) for wl in levels.values()),
            api="completions",
            extra={k: v for k, v in entry.items() if k != "levels"},
        )
        report = make_report(run, level_reports, records)
        print_report(report, console)
        save_report(report, cfg.out_dir / f"{system}.json")
        save_records(records, cfg.raw_dir / f"{system}.jsonl")
    return entry


# ---------------------------------------------------------------------------------------------------------------
# The run


def run_peer(cfg: PeerConfig, console: Console | None = None) -> tuple[Path, dict[str, Any]]:
    """Every --gguf, one after the other; OUT/summary.json (after each) and SUMMARY.md."""
    console = console or Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    if not cfg.ggufs:
        raise BadInput("give at least one --gguf NAME=PATH")
    for _, path in cfg.ggufs:
        if not path.is_file():
            raise BadInput(f"--gguf {path}: no such file")
    venv = find_venv(cfg.venv)  # before anything is measured: exit 2 naming scripts/llama_cpp_env.sh
    tok = load_tokenizer(cfg.model)
    summary = base_summary(cfg)  # a mismatching OUT/summary.json stops the run here
    t0 = time.perf_counter()
    if not summary["machine"]:
        summary["machine"] = lscpu() | {"loadavg_start": _loadavg()}
    summary["versions"].setdefault(
        "llmkiln", {"python": sys.version.split()[0], **package_versions(LLMKILN_PACKAGES)}
    )
    summary["versions"]["llama-cpp"] = versions(venv)
    summary.setdefault("commands", {})[KIND] = cfg.command()
    warm, levels = split_workload(
        build_workload(tok, cfg.sizes.spec()), cfg.sizes.warmup, cfg.sizes.levels, cfg.sizes.requests
    )
    out = cfg.out_dir
    md = out / "SUMMARY.md"
    for name, path in cfg.ggufs:
        summary["systems"][system_name(name)] = run_gguf(cfg, name, path, tok, warm, levels, console)
        summary["machine"]["loadavg_end"] = _loadavg()
        summary["wall_s"] = round(float(summary.get("wall_s") or 0) + time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        md = write_summary(out, summary)
    return md, summary


@click.command("cpu-peer-llama-cpp", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--model",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The Hugging Face folder the GGUFs stand for (its tokenizer.json builds the workload). Required.",
)
@click.option(
    "--gguf", "ggufs", multiple=True, metavar="NAME=PATH", help="A GGUF to serve (repeat: q4_1=..., f16=...)."
)
@click.option(
    "--out",
    "--out-dir",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Results folder [default: bench/results/cpu-peers; --quick: bench/results/raw/cpu-peers-quick].",
)
@click.option(
    "--quick", is_flag=True, help="The harness end to end in about a minute (one level, c=4, 8 requests)."
)
@click.option("--concurrency", default=None, help="Closed-loop levels [default: 1,4,8; --quick: 4].")
@click.option(
    "--requests", default=None, help="Requests per level, one or one per level [default: 24,32,64]."
)
@click.option(
    "--warmup", type=int, default=None, help="Warm-up requests per GGUF, not measured [default: 8]."
)
@click.option("--threads", type=int, default=2, show_default=True, help="n_threads and n_threads_batch.")
@click.option("--ctx", "n_ctx", type=int, default=8192, show_default=True, help="n_ctx.")
@click.option(
    "--flash-attn/--no-flash-attn", default=False, show_default=True, help="llama.cpp's flash attention."
)
@click.option("--prompt-cache", is_flag=True, help="The server's --cache (RAM prompt cache; off by default).")
@click.option(
    "--venv",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The venv of scripts/llama_cpp_env.sh [default: $LLMKILN_LLAMACPP_VENV or /tmp/llmkiln-llamacpp/venv].",
)
@click.option(
    "--resummarize", "resummarize_only", is_flag=True, help="Measure nothing: re-render SUMMARY.md."
)
def cli(
    model: Path | None,
    ggufs: tuple[str, ...],
    out_dir: Path | None,
    quick: bool,
    concurrency: str | None,
    requests: str | None,
    warmup: int | None,
    threads: int,
    n_ctx: int,
    flash_attn: bool,
    prompt_cache: bool,
    venv: Path | None,
    resummarize_only: bool,
) -> None:
    """llama.cpp's server vs the same workload as experiments.cpu_peers, one system per --gguf.

    \b
    python -m experiments.cpu_peer_llama_cpp --quick --model HF_DIR --gguf q4_1=Q4_1.gguf --gguf f16=F16.gguf
    python -m experiments.cpu_peer_llama_cpp --out bench/results/cpu-peers --model HF_DIR --gguf ...
    python -m experiments.cpu_peer_llama_cpp --resummarize --out bench/results/cpu-peers
    """
    if resummarize_only:
        cfg = PeerConfig.make(Path(), quick=quick, out_dir=out_dir)
        click.echo(f"rewrote {resummarize(cfg.out_dir)} from summary.json")
        return
    if model is None:
        raise BadInput("--model: give the Hugging Face folder the GGUFs stand for (its tokenizer.json)")
    if not ggufs:
        raise BadInput("give at least one --gguf NAME=PATH")
    cfg = PeerConfig.make(
        model,
        ggufs,
        quick,
        out_dir,
        concurrency,
        requests,
        warmup,
        venv,
        threads,
        n_ctx,
        flash_attn,
        prompt_cache,
    )
    path, summary = run_peer(cfg)
    click.echo(f"\nwrote {path}")
    failed = [n for n in (system_name(g) for g, _ in cfg.ggufs) if summary["systems"][n].get("error")]
    if failed:
        raise KilnError(f"systems failed: {', '.join(failed)} (see {path})")


def main(argv: list[str] | None = None) -> None:
    """Exit codes as kiln's: 0 ok, 1 failure, 2 bad input (a missing llama.cpp venv included)."""
    run_command(cli, argv, prog_name="python -m experiments.cpu_peer_llama_cpp")


if __name__ == "__main__":
    main()
