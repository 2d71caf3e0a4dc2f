"""The OpenVINO runner's CPU-dependent choices (llmkiln.runtime.openvino_settings), for every CPU kind, and the
avoidance of OpenVINO 2026.4's SIGFPE with one thread on AMX, on the real plugin (in a subprocess: it kills)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmkiln.cpu_features import CpuKind, detect, from_cpuinfo
from llmkiln.runtime.openvino_settings import choose
from tests.test_cpu_features import XEON_AMX, ZEN3, ZEN5, cpuinfo

ROOT = Path(__file__).resolve().parents[2]
KINDS = {
    CpuKind.AMX: from_cpuinfo(cpuinfo("Intel(R) Xeon(R) Processor", XEON_AMX), cores=2),
    CpuKind.AVX512_BF16: from_cpuinfo(cpuinfo("AMD EPYC 9B45", ZEN5), cores=2),
    CpuKind.AVX2: from_cpuinfo(cpuinfo("AMD EPYC 7B13", ZEN3), cores=2),
}
ONE_CORE_AMX = from_cpuinfo(cpuinfo("Intel(R) Xeon(R) Processor", XEON_AMX), cores=1)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("threads", [0, 1, 2])
def test_precision_is_never_left_to_the_plugin(kind, precision, threads):
    s = choose(KINDS[kind], precision, threads)
    props = s.properties()
    t = {"fp32": "f32", "bf16": "bf16"}[precision]
    # OpenVINO would pick bf16 inference and a u8 KV cache on AMX by itself: both always set
    assert props["INFERENCE_PRECISION_HINT"] == t and props["KV_CACHE_PRECISION"] == t
    assert props.get("INFERENCE_NUM_THREADS", 0) == threads
    assert s.effective_threads == (threads or 2)
    # the MLP fusion is turned off only where it crashes: AMX, bf16, one thread
    assert s.unfuse_mlp is (kind is CpuKind.AMX and precision == "bf16" and threads == 1)
    d = s.describe()
    assert d["cpu_kind"] == str(kind) and d["precision"] == precision
    assert d["mlp_fusion"].startswith("off" if s.unfuse_mlp else "auto")
    assert d["weights"] == "checkpoint"  # the runner passes what its IR holds


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_int8_weights_on_amx_with_bf16_compute_are_advised_against(kind, precision):
    s = choose(KINDS[kind], precision, 0, weights="int8")
    slower = kind is CpuKind.AMX and precision == "bf16"  # measured there: 1.2-1.4x slower than bf16 weights
    assert bool(s.warnings) is slower and ("weights_advice" in s.describe()) is slower
    if slower:
        assert "int8 weights run slower than bf16 weights" in s.describe()["weights_advice"]
        assert "weights: int8" in s.warnings[0]  # says what to change
    assert not choose(KINDS[kind], precision, 0).warnings  # checkpoint weights: nothing to advise


def test_int8_weights_are_reported():
    assert choose(KINDS[CpuKind.AVX512_BF16], "bf16", 0, weights="int8").describe()["weights"] == "int8"


def test_one_usable_core_counts_as_one_thread():
    # threads 0 = one per core the process may use: on a one-core worker that is the crashing case too
    assert choose(ONE_CORE_AMX, "bf16", 0).unfuse_mlp
    assert not choose(ONE_CORE_AMX, "fp32", 0).unfuse_mlp


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp16"):
        choose(KINDS[CpuKind.AVX2], "fp16", 0)


def _compile(unfuse: bool, threads: int) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        f"""
        import openvino as ov
        from experiments.openvino_mlp_sigfpe import build_model
        from llmkiln.runtime.openvino_runner import _unfuse_mlp
        model = build_model()
        n = _unfuse_mlp(model) if {unfuse} else 0
        ov.Core().compile_model(model, "CPU", {{"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": {threads}}})
        print("compiled, swish rewritten:", n)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_rewrite_compiles_with_one_thread():
    """On any CPU: the runner's rewrite (Swish with its beta) compiles in bf16 on one thread."""
    r = _compile(unfuse=True, threads=1)
    assert r.returncode == 0 and "swish rewritten: 1" in r.stdout, r.stdout + r.stderr


@pytest.mark.skipif(detect().kind is not CpuKind.AMX, reason=f"needs a CPU with AMX ({detect().model})")
def test_without_the_rewrite_the_plugin_still_crashes_on_amx():
    """The upstream bug the rewrite avoids, still there in the pinned OpenVINO: when this fails, OpenVINO fixed
    it and `unfuse_mlp` can go (llmkiln.runtime.openvino_settings)."""
    r = _compile(unfuse=False, threads=1)
    assert r.returncode == -8, (r.returncode, r.stdout, r.stderr)  # SIGFPE
    assert _compile(unfuse=False, threads=2).returncode == 0


def test_a_callers_compile_properties_go_over_the_choices_and_are_reported():
    # probes add PERF_COUNT or try another KV precision / dynamic-quantization group on the same engine
    s = choose(KINDS[CpuKind.AVX512_BF16], "bf16", 2, extra={"PERF_COUNT": True, "KV_CACHE_PRECISION": "u8"})
    props = s.properties()
    assert props["PERF_COUNT"] is True and props["KV_CACHE_PRECISION"] == "u8"  # over the choice (bf16)
    assert props["INFERENCE_PRECISION_HINT"] == "bf16" and props["INFERENCE_NUM_THREADS"] == 2
    assert s.describe()["compile_extra"] == "KV_CACHE_PRECISION=u8, PERF_COUNT=True"
    plain = choose(KINDS[CpuKind.AVX512_BF16], "bf16", 2)
    assert "PERF_COUNT" not in plain.properties() and "compile_extra" not in plain.describe()
