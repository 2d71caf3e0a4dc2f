"""llmkiln works outside this checkout: a wheel built from it, installed into a fresh virtualenv, run in an empty
folder — bundled recipes and calibration sets ship inside the package, and nothing names this repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(kiln executable of a fresh venv holding only the llmkiln wheel, an empty working folder)."""
    tmp = tmp_path_factory.mktemp("package")
    dist = tmp / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("llmkiln-*.whl"))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                       check=True, capture_output=True, text=True).stdout.strip()
    )  # fmt: skip
    # The dependencies (torch, onnxruntime, ... : GBs) come from this test's environment, appended after the
    # fresh venv's own site-packages; llmkiln itself comes only from the wheel (this environment's editable
    # install is a .pth file there, which a plain path entry does not run).
    (site / "zz_llmkiln_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    # pip --target writes no console script; the wheel's entry point is `kiln = llmkiln.cli.main:main`
    kiln = env_dir / "bin" / "kiln"
    kiln.write_text(f"#!{py}\nfrom llmkiln.cli.main import main\nmain()\n")
    kiln.chmod(0o755)
    work = tmp / "empty"
    work.mkdir()
    return kiln, work


def _run(kiln: Path, work: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMKILN_", "PYTHON"))}
    out = subprocess.run([str(kiln), *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, (
            f"kiln {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        )
    return out


def test_the_installed_package_is_the_wheel(installed: tuple[Path, Path]) -> None:
    kiln, work = installed
    py = kiln.with_name("python")
    where = subprocess.run([py, "-c", "import llmkiln; print(llmkiln.__file__)"], cwd=work, capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    assert str(kiln.parent.parent) in where and str(REPO) not in where


def test_recipes_build_and_generate_in_an_empty_folder(installed: tuple[Path, Path]) -> None:
    kiln, work = installed
    listed = _run(kiln, work, "recipes").stdout
    assert "tiny-fp32" in listed and "stories-fp32" in listed
    shown = _run(kiln, work, "recipe", "show", "tiny-fp32").stdout
    assert "name: tiny-fp32" in shown and "generated: tiny-llama" in shown
    built = _run(kiln, work, "build", "tiny-fp32", "--quiet")
    assert (work / "engines" / "tiny-fp32" / "manifest.json").is_file(), built.stderr
    gen = _run(kiln, work, "generate", "tiny-fp32", "Once upon a time", "--max-tokens", "8")
    assert gen.stdout.strip() and "gibberish" in gen.stderr
    # a bundled quantized recipe finds its bundled calibration sets (the build's quality gate reads them)
    assert "stories-calib" in _run(kiln, work, "recipe", "show", "stories-int8").stdout


def test_a_local_recipes_folder_adds_and_overrides(installed: tuple[Path, Path], tmp_path: Path) -> None:
    kiln, work = installed
    local = work / "recipes"
    local.mkdir(exist_ok=True)
    (local / "mine.yaml").write_text(
        "name: mine\ndescription: my own\nextends: tiny-fp32\nscheduler:\n  max_batch_size: 3\n"
    )
    (local / "tiny-fp32.yaml").write_text("name: tiny-fp32\ndescription: overridden here\nextends: _base-cpu\n"
                                          "model:\n  generated: tiny-llama\n")  # fmt: skip
    try:
        listed = _run(kiln, work, "recipes").stdout
        assert "mine" in listed and "overridden here" in listed
        assert "max_batch_size: 3" in _run(kiln, work, "recipe", "show", "mine").stdout
        other = tmp_path / "elsewhere"
        other.mkdir()
        (other / "third.yaml").write_text("name: third\nextends: tiny-fp32\n")
        assert "third" in _run(kiln, work, "--recipes-dir", str(other), "recipes").stdout
    finally:
        for f in local.iterdir():
            f.unlink()
        local.rmdir()


def test_errors_never_name_this_checkout(installed: tuple[Path, Path]) -> None:
    kiln, work = installed
    for args in (("build", "no-such-recipe"), ("build", "stories-fp32"), ("generate", "nowhere", "hi")):
        out = _run(kiln, work, *args, check=False)
        assert out.returncode == 2, out.stderr
        assert str(REPO) not in out.stderr and "shared/" not in out.stderr.replace("/shared/models", ""), (
            out.stderr
        )


def test_onnxruntime_telemetry_is_off_in_llmkiln_processes(tmp_path):
    """Importing onnxruntime through llmkiln leaves nothing in $TMPDIR (its telemetry's session file) — with CI unset,
    as on a user's machine."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "ORT_DISABLE_TELEMETRY")}
    env["TMPDIR"] = str(tmp_path)
    code = "import llmkiln.runtime.runner, os; print(os.environ['ORT_DISABLE_TELEMETRY'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "1" and list(tmp_path.iterdir()) == []
