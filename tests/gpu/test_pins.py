"""The pins table (llmkiln/trtllm/pins.json) is the one source of versions: every fact has a source, and the
docs, README, recipes and code mention the same container tag and versions."""

from __future__ import annotations

import re
from pathlib import Path

from llmkiln.recipe import load_recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.plan import make_plan

REPO = Path(__file__).resolve().parents[2]
TAG = re.compile(r"tritonserver:\d\d\.\d\d-trtllm-python-py3")
PROSE = [
    REPO / "README.md",
    REPO / "DESIGN.md",
    REPO / "docs" / "gpu.md",
    *sorted((REPO / "recipes").glob("*.yaml")),
]


def test_every_fact_has_a_value_and_a_source() -> None:
    for name in pins.pins():
        assert pins.pin(name) not in (None, "", []), name
        assert len(pins.source(name)) > 10, name


def test_the_engine_path_pairs_26_05_with_tensorrt_llm_1_2_1() -> None:
    assert pins.container() == "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3"
    assert (pins.pin("tensorrt_llm"), pins.pin("tensorrt")) == ("1.2.1", "10.14.1.48")
    assert pins.pin("triton_release") in pins.container()


def test_docs_readme_and_recipes_name_only_the_pinned_container() -> None:
    """Every full container tag in the prose is the pinned one (other releases are named without the tag)."""
    wanted = pins.container().removeprefix("nvcr.io/nvidia/")
    for path in [*PROSE, *sorted((REPO / "llmkiln").rglob("*.py")), REPO / "scripts" / "gpu_verify.sh"]:
        for tag in TAG.findall(path.read_text(encoding="utf-8")):
            assert tag == wanted, f"{path}: {tag}"


def test_gpu_doc_and_readme_state_the_pinned_versions() -> None:
    gpu = (REPO / "docs" / "gpu.md").read_text()
    readme = (REPO / "README.md").read_text()
    for fact in ("container", "tensorrt_llm", "tensorrt", "cuda", "engine_model_files", "llmapi_model_files"):
        assert str(pins.pin(fact)) in gpu, f"docs/gpu.md does not state {fact} = {pins.pin(fact)}"
    for fact in ("container", "tensorrt_llm"):
        assert str(pins.pin(fact)) in readme, f"README.md does not state {fact}"
    assert "--shm-size" in gpu and "--system-site-packages" in gpu
    assert "pip install" not in "\n".join(line for line in gpu.splitlines() if "docker run" in line)


def test_plans_record_the_table() -> None:
    recipe, path = load_recipe("tiny-trtllm-fp8")
    plan = make_plan(recipe, recipe_file=path, done={})
    assert plan["pins"] == pins.pins()


def test_the_gpu_verification_script_is_valid_bash() -> None:
    import shutil
    import subprocess

    import pytest

    script = REPO / "scripts" / "gpu_verify.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck); bash -n passed")
    r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_the_trtllm_test_modules_are_collected() -> None:
    """A pytest plugin that drops test_trtllm_*.py files (ai-dynamo's, when tensorrt_llm is absent) must stay off."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", str(REPO / "tests" / "gpu")],
                       capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    for name in ("test_trtllm_plan.py", "test_trtllm_rules.py", "test_trtllm_build_flow.py"):
        assert f"tests/gpu/{name}::" in r.stdout, r.stdout[-2000:]
