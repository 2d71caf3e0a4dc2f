"""llmkiln.cpu_features: the CPU kinds of this fleet, read from /proc/cpuinfo texts (each kind pretended)."""

from __future__ import annotations

import pytest

from llmkiln.cpu_features import CpuKind, detect, from_cpuinfo

# the flags of the three machines these sessions ran on (trimmed to what matters, order as the kernel lists)
XEON_AMX = (
    "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl "
    "avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8"
)
ZEN5 = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16"
ZEN3 = "fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2"


def cpuinfo(model: str, flags: str, processors: int = 2) -> str:
    block = f"processor\t: {{n}}\nvendor_id\t: x\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    return "".join(block.format(n=n) for n in range(processors))


@pytest.mark.parametrize(
    ("model", "flags", "kind", "bf16"),
    [
        ("Intel(R) Xeon(R) Processor", XEON_AMX, CpuKind.AMX, True),
        ("AMD EPYC 9B45", ZEN5, CpuKind.AVX512_BF16, True),
        ("AMD EPYC 7B13", ZEN3, CpuKind.AVX2, False),
        ("QEMU Virtual CPU", "fpu sse sse2", CpuKind.BASELINE, False),
    ],
)
def test_each_kind_is_recognized(model, flags, kind, bf16):
    cpu = from_cpuinfo(cpuinfo(model, flags), cores=2)
    assert cpu.model == model and cpu.kind is kind and cpu.bf16 is bf16
    d = cpu.describe()
    assert d["kind"] == str(kind) and d["model"] == model and d["cores"] == "2"
    assert d["amx"] == ("1" if kind is CpuKind.AMX else "0")


def test_amx_needs_tiles_and_bf16():
    cpu = from_cpuinfo(cpuinfo("x", "avx2 avx512f amx_int8 amx_tile"))  # AMX int8 only: no bf16 tiles
    assert not cpu.amx and cpu.kind is CpuKind.AVX512


def test_only_the_first_processor_is_read():
    text = cpuinfo("first", ZEN3, 1) + cpuinfo("second", XEON_AMX, 1)
    assert from_cpuinfo(text).model == "first" and from_cpuinfo(text).kind is CpuKind.AVX2


def test_this_machine_is_detected():
    cpu = detect()
    assert cpu.cores >= 1 and cpu.flags and cpu.model != "unknown CPU"
    assert cpu.kind in set(CpuKind)
