"""Locate the tritonserver binary and python backend bundled in the nvidia-pytriton wheel, and prepare them.

The wheel (nvidia-pytriton 0.7.0, Triton 2.51) ships:
  pytriton/tritonserver/bin/tritonserver
  pytriton/tritonserver/backends/python/{libtriton_python.so, triton_python_backend_utils.py}
  pytriton/tritonserver/python_backend_stubs/<py>/triton_python_backend_stub
  nvidia_pytriton.libs/           (shared libraries tritonserver links against)

Triton's python backend expects the stub next to libtriton_python.so, so `assemble_backend_dir` builds a
backend folder `<dir>/python/` with the three files. The stub embeds CPython: it loads libpython3.11 (Debian
package libpython3.11) and finds its `sys.prefix` through `python3` on PATH, so PATH starts with this
interpreter's bin folder (the venv's) and the stub sees the venv's packages (llmkiln, numpy<2, onnxruntime).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from llmkiln.atomic import atomic_dir, keep_existing
from llmkiln.errors import BadInput

STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class TritonInstall:
    """Paths of the tritonserver installation bundled in the nvidia-pytriton wheel."""

    server_bin: Path
    libs_dir: Path
    python_backend_dir: Path
    stub: Path

    def check(self) -> None:
        """Raise BadInput naming the first missing file."""
        for p in (self.server_bin, self.libs_dir, self.python_backend_dir / "libtriton_python.so", self.stub):
            if not p.exists():
                raise BadInput(
                    f"tritonserver installation incomplete: {p} is missing; "
                    "reinstall the serving extra (`pip install nvidia-pytriton==0.7.0`)"
                )


def python_tag() -> str:
    """'3.11' for the running interpreter (the stub must match the venv's Python)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


# The interpreter the Triton-on-CPU path is verified with: the python-backend stub of nvidia-pytriton 0.7.0 loads
# libpython<ver> and, under numpy 2, crashes on BYTES inputs (../shared/reference/dependencies.md). The wheel also
# ships 3.12/3.13 stubs, but nothing here has been run with them; llmkiln itself installs on 3.11-3.13.
TRITON_PYTHON = (3, 11)


def check_triton_python(version: tuple[int, int] | None = None) -> None:
    """BadInput (exit 2) unless this is the Python the Triton-on-CPU path runs on."""
    have = version or (sys.version_info.major, sys.version_info.minor)
    if tuple(have) != TRITON_PYTHON:
        need = ".".join(map(str, TRITON_PYTHON))
        raise BadInput(
            f"kiln serve (Triton on CPU) needs Python {need}: the python-backend stub of nvidia-pytriton 0.7.0 "
            f"is verified only there, and this is Python {have[0]}.{have[1]}. Run it from a Python {need} "
            f"environment (`make setup` makes one), or use `kiln serve ENGINE --dynamo` (no Triton python backend involved)"
        )


def find_triton() -> TritonInstall:
    """The tritonserver bundled in nvidia-pytriton; BadInput if the wheel is not installed or this Python is not
    the one the Triton-on-CPU path runs on."""
    check_triton_python()
    try:
        import pytriton  # optional dependency
    except ImportError as exc:
        raise BadInput(
            "serving needs the nvidia-pytriton wheel (tritonserver + python backend): "
            "`pip install nvidia-pytriton==0.7.0` (part of the `cpu` extra)"
        ) from exc
    pkg = Path(pytriton.__file__).resolve().parent
    root = pkg / "tritonserver"
    inst = TritonInstall(
        server_bin=root / "bin" / "tritonserver",
        libs_dir=pkg.parent / "nvidia_pytriton.libs",
        python_backend_dir=root / "backends" / "python",
        stub=root / "python_backend_stubs" / python_tag() / STUB_NAME,
    )
    inst.check()
    return inst


def assemble_backend_dir(dst: Path, inst: TritonInstall | None = None) -> Path:
    """Write `<dst>/python/` (libtriton_python.so, utils, executable stub); returns dst (--backend-directory).

    Built in a temporary sibling folder and renamed into place; an existing complete folder is kept.
    """
    inst = inst or find_triton()
    final = dst / "python"
    if (final / STUB_NAME).is_file() and (final / "libtriton_python.so").is_file():
        return dst
    # keep_existing: another process may have finished first; then theirs is used.
    with atomic_dir(final, prefix=".python.tmp-", mode=0o755, publish=keep_existing) as tmp:
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            shutil.copy2(inst.python_backend_dir / name, tmp / name)
        stub = tmp / STUB_NAME
        shutil.copy2(inst.stub, stub)
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return dst


def server_env(inst: TritonInstall | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: bundled libs on LD_LIBRARY_PATH, this interpreter's bin first on PATH."""
    inst = inst or find_triton()
    env = dict(os.environ if base is None else base)
    libs = str(inst.libs_dir)
    env["LD_LIBRARY_PATH"] = libs + (
        os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""
    )
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    # The stub must not pick up a user's PYTHONHOME pointing elsewhere.
    env.pop("PYTHONHOME", None)
    return env
