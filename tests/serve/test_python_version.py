"""`kiln serve` (Triton on CPU) runs on the Python its python-backend stub is verified with; any other Python gets
one clear message and exit 2 before anything is built or started (llmkiln itself installs on 3.11-3.13)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmkiln.errors import BadInput
from llmkiln.serve.backend_env import TRITON_PYTHON, check_triton_python


def test_the_verified_python_passes() -> None:
    check_triton_python(TRITON_PYTHON)


@pytest.mark.parametrize("version", [(3, 12), (3, 13)])
def test_other_pythons_are_refused_with_the_reason(version: tuple[int, int]) -> None:
    with pytest.raises(BadInput) as exc:
        check_triton_python(version)
    msg = str(exc.value)
    assert f"Python {version[0]}.{version[1]}" in msg and "needs Python 3.11" in msg and "--dynamo" in msg


def test_kiln_serve_exits_2_with_one_message_on_another_python(tmp_path: Path) -> None:
    # Pretend the verified Python is another one: the running interpreter then plays "Python 3.12".
    code = (
        "import llmkiln.serve.backend_env as b; b.TRITON_PYTHON = (3, 99); "
        "from llmkiln.cli.main import main; main(['serve', sys.argv[1]])"
    )
    r = subprocess.run(
        [sys.executable, "-c", "import sys; " + code, str(tmp_path / "no-such-engine")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "needs Python 3.99" in r.stderr and r.stderr.count("needs Python") == 1
