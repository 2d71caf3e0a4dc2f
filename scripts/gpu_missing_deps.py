"""llmkiln's dependencies that a container venv lacks, as pip requirements (scripts/gpu_verify.sh's setup step).

Run with the GPU venv's python (the venv that sees the container's site-packages through a .pth file). Reads
pyproject.toml's [project] dependencies (stdlib only: llmkiln's own dependencies may be the missing ones), keeps
those whose markers apply to this Python and whose distribution is not installed at all, and prints them one a
line. A distribution the container has is kept at the container's version, whatever llmkiln pins: the container's
stack (torch, tensorrt_llm, tensorrt, numpy, transformers, ...) was built and tested together.

  python scripts/gpu_missing_deps.py PYPROJECT            # the missing requirements, one a line
  python scripts/gpu_missing_deps.py PYPROJECT --protected  # the protected distributions as NAME==VERSION
  python scripts/gpu_missing_deps.py PYPROJECT --installed  # every distribution installed (llmkiln aside) as
                                                            # NAME==VERSION: pip --constraint, so installing what is
                                                            # missing never replaces or shadows what the container
                                                            # has (tritonclient would pull its own protobuf, grpcio)

The protected distributions (torch, tensorrt_llm, tensorrt) are never printed as missing: if one is absent, the
container is not the pinned one, and `python -m llmkiln.trtllm.smoke versions` says so (exit 3).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement

PROTECTED = ("torch", "tensorrt_llm", "tensorrt")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing(pyproject: Path) -> list[str]:
    deps = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    protected = {canonical(p) for p in PROTECTED}
    out = []
    for line in deps:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        if canonical(req.name) in protected or installed(req.name) is not None:
            continue
        out.append(str(req).split(";")[0].strip())
    return out


def installed_pins() -> list[str]:
    """NAME==VERSION of every installed distribution but llmkiln itself, sorted, each name once (the first one
    found on sys.path wins, as for imports)."""
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in seen and canonical(name) != "llmkiln":
            seen[canonical(name)] = f"{name}=={dist.version}"
    return sorted(seen.values(), key=str.lower)


def protected_pins() -> list[str]:
    return [f"{name}=={v}" for name in PROTECTED if (v := installed(name)) is not None]


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    if "--protected" in argv[1:]:
        lines = protected_pins()
    elif "--installed" in argv[1:]:
        lines = installed_pins()
    else:
        lines = missing(Path(argv[0]))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
