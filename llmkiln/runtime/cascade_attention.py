"""Cascade attention for the OpenVINO runner: the shared prefix of a batch read once per step, not once per row.

OpenVINO's PagedAttention (2026.4) reads every sequence's past from its own block table, so eight requests on
one cached 1500-token system prompt read its keys and values eight times a step (on the Intel Xeon with AMX,
bench-llama-125m bf16: 8 decodes on a shared 1504-token prefix 16.3 ms vs 9.1 ms with a 41-token context —
the prefix's attention is ~45% of the step). `cascade/cascade_attention.cpp` is an OpenVINO extension op with
PagedAttention's inputs and KV cache layout that attends the blocks shared by several sequences once for all of
their query rows (and each sequence's own blocks per row), merged exactly (online softmax in fp32).

`extension()` compiles it once per machine (g++ against the headers and libraries of the installed `openvino`
wheel, -O3 -march=native) into the cache ($LLMKILN_EXT_CACHE or ~/.cache/llmkiln/ext/<key>/, the key hashing the
source, the compiler, the OpenVINO version and this CPU's flags), atomically; `cascade_model` turns a model that
`paged_attention_transformation` produced into one whose PagedAttentionExtension nodes are CascadeAttention ops
reading and writing the same cache tensors. The runner compiles both graphs and picks one per run
(`OpenVinoPagedRunner`): the cascade graph when sequences share cached blocks, PagedAttention otherwise (its
AMX prefill kernels are far faster on a long prompt of its own).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from llmkiln.cpu_features import CpuFeatures
from llmkiln.env_switch import env_switch
from llmkiln.errors import BadInput, KilnError

SOURCE = Path(__file__).parent / "cascade" / "cascade_attention.cpp"
CACHE_ENV = "LLMKILN_EXT_CACHE"
OP_NAME = "CascadeAttention"
PA_INPUTS = (
    10  # q, k, v, key_cache, value_cache, past_lens, subsequence_begins, block_indices, ..._begins, scale
)


class ExtensionBuildFailed(KilnError):
    """The cascade attention extension could not be compiled (no C++ compiler, or it failed)."""


def _ov_dir() -> Path:
    return Path(ov.__file__).parent


def _library(name: str) -> Path:
    """The installed wheel's shared library `name` (libopenvino.so.NNNN: the wheel has no unversioned link)."""
    libs = sorted((_ov_dir() / "libs").glob(f"{name}.so*"))
    if not libs:
        raise ExtensionBuildFailed(f"{_ov_dir() / 'libs'}: no {name}.so* in the installed openvino wheel")
    return libs[0]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str:
    wanted = os.environ.get("CXX")
    cxx = shutil.which(wanted) if wanted else shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise ExtensionBuildFailed(
            f"cascade attention needs a C++ compiler to build its OpenVINO extension once "
            f"({'$CXX=' + wanted + ' is not one' if wanted else 'no g++ or c++ on PATH'}: `apt-get install g++`); "
            "or turn it off: kv_cache.cascade: false (or $LLMKILN_CASCADE=0)"
        )
    return cxx


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "llmkiln" / "ext")


def source_flags() -> list[str]:
    """What compiling SOURCE needs whatever the target: the language standard, position-independent code and
    OpenVINO's headers (extension() adds -march=native and the libraries; the test compiling the op for each CPU
    kind adds that kind's instruction-set flags)."""
    return ["-std=c++17", "-fPIC", f"-I{_ov_dir() / 'include'}"]


def extension(flags: tuple[str, ...] = ()) -> Path:
    """The compiled extension (built on first use, then reused). `flags`: more compiler flags, part of the cache key
    (tests: the AMX path built on software tiles, tests/runtime/test_cascade_attention.py) — the flags' text only,
    not a file one names: such a build gets a cache folder of its own ($LLMKILN_EXT_CACHE)."""
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(
        b"\0".join(
            x.encode()
            for x in (
                SOURCE.read_text(encoding="utf-8"),
                cxx,
                version,
                ov.get_version(),
                _cpu_flags(),
                *flags,
            )
        )
    ).hexdigest()[:16]
    out = cache_dir() / key / "libllmkiln_cascade.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        cmd = [
            cxx,
            "-O3",
            "-march=native",
            *source_flags(),
            *flags,
            "-shared",
            str(SOURCE),
            "-o",
            str(built),
            str(_library("libopenvino")),
            str(_library("libtbb")),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ExtensionBuildFailed(
                f"compiling {SOURCE.name} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}"
            )
        os.replace(built, out)
    return out


