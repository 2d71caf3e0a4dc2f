"""What this CPU has that the engine's choices depend on: AMX, AVX512-BF16, AVX-512, AVX2 — and its name.

The fleet has more than one kind of machine (an Intel Xeon with AVX512-BF16/FP16 and AMX, an AMD EPYC with
AVX512-BF16 and no AMX, an AMD EPYC with AVX2 only), and the right engine settings differ between them
(llmkiln.runtime.openvino_settings). The features come from the kernel's own list (/proc/cpuinfo `flags`), so a
test can pretend any kind with `from_cpuinfo(text)`; `detect()` reads this machine once. A speed result names
the CPU it was measured on (the bench report's `machine.cpu`), the served engine publishes it on /metrics
(`llmkiln_cpu_features`).
"""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
SETTING_PREFIX = "cpu_"  # a runner's runtime_settings name the CPU's features cpu_<feature> (settings())


class CpuKind(enum.StrEnum):
    """The best matrix path the CPU offers, from best to baseline."""

    AMX = "amx"  # AMX tiles with bf16 (Intel Xeon Sapphire Rapids and later)
    AVX512_BF16 = "avx512-bf16"  # bf16 dot products without AMX (AMD Zen 4/5, Intel Cooper Lake)
    AVX512 = "avx512"  # AVX-512 without bf16 arithmetic
    AVX2 = "avx2"  # AVX2 + FMA only (AMD Zen 2/3, older Intel)
    BASELINE = "baseline"  # none of those


@dataclass(frozen=True)
class CpuFeatures:
    model: str  # "Intel(R) Xeon(R) Processor", "AMD EPYC 9B45", ...
    flags: frozenset[str]
    cores: int  # CPUs this process may run on (its affinity)

    @property
    def amx(self) -> bool:
        return {"amx_tile", "amx_bf16"} <= self.flags

    @property
    def avx512_bf16(self) -> bool:
        return "avx512_bf16" in self.flags

    @property
    def avx512(self) -> bool:
        return "avx512f" in self.flags

    @property
    def avx2(self) -> bool:
        return "avx2" in self.flags

    @property
    def bf16(self) -> bool:
        """bf16 arithmetic in hardware (what a bf16 engine needs)."""
        return self.amx or self.avx512_bf16

    @property
    def kind(self) -> CpuKind:
        if self.amx:
            return CpuKind.AMX
        if self.avx512_bf16:
            return CpuKind.AVX512_BF16
        if self.avx512:
            return CpuKind.AVX512
        if self.avx2:
            return CpuKind.AVX2
        return CpuKind.BASELINE

    def describe(self) -> dict[str, str]:
        """Flat strings, for a report and for metric labels."""
        return {
            "model": self.model,
            "kind": str(self.kind),
            "amx": str(int(self.amx)),
            "avx512_bf16": str(int(self.avx512_bf16)),
            "avx512": str(int(self.avx512)),
            "avx2": str(int(self.avx2)),
            "cores": str(self.cores),
        }

    def settings(self) -> dict[str, str]:
        """describe() as runtime settings: each name prefixed with SETTING_PREFIX (cpu_kind, cpu_amx, ...)."""
        return {f"{SETTING_PREFIX}{k}": v for k, v in self.describe().items()}


def from_cpuinfo(text: str, cores: int = 1) -> CpuFeatures:
    """The features the first processor of a /proc/cpuinfo text lists (every core of a machine lists the same)."""
    model, flags = "unknown CPU", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if key == "" and flags:  # the blank line after the first processor's block
            break
    return CpuFeatures(model=model, flags=flags, cores=cores)


@functools.cache
def detect() -> CpuFeatures:
    """This machine's CPU (read once per process)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return from_cpuinfo(text, cores)
