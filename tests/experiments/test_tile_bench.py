"""bench/results/cpu-speed-zen5/op-softmax/tile_bench.sh, the shared pass's kernel built alone against this
checkout's cascade_attention.cpp (no OpenVINO): it still compiles from the op's source and prints its time and a
finite check value (a probe nothing runs rots)."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from llmkiln.cpu_features import detect

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/results/cpu-speed-zen5/op-softmax/tile_bench.sh"


@pytest.mark.skipif(not detect().avx512_bf16, reason=f"the kernel's AVX512-BF16 path ({detect().model})")
def test_the_kernel_builds_alone_from_the_ops_source_and_runs():
    r = subprocess.run(
        ["bash", str(SCRIPT), str(ROOT), "2", "4"], capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"2 tiles x 4 blocks: ([0-9.]+) us, .* check (\S+)", r.stdout)
    assert m is not None, r.stdout
    assert float(m.group(1)) > 0 and math.isfinite(float(m.group(2)))
