"""Cascade attention (runtime/cascade_attention.py, runtime/cascade/cascade_attention.cpp): the OpenVINO runner
with `cascade=True` gives the logits of OpenVINO's PagedAttention graph on the same plans — shared prefix blocks,
several groups, prompt chunks on a past (every row), decodes, drafted rows, a sequence alone — in fp32 (float
rounding) and bf16 (bf16 rounding), on a head size the fast paths take (64: AVX-512 / AMX where the CPU has them)
and on one they do not (stories260K's 8: the portable loops); the AMX path on software tiles (amx_emulation.h) on
any CPU with AVX512-BF16; the extension is built once and cached; a missing compiler is a clear error; the recipe
field is refused where it would be ignored."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from llmkiln.cpu_features import detect, from_cpuinfo
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe
from llmkiln.runtime import cascade_attention
from llmkiln.runtime import openvino_runner as ov_runner
from tests.conftest import requires_bf16

pytestmark = pytest.mark.slow
BS = 32
# fp32: the same sums in another order; bf16: products rounded to bf16 on both sides, differently
TOL = {"fp32": 1e-5, "bf16": 0.05}

RECIPE = """\
name: cascade-test-ov-fp32
description: gpu-smoke-llama (head size 64) on openvino-cpu, for the cascade attention tests.
extends: _base-cpu
model:
  generated: gpu-smoke-llama
  seed: 0
backend: openvino-cpu
precision: fp32
limits:
  max_input_len: 900
  max_seq_len: 1024
kv_cache:
  tokens_per_block: 32
warmup:
  prompts: []