ENV = "LLMKILN_CASCADE"  # 0 / 1: override the recipe's kv_cache.cascade (A/B measurements)
MIN_SHARED_TOKENS = 64  # a shared run shorter than this is attended per sequence


@dataclass(frozen=True)
class Routing:
    """When a run with shared blocks goes on the cascade graph rather than PagedAttention's (`worth_it`). The op
    attends each sequence's own keys on AVX-512 (AMX, where the CPU has it, only for the shared blocks), so what it
    loses on own work and what it saves on shared keys differ by CPU and by the caches' precision: each set is
    measured with experiments.cascade_steps on that kind of CPU (`source`)."""

    # (query token x own key) pairs of the run's prompts and drafts: more go to PagedAttention, whose prefill is
    # faster on long own parts
    max_own_work: int
    # decodes read their own keys once either way; the cascade saves re-reading a group's shared keys per member:
    # a run whose decodes bring more own keys than this share of the keys it saves keeps PagedAttention
    max_own_decode_share: float
    source: str

    def describe(self) -> str:
        """For the runner's runtime settings (engine report, /metrics)."""
        return (
            f"cascade where the run's own work is at most {self.max_own_work} query x key pairs and its decodes' "
            f"own keys at most {self.max_own_decode_share:g} x the shared keys saved ({self.source})"
        )


# bf16 caches on AMX (Intel Xeon): bench-ov-bf16, 8 decodes on a 1504-token shared prefix with 500 own tokens each
# (own / saved 0.38) 0.95x paged, 1000 each (0.76) 1.02x, nothing shared 1.34x; a 512-token prompt of its own
# beside 7 decodes 1.17-1.35x (bench/results/cascade-attention)
AMX_BF16 = Routing(64 * 1024, 0.6, "measured on an Intel Xeon with AMX, bf16")
# bf16 caches without AMX (AMD EPYC Zen 5; bench-ov-bf16 and smollm2-ov-bf16, two runs each): the decodes' own
# pass gains there too — 8 decodes with 1000 / 2000 / 4000 own tokens each (own / saved 0.76 / 1.52 / 3.04)
# 0.81-0.91 / 0.93-0.97 / 0.93-1.02x paged, 6000 (4.56) 0.98-1.02x; in paired in-process rounds 1000-1500-token
# turns on the shared prefix, c=8: ITL p50 0.87-0.91x, tok/s level, against the Xeon's limit. The pair limit stays:
# a prompt of its own beside 7 decodes loses from ~160 tokens (192: 1.02-1.07x), but a lower limit also sent
# c=32's runs of two turns on the prefix beside ~30 decodes to PagedAttention: 0.97x tok/s
# (bench/results/cpu-speed-zen5/cascade-routing)
AVX512_BF16 = Routing(64 * 1024, 2.5, "measured on an AMD EPYC Zen 5 without AMX, bf16")
# fp32 caches (the op's fp32 path is AVX-512 FMAs on every CPU, as OpenVINO's fp32 kernels are): the Xeon's limits
# hold on the Zen 5 — 8 decodes with 500 / 1000 / 2000 own tokens each 0.90-1.01 / 1.00-1.01 / 1.08-1.14x
FP32 = Routing(64 * 1024, 0.6, "measured on an Intel Xeon (bf16) and an AMD EPYC Zen 5 (fp32)")
ALWAYS = Routing(10**12, 1e12, "every run with shared blocks")  # tests: compare the op with PagedAttention


# another kind's limits on this CPU (A/B measurements): one of BY_NAME's keys
ROUTING_ENV = "LLMKILN_CASCADE_ROUTING"
BY_NAME = {"amx-bf16": AMX_BF16, "avx512-bf16": AVX512_BF16, "fp32": FP32}


def routing(cpu: CpuFeatures, bf16_caches: bool) -> Routing:
    """The limits for this CPU and the caches' precision ($LLMKILN_CASCADE_ROUTING names others)."""
    name = os.environ.get(ROUTING_ENV, "").strip()
    if name:
        if name not in BY_NAME:
            raise BadInput(f"${ROUTING_ENV}={name!r}: choose one of {', '.join(BY_NAME)} (or unset it)")
        return BY_NAME[name]
    if not bf16_caches:
        return FP32
    return AMX_BF16 if cpu.amx else AVX512_BF16


FAST_HEAD_SIZES = (64, 128)  # the op's AVX-512 / AMX kernels; other sizes take its portable loops (slow)


