"""The wheel carries the tool, not the project's experiments: no experiments/ files, and no module with an issue's
targets or an experiment's recipe choices (those live in experiments/, beside bench/results)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_the_wheel_has_no_experiments(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(REPO)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("llmkiln-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        modules = {n: z.read(n).decode("utf-8") for n in names if n.endswith(".py")}
    assert "llmkiln/bench/runner.py" in names and "llmkiln/cli/options.py" in names  # the tool is there
    assert "llmkiln/runtime/cascade/cascade_attention.cpp" in names  # built on first use, from the wheel too
    assert not [n for n in names if n.startswith("experiments/") or "/experiments/" in n]
    assert "llmkiln/runtime/torch_runner.py" not in names  # the torch prototype lives in experiments/
    gone = ("summary", "experiment", "scaleout", "tradeoff")
    assert not [n for n in names if n.startswith("llmkiln/bench/") and Path(n).stem in gone]
    for name, text in modules.items():
        assert not ISSUE.search(text), f"{name} names an issue: {ISSUE.search(text).group(0)!r}"
        assert (
            "TARGETS" not in text and "from experiments" not in text and "import experiments" not in text
        ), name
        assert "bench-baseline" not in text, f"{name} hard-codes an experiment's recipe"