"""


@pytest.fixture(scope="module")
def smoke_xml(engine_factory, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cascade-recipes")
    recipe = folder / "cascade-test-ov-fp32.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    path = EngineDir(engine_factory(str(recipe))).openvino_model()
    assert path is not None
    return path


@pytest.fixture(scope="module")
def stories_xml(engine_factory) -> Path:
    path = EngineDir(engine_factory("stories-ov-fp32")).openvino_model()
    assert path is not None
    return path


def _pair(xml: Path, precision: str):
    kw = dict(
        num_slots=8, max_len=1024, tokens_per_block=BS, store_max_bytes=0, precision=precision, threads=2
    )
    return ov_runner.OpenVinoPagedRunner(xml, cascade=False, **kw), ov_runner.OpenVinoPagedRunner(
        xml, cascade=True, **kw
    )


def _plans(vocab: int):
    """A conversation of runs over hand-made block tables: a 200-token prefix in blocks 0-5 (+ 8 tokens), three
    sequences on it (each with its own blocks from 10 + 4i), a fourth on a 70-token prefix of its own, then mixed
    runs: prompt chunks on the shared blocks (every row's logits), decodes, drafted decodes, a sequence alone, a
    100-token turn beside the decodes, then that turn's first decode beside the others'."""
    rng = np.random.default_rng(7)
    ids = lambda n: tuple(int(x) for x in rng.integers(3, vocab, n))  # noqa: E731
    shared = tuple(range(6))
    own = {i: tuple(range(10 + 4 * i, 14 + 4 * i)) for i in range(7)}
    table = {f"s{i}": shared + own[i] for i in range(4)}
    table["solo"] = own[4]
    table["q"] = shared + own[5]
    table["r"] = shared + own[6]
    prefix = ids(200)
    pasts = {}
    plans = [[("p", prefix, 0, shared + (40,))]]  # the prefix, once (its partial last block in block 40)
    first = []
    for i in range(
        3
    ):  # each sequence computes the prefix's 8 last tokens and its own prompt in its own blocks
        toks = prefix[192:] + ids(20 + 9 * i)
        first.append((f"s{i}", toks, 192, table[f"s{i}"]))
        pasts[f"s{i}"] = 192 + len(toks)
    plans.append(first)
    plans.append([("solo", ids(70), 0, table["solo"])])
    pasts["solo"] = 70
    for step in range(6):
        run = []
        for sid in ("s0", "s1", "s2", "solo"):
            n = (
                1 + (step + int(sid[-1:] if sid[-1].isdigit() else 0)) % 4 if step % 2 else 1
            )  # drafts: 1-4 rows
            run.append((sid, ids(n), pasts[sid], table[sid]))
            pasts[sid] += n
        if step == 1:  # a new prompt on the shared blocks beside the decodes (every row compared)
            run.append(("q", prefix[192:] + ids(41), 192, table["q"]))
        if step == 3:  # a chunk of 40 more on the new prompt's past
            run.append(("q", ids(40), 192 + 49, table["q"]))
        if step == 5:  # a 100-token turn on the shared blocks (own pass: rows split, causal)
            run.append(("r", prefix[192:] + ids(92), 192, table["r"]))
            pasts["r"] = 192 + 100
        plans.append(run)
    # decodes only; the turn's has 100 keys of its own after the shared blocks (4 blocks: AMX's own pass too)
    plans.append([(sid, ids(1), pasts[sid], table[sid]) for sid in ("s0", "s1", "s2", "r")])
    return plans


def _compare(xml: Path, precision: str, vocab: int, monkeypatch) -> None:
    # every run with shared blocks on the cascade graph
    monkeypatch.setattr(cascade_attention, "routing", lambda cpu, bf16: cascade_attention.ALWAYS)
    pa, cascade = _pair(xml, precision)
    pa.padding.limit = cascade.padding.limit = 0
    assert cascade.cascade_req is not None and pa.cascade_req is None
    worst = 0.0
    for plan in _plans(vocab):
        rows = [len(toks) for _, toks, _, _ in plan]  # every row: prompt positions, drafts
        a, b = pa._run(plan, rows), cascade._run(plan, rows)
        assert a.shape == b.shape
        worst = max(worst, float(np.abs(a - b).max() / max(1.0, np.abs(a).max())))
        assert np.abs(a - b).max() <= TOL[precision] * max(1.0, np.abs(a).max()), (plan[0][0], precision)
        if precision == "fp32":
            assert (a.argmax(-1) == b.argmax(-1)).all()
    assert cascade.cascade_runs >= 7, cascade.cascade_runs  # the shared runs took the cascade graph
    assert cascade.runtime_settings["cascade_attention"] == "on"
    assert cascade.runtime_settings["cascade_routing"] == cascade_attention.ALWAYS.describe()
    print(f"worst relative difference {precision}: {worst:.3g}")
    assert worst > 0.0  # another kernel, not the same graph twice


def test_cascade_gives_paged_attention_logits_fp32_head64(smoke_xml, monkeypatch):
    _compare(smoke_xml, "fp32", 1024, monkeypatch)


@requires_bf16
def test_cascade_gives_paged_attention_logits_bf16_head64(smoke_xml, monkeypatch):
    _compare(smoke_xml, "bf16", 1024, monkeypatch)


AMX_EMULATION = Path(__file__).with_name("amx_emulation.h")


@pytest.mark.skipif(
    not {"avx512bw", "avx512_bf16"} <= detect().flags,
    reason="the op's AMX path is built on its AVX-512 BF16 path (this CPU has no AVX512-BF16)",
)
def test_the_amx_path_gives_paged_attention_logits_on_software_tiles(smoke_xml, monkeypatch, tmp_path):
    # The AMX path (shared pass, prompt rows in 128-query units, decodes on long own pasts) built with its tile
    # instructions in software (amx_emulation.h): checked on every CPU with AVX512-BF16, AMX or not
    monkeypatch.setenv(cascade_attention.CACHE_ENV, str(tmp_path))
    flags = ("-mamx-tile", "-mamx-bf16", "-DLLMKILN_AMX_EMULATED", "-include", str(AMX_EMULATION))
    ext = cascade_attention.extension(flags)
    monkeypatch.setattr(cascade_attention, "extension", lambda: ext)
    products = ctypes.CDLL(str(ext)).llmkiln_amx_emulated_products
    products.restype = ctypes.c_long
    _compare(smoke_xml, "bf16", 1024, monkeypatch)
    assert products() > 0  # the runs took the AMX path


def test_cascade_gives_paged_attention_logits_on_the_portable_path(stories_xml, monkeypatch):
    # stories260K's head size (8) is not one the fast kernels take: the runner leaves the op off there unless told
    monkeypatch.setattr(cascade_attention, "unsupported", lambda cpu, head_dim: None)
    _compare(stories_xml, "fp32", 512, monkeypatch)


def test_the_op_stays_off_where_its_kernels_would_not_pay(stories_xml):
    r = ov_runner.OpenVinoPagedRunner(stories_xml, 2, 256, BS, 0, precision="fp32", threads=1, cascade=True)
    try:
        assert r.cascade_req is None
        assert r.runtime_settings["cascade_attention"].startswith("off (head size 8")
        assert "cascade_routing" not in r.runtime_settings
    finally:
        r.close()
    zen3 = from_cpuinfo("model name : AMD EPYC 7B13\nflags : fpu avx avx2 fma\n")
    assert "no AVX512-BF16" in (cascade_attention.unsupported(zen3, 64) or "")
    assert (
        cascade_attention.unsupported(ZEN5, 64) is None and cascade_attention.unsupported(XEON, 128) is None
    )


ZEN5 = from_cpuinfo("model name : AMD EPYC 9B45\nflags : fpu avx avx2 fma avx512f avx512bw avx512_bf16\n")
XEON = from_cpuinfo("model name : Intel Xeon\nflags : avx2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16\n")


def test_the_routing_limits_follow_the_cpu_and_the_caches_precision():
    """Each CPU kind gets the limits measured on it: AMX's bf16 shared pass on the Xeon, the AVX-512 bf16 path
    on the Zen 5, and the fp32 path (AVX-512 FMAs on both) for fp32 caches."""
    assert cascade_attention.routing(XEON, bf16_caches=True) is cascade_attention.AMX_BF16
    assert cascade_attention.routing(ZEN5, bf16_caches=True) is cascade_attention.AVX512_BF16
    assert cascade_attention.routing(XEON, bf16_caches=False) is cascade_attention.FP32
    assert cascade_attention.routing(ZEN5, bf16_caches=False) is cascade_attention.FP32
    for limits in (cascade_attention.AMX_BF16, cascade_attention.AVX512_BF16, cascade_attention.FP32):
        assert limits.source in limits.describe()


def test_the_environment_names_another_kinds_limits_for_measurements(monkeypatch):
    monkeypatch.setenv(cascade_attention.ROUTING_ENV, "amx-bf16")
    assert cascade_attention.routing(ZEN5, bf16_caches=False) is cascade_attention.AMX_BF16
    monkeypatch.setenv(cascade_attention.ROUTING_ENV, "amx")
    with pytest.raises(
        BadInput, match="LLMKILN_CASCADE_ROUTING='amx': choose one of amx-bf16, avx512-bf16, fp32"
    ):
        cascade_attention.routing(ZEN5, bf16_caches=True)


def test_runs_without_shared_blocks_or_with_much_own_work_keep_paged_attention():
    for limits in (cascade_attention.AMX_BF16, cascade_attention.AVX512_BF16, cascade_attention.FP32):
        seqs = [("a", (1,) * 4, 200, tuple(range(7))), ("b", (1,) * 4, 200, tuple(range(7, 14)))]
        assert cascade_attention.shared_tokens(seqs, BS) == [0, 0]
        assert not cascade_attention.worth_it(seqs, BS, limits)
        shared = [("a", (1,), 200, tuple(range(7))), ("b", (1,), 200, tuple(range(6)) + (20,))]
        assert cascade_attention.shared_tokens(shared, BS) == [192, 192]
        assert cascade_attention.worth_it(shared, BS, limits)
        short = [
            ("a", (1,), 40, (0, 1)),
            ("b", (1,), 40, (0, 2)),
        ]  # one shared block: under MIN_SHARED_TOKENS
        assert cascade_attention.shared_tokens(short, BS) == [0, 0]
        big = [
            *shared,
            ("c", (1,) * 400, 0, tuple(range(30, 43))),
        ]  # a long prompt of its own: PagedAttention
        assert not cascade_attention.worth_it(big, BS, limits)


def _decodes(own: int, n: int = 8) -> list[tuple[str, tuple[int, ...], int, tuple[int, ...]]]:
    """n decodes on a 1504-token shared prefix (47 blocks of 32), each with `own` tokens of its own after it."""
    blocks = -(-(own + 1) // 32)
    prefix = tuple(range(47))
    return [
        (f"s{i}", (1,), 1504 + own, prefix + tuple(range(100 + blocks * i, 100 + blocks * (i + 1))))
        for i in range(n)
    ]


def test_decodes_with_long_histories_of_their_own_keep_paged_attention_where_it_is_faster():
    """8 decodes on a 1504-token shared prefix: the cascade saves 7 x 1504 key reads. On the Xeon (AMX, bf16)
    500 own tokens each (4000 own keys, 0.38 of the saved) still pay (0.95x) and 1000 each (0.76) do not (1.02x);
    on the Zen 5's AVX-512 path (bf16) 2000 each still pay (0.93-0.97x); fp32 caches stop at ~1000 (1.00x)."""
    assert cascade_attention.shared_tokens(_decodes(1000), 32) == [1504] * 8
    amx, zen5, fp32 = cascade_attention.AMX_BF16, cascade_attention.AVX512_BF16, cascade_attention.FP32
    for limits in (amx, zen5, fp32):
        assert cascade_attention.worth_it(_decodes(40), 32, limits)
        assert cascade_attention.worth_it(_decodes(500), 32, limits)
        assert not cascade_attention.worth_it(_decodes(6000), 32, limits)
    for own in (1000, 2000, 3000):
        assert not cascade_attention.worth_it(_decodes(own), 32, amx)
        assert cascade_attention.worth_it(_decodes(own), 32, zen5)
        assert not cascade_attention.worth_it(_decodes(own), 32, fp32)
    assert cascade_attention.worth_it(_decodes(400, 2), 32, amx)  # 2 x 401 own keys vs 1504 saved: 0.53
    assert not cascade_attention.worth_it(_decodes(600, 2), 32, amx)  # 2 x 601 vs 1504: 0.80
    assert cascade_attention.worth_it(_decodes(1500, 2), 32, zen5)  # 2 x 1501 vs 1504: 2.00
    assert not cascade_attention.worth_it(_decodes(2000, 2), 32, zen5)  # 2 x 2001 vs 1504: 2.66


def test_a_long_prompt_of_its_own_goes_to_paged_attention_on_every_cpu():
    """Beside 7 decodes on the shared prefix, a prompt with no shared blocks: 192 tokens stay on the cascade
    graph, 512 go to PagedAttention (1.16-1.35x on the op, Xeon and Zen 5)."""
    cold = tuple(range(3000, 3020))

    def plan(n: int) -> list[tuple[str, tuple[int, ...], int, tuple[int, ...]]]:
        return [*_decodes(40, 7), ("c", (1,) * n, 0, cold)]

    for limits in (cascade_attention.AMX_BF16, cascade_attention.AVX512_BF16, cascade_attention.FP32):
        assert cascade_attention.worth_it(plan(192), 32, limits)
        assert not cascade_attention.worth_it(plan(512), 32, limits)


def test_the_extension_is_built_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(cascade_attention.CACHE_ENV, str(tmp_path))
    first = cascade_attention.extension()
    assert first.is_file() and first.parent.parent == tmp_path
    mtime = first.stat().st_mtime_ns
    assert cascade_attention.extension() == first and first.stat().st_mtime_ns == mtime
    assert not [p for p in first.parent.iterdir() if p != first]  # no temp files left


# Each CPU kind's path of the op, by the instruction sets the compiler is told it has (-march=native builds only
# this machine's: the AMX path would first be compiled on a Xeon).
KIND_FLAGS = {
    "amx-bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
    "avx512-bf16": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"],
    "portable": ["-mavx2", "-mfma"],
}


@pytest.mark.parametrize("kind", sorted(KIND_FLAGS))
def test_every_cpu_kinds_path_of_the_op_compiles_here(kind, tmp_path):
    cxx = cascade_attention._compiler()
    flags = KIND_FLAGS[kind]
    cmd = [cxx, "-O2", "-c", *flags, *cascade_attention.source_flags()]
    probe = subprocess.run([*cmd, "-dM", "-E", str(cascade_attention.SOURCE)], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr[-2000:]
    macros = {line.split()[1] for line in probe.stdout.splitlines() if line.startswith("#define LLMKILN_")}
    assert macros == {"amx-bf16": {"LLMKILN_SIMD", "LLMKILN_AMX"}, "avx512-bf16": {"LLMKILN_SIMD"}}.get(
        kind, set()
    )
    built = subprocess.run(
        [*cmd, str(cascade_attention.SOURCE), "-o", str(tmp_path / "op.o")], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr[-2000:]


def test_without_a_compiler_the_error_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv(cascade_attention.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(cascade_attention.ExtensionBuildFailed, match="kv_cache.cascade: false"):
        cascade_attention.extension()
    assert not list(tmp_path.rglob("*.so"))


def test_the_recipe_field_is_openvino_only():
    base = {"name": "x", "model": {"generated": "tiny-llama"}, "kv_cache": {"cascade": True}}
    with pytest.raises(ValueError, match="cascade"):
        Recipe.model_validate(base)
    ok = Recipe.model_validate(
        {**base, "backend": "openvino-cpu", "kv_cache": {"cascade": True, "tokens_per_block": 32}}
    )
    assert ok.kv_cache.cascade


def test_the_environment_overrides_the_recipe(monkeypatch):
    monkeypatch.delenv(cascade_attention.ENV, raising=False)
    assert cascade_attention.from_env(True) and not cascade_attention.from_env(False)
    monkeypatch.setenv(cascade_attention.ENV, "0")
    assert not cascade_attention.from_env(True)
    monkeypatch.setenv(cascade_attention.ENV, "1")
    assert cascade_attention.from_env(False)


def test_an_engine_without_the_extension_runs_on_paged_attention_and_says_why(smoke_xml, monkeypatch):
    def fail() -> Path:
        raise cascade_attention.ExtensionBuildFailed("no g++ on PATH (test)")

    monkeypatch.setattr(cascade_attention, "extension", fail)
    r = ov_runner.OpenVinoPagedRunner(smoke_xml, 2, 256, BS, 0, precision="fp32", threads=1, cascade=True)
    try:
        assert r.cascade_req is None
        assert r.runtime_settings["cascade_attention"] == "off (no g++ on PATH (test))"
        assert r._run([("a", (5, 6, 7), 0, (0,))], [1]).shape == (1, 1024)
    finally:
        r.close()


def test_a_prompt_graph_takes_the_prompt_runs_and_gives_the_same_logits(smoke_xml, monkeypatch):
    """scheduler.prompt_graph: runs that carry prompt tokens go to compiled copies of their graph (cascade and
    PagedAttention alike), decode-only runs stay on the first ones, and every logit is what one graph gives."""
    monkeypatch.setattr(cascade_attention, "routing", lambda cpu, bf16: cascade_attention.ALWAYS)
    kw = dict(num_slots=8, max_len=1024, tokens_per_block=BS, store_max_bytes=0, precision="fp32", threads=2)
    one = ov_runner.OpenVinoPagedRunner(smoke_xml, cascade=True, **kw)
    two = ov_runner.OpenVinoPagedRunner(smoke_xml, cascade=True, prompt_graph=True, **kw)
    try:
        one.padding.limit = two.padding.limit = 0
        assert two.prompt_req is not None and two.cascade_prompt_req is not None and one.prompt_req is None
        assert (
            two.runtime_settings["prompt_graph"].startswith("on")
            and one.runtime_settings["prompt_graph"] == "off"
        )
        prompt_runs = 0
        for i, plan in enumerate(_plans(1024)):
            prompt = i < 3 or any(sid == "q" for sid, *_ in plan)  # the prefix, the prompts, the chunks of q
            prompt_runs += prompt
            rows = [len(toks) for _, toks, _, _ in plan]
            a, b = one._run(plan, rows, prompt=prompt), two._run(plan, rows, prompt=prompt)
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * max(1.0, float(np.abs(a).max())))
        assert prompt_runs == 5 and two.prompt_runs == prompt_runs and one.prompt_runs == 0
        assert two.cascade_runs == one.cascade_runs >= 7  # the copies took the same graph kinds' runs
    finally:
        one.close()
        two.close()
