"""The types hold: mypy over the package (pyproject.toml's [tool.mypy] says which files, how strict, and which
third-party modules have no type information), with the tests' stand-in engine checked against the serving seam
(llmkiln.runtime.protocol.ServingEngine). `make lint` runs the same check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success: no issues found" in out.stdout