def unsupported(cpu: CpuFeatures, head_dim: int) -> str | None:
    """Why the op would not pay on this CPU and model (None: it does). Its kernels are AVX-512 with bf16 dot
    products (AMD Zen 4/5, Intel Cooper Lake and later) and AMX tiles where the CPU has them (Intel Sapphire
    Rapids and later); elsewhere they fall back to portable loops, slower than OpenVINO's PagedAttention."""
    if not cpu.avx512_bf16:
        return f"this CPU ({cpu.model}, {cpu.kind}) has no AVX512-BF16: the op's fast kernels need it"
    if head_dim not in FAST_HEAD_SIZES:
        return f"head size {head_dim}: the op's fast kernels take {' or '.join(map(str, FAST_HEAD_SIZES))}"
    return None


def from_env(recipe_value: bool) -> bool:
    """The recipe's kv_cache.cascade, unless $LLMKILN_CASCADE says on or off (llmkiln.env_switch)."""
    return env_switch(ENV, recipe_value)


def shared_tokens(
    seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]], block_size: int
) -> list[int]:
    """Per sequence (id, new tokens, past, block table): how many of its past tokens the cascade op attends in
    its group's shared pass (the same rule as the op: sequences whose tables start with the same full past blocks,
    at least MIN_SHARED_TOKENS of them)."""
    return _per_sequence(_groups(seqs, block_size), len(seqs))


def _per_sequence(groups: list[tuple[list[int], int]], n: int) -> list[int]:
    """Each of n sequences' shared past tokens in `groups` (0: in none)."""
    out = [0] * n
    for members, tokens in groups:
        for i in members:
            out[i] = tokens
    return out


def _groups(
    seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]], block_size: int
) -> list[tuple[list[int], int]]:
    """The op's shared groups: (member indexes, shared past tokens), groups of two or more only."""
    by_first: dict[int, list[int]] = {}
    for i, (_, _, past, table) in enumerate(seqs):
        if past >= block_size and table:
            by_first.setdefault(table[0], []).append(i)
    out = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        full = min(seqs[i][2] // block_size for i in members)
        lcp = len(os.path.commonprefix([seqs[i][3][:full] for i in members]))
        if lcp * block_size >= max(MIN_SHARED_TOKENS, block_size):
            out.append((members, lcp * block_size))
    return out


def worth_it(
    seqs: list[tuple[str, tuple[int, ...], int, tuple[int, ...]]], block_size: int, limits: Routing
) -> bool:
    """Run this plan on the cascade graph: some sequences share blocks, the rest of the work is small, and the
    decodes' own keys are few beside the shared keys the cascade does not read again (`limits`: `routing()`)."""
    groups = _groups(seqs, block_size)
    if not groups:
        return False
    shared = _per_sequence(groups, len(seqs))
    own = sum(  # the rows of prompts and drafts (decodes: max_own_decode_share)
        len(toks) * (past + len(toks) - sh)
        for (_, toks, past, _), sh in zip(seqs, shared, strict=True)
        if len(toks) > 1
    )
    if own > limits.max_own_work:
        return False
    saved = sum((len(members) - 1) * tokens for members, tokens in groups)
    own_decode = sum(
        past + 1 - sh for (_, toks, past, _), sh in zip(seqs, shared, strict=True) if len(toks) == 1
    )
    return own_decode <= limits.max_own_decode_share * saved


def cascade_model(
    model: ov.Model,
    ext: Path,
    cache_type: ov.Type,
    kv_heads: int,
    block_size: int,
    head_dim: int,
    min_shared: int = MIN_SHARED_TOKENS,
) -> int:
    """Replace every PagedAttentionExtension of `model` (in place) with a CascadeAttention op on the same inputs,
    and give the cache parameters their element type and [blocks, kv_heads, block_size, head_dim] shape (the
    runner's pools). Returns how many it replaced."""
    from openvino.utils.node_factory import NodeFactory

    factory = NodeFactory()
    factory.add_extension(str(ext))
    n = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "PagedAttentionExtension":
            continue
        inputs = [op.input_value(i) for i in range(PA_INPUTS)]
        for cache in inputs[3:5]:
            param = cache.get_node()
            param.set_element_type(cache_type)
            param.set_partial_shape(ov.PartialShape([-1, kv_heads, block_size, head_dim]))
            param.validate_and_infer_types()
        node = factory.create(OP_NAME, inputs, {"min_shared_tokens": min_shared})
        node.set_friendly_name(op.get_friendly_name())
        op.output(0).replace(node.output(0))
        n += 1
    model.validate_nodes_and_infer_types()
    return n
