"""Fixtures shared by every room's tests.

- `repo_root`, `SHARED_MODELS` (../shared/models next to the checkout), `stories_dir` (the trained stories260K;
  skips with the reason only when ../shared is absent — in CI it is present).
- `engine_factory("stories-fp32") -> Path`: builds a recipe once per session into a session temp engines root
  (export stages are shared between recipes through the build cache, so int8/int4/runtime variants are cheap).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_MODELS = REPO_ROOT.parent / "shared" / "models"
STORIES_DIR = SHARED_MODELS / "stories260K"

# The record of verified engine files (llmkiln.engine_dir.user_cache_dir) goes to a folder of this test run, not
# the user's ~/.cache; subprocesses (kiln CLI, tritonserver's stub) inherit it.
os.environ.setdefault("LLMKILN_CACHE_DIR", tempfile.mkdtemp(prefix="llmkiln-test-cache-"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    if not STORIES_DIR.is_dir():
        pytest.skip(
            f"the trained model {STORIES_DIR} is absent (../shared/models/stories260K next to the checkout)"
        )
    return STORIES_DIR


@pytest.fixture(scope="session")
def session_engines_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="session")
def engine_factory(session_engines_root: Path) -> Callable[[str], Path]:
    """engine_factory(recipe name or path) -> engine folder, built once per session (quietly)."""
    from llmkiln.backends import build as build_engine
    from llmkiln.build.progress import QuietProgress
    from llmkiln.recipe import load_recipe, resolve_model_path

    built: dict[str, Path] = {}

    def factory(recipe: str) -> Path:
        if recipe not in built:
            r, path = load_recipe(recipe)
            model = resolve_model_path(r, path)
            if model is not None and not model.exists() and not SHARED_MODELS.exists():
                pytest.skip(f"recipe {recipe} needs {model}, and ../shared is absent")
            built[recipe] = build_engine(recipe, session_engines_root, progress=QuietProgress()).engine_dir
        return built[recipe]

    return factory


# The Python 3.12 run (`make test-py312`, scripts/py312_env.sh) installs no torch: on 3.12 PyPI has only the
# multi-GB CUDA build. With this variable set, tests that need torch (ModelOpt calibration, the onnxruntime-genai
# builder: the fixtures below, or the `torch` marker) are skipped with that reason instead of failing.
WITHOUT_TORCH_ENV = "LLMKILN_TESTS_WITHOUT_TORCH"
TORCH_FIXTURES = frozenset({"cpu_build", "built", "served", "engine_factory"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get(WITHOUT_TORCH_ENV):
        return
    skip = pytest.mark.skip(reason=f"needs torch (${WITHOUT_TORCH_ENV}: this run installs no torch)")
    for item in items:
        if TORCH_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("torch"):
            item.add_marker(skip)


def _openvino_bf16() -> tuple[bool, str]:
    """(this CPU runs OpenVINO in bf16, the CPU and its capabilities) — AVX512-BF16 or AMX; an AVX2-only CPU
    (e.g. AMD EPYC Zen 3) has no bf16 path."""
    try:
        from llmkiln.runtime.openvino_runner import cpu_capabilities
    except ImportError as exc:  # the Python 3.12 run has no openvino
        return False, f"openvino is not installed ({exc})"
    name, caps = cpu_capabilities()
    return "BF16" in caps, f"{name}, OpenVINO capabilities {', '.join(caps)}"


HAS_BF16, CPU_BF16_INFO = _openvino_bf16()
# bf16 tests run on CPUs with bf16 arithmetic; on others they skip with the CPU named, and the refusal itself is
# tested (tests/test_openvino_export.py::test_bf16_is_refused_on_a_cpu_without_it)
requires_bf16 = pytest.mark.skipif(not HAS_BF16, reason=f"this CPU has no bf16 arithmetic ({CPU_BF16_INFO})")
