"""Both front doors share the engine host's checks: a tampered engine is refused by `kiln serve --dynamo` as
by `kiln serve`; a flag of the other front door is refused with exit 2 naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _kiln(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "triton"])
def test_a_tampered_engine_is_never_served(stories_engine: Path, tmp_path: Path, dynamo: bool):
    copy = tmp_path / "engine"
    shutil.copytree(stories_engine, copy)
    data = copy / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one flipped bit
    data.write_bytes(bytes(raw))
    args = ["serve", str(copy), "--http-port", "1"] + (["--dynamo", "--workers", "1"] if dynamo else [])
    r = _kiln(*args)
    assert r.returncode == 1, r.stderr
    assert "does not match its manifest" in r.stderr and "model.onnx.data" in r.stderr
    assert "ready" not in r.stderr


PD = ["--dynamo", "--prefill-workers", "1", "--decode-workers", "1", "--http-port", "1"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--dynamo", "--grpc-port", "9101"], "--grpc-port"),
        (["--dynamo", "--metrics-port", "9102", "--log-verbose", "1"], "--metrics-port, --log-verbose"),
        (["--workers", "3"], "--workers"),
        (["--router-mode", "random", "--state-dir", "/tmp/x"], "--router-mode, --state-dir"),
        (["--prefill-workers", "1", "--decode-workers", "1"], "--prefill-workers, --decode-workers"),
        (["--dynamo", "--workers", "3", "--prefill-workers", "1", "--decode-workers", "1"], "--workers"),
        (["--dynamo", "--prefill-workers", "1"], "go together"),
        (["--max-local-prefill-tokens", "64"], "--max-local-prefill-tokens"),
        (["--dynamo", "--max-local-prefill-tokens", "64"], "flag(s) of prefill/decode separation"),
        (["--dynamo", "--prefill-set", "scheduler.max_prefill_tokens=128"], "--prefill-set"),
        (["--decode-first"], "--decode-first"),
        (["--dynamo", "--decode-first"], "flag(s) of prefill/decode separation"),
        (PD + ["--decode-first", "--threads-per-worker", "1"], "--decode-first sets each tier's threads"),
        (PD + ["--max-local-prefill-tokens", "-1"], "--max-local-prefill-tokens must be >= 0"),
        (PD + ["--prefill-set", "scheduler"], "give SECTION.FIELD=VALUE"),
        (PD + ["--prefill-set", "scheduler.max_prefill_tokens=lots"], "max_prefill_tokens"),
        (PD + ["--prefill-set", "scheduler.no_such_field=1"], "no_such_field"),
    ],
)
def test_a_flag_of_the_other_front_door_is_refused(stories_engine: Path, flags: list[str], named: str):
    r = _kiln("serve", str(stories_engine), *flags)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr
