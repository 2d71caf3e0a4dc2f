"""The import contracts of DESIGN.md hold: rooms import only downward, no sibling cycles, onnxruntime kept in its
modules (import-linter, configured in pyproject.toml; `make lint` runs the same check)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout
