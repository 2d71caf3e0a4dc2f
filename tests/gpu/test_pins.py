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
    assert "--shm-size" in gpu and "scripts/gpu_verify.sh setup" in gpu
    assert "pip install" not in "\n".join(line for line in gpu.splitlines() if "docker run" in line)


SETUP_COMMAND = re.compile(
    r"-m venv\b|\bvirtualenv\b|\buv venv\b|\bpip3? install\b|\buv pip\b|--system-site-packages"
)


def _commands(text: str) -> list[str]:
    """Shell lines with backslash continuations joined, comments and blank lines dropped."""
    out: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(" ".join((pending + line).split()))
        pending = ""
    return out


def _doc_code_commands(text: str) -> list[str]:
    return [c for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.S) for c in _commands(block)]


def test_gpu_doc_sets_kiln_up_only_the_way_gpu_verify_does() -> None:
    """Every venv / pip command in docs/gpu.md's code blocks is one scripts/gpu_verify.sh runs itself (the doc
    says `scripts/gpu_verify.sh setup`), and no `venv --system-site-packages` is left: in the r26.05 container
    `python3` is /opt/venv-tritonserver's, so such a venv cannot import tensorrt_llm (kiln build --resume: exit 3)."""
    gpu = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    script = (REPO / "scripts" / "gpu_verify.sh").read_text(encoding="utf-8")
    script_commands = set(_commands(script))
    doc_commands = _doc_code_commands(gpu)
    foreign = [c for c in doc_commands if SETUP_COMMAND.search(c) and c not in script_commands]
    assert not foreign, f"docs/gpu.md sets kiln up in a way scripts/gpu_verify.sh does not: {foreign}"
    for needle in ("venv --system-site-packages", "virtualenv --system-site-packages"):
        assert needle not in gpu or needle in "\n".join(script_commands), f"docs/gpu.md still has {needle!r}"
    # every code block that runs kiln from .venv-gpu makes it with the script first
    for block in re.findall(r"```[^\n]*\n(.*?)```", gpu, re.S):
        if ".venv-gpu/bin/" in block:
            assert "scripts/gpu_verify.sh" in block, (
                f"a docs/gpu.md block uses .venv-gpu without the setup: {block}"
            )
    # ... and the venv the doc names is the script's default
    assert re.search(r"VENV=\$\{LLMKILN_GPU_VENV:-\$ROOT/\.venv-gpu\}", script)
    assert "setup)" in script and "setup_venv" in script


def test_the_setup_check_catches_the_old_instructions() -> None:
    """The broken line the doc used to have is caught by the check above."""
    old = "```\npython3 -m venv --system-site-packages .venv-gpu\n.venv-gpu/bin/kiln build --resume plan.json\n```\n"
    script_commands = set(_commands((REPO / "scripts" / "gpu_verify.sh").read_text(encoding="utf-8")))
    commands = _doc_code_commands(old)
    assert [c for c in commands if SETUP_COMMAND.search(c) and c not in script_commands] == [
        "python3 -m venv --system-site-packages .venv-gpu"
    ]


REGISTRY = REPO / "tests" / "gpu" / "gpu_extra_registry.json"


def _gpu_extra() -> dict[str, str]:
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pinned: dict[str, str] = {}
    for req in extra:
        spec = req.split(";")[0].strip()
        name, sep, version = spec.partition("==")
        assert sep, f"[gpu] extra: {req!r} is not an exact pin"
        pinned[name.split("[")[0].strip().lower()] = version.strip()
    return pinned


def test_every_gpu_extra_pin_exists_on_the_registry() -> None:
    """Offline: against the versions recorded from `pip index versions` (tests/gpu/gpu_extra_registry.json);
    with LLMKILN_ONLINE_PINS=1 against the registry itself. (onnxruntime-gpu==1.32.0 was pinned while PyPI's
    newest onnxruntime-gpu is 1.31.1: `pip install '.[gpu]'` failed.)"""
    import json
    import os
    import subprocess
    import sys

    recorded = json.loads(REGISTRY.read_text())["versions"]
    for name, version in _gpu_extra().items():
        assert name in recorded, f"{name}: no recorded registry versions in {REGISTRY.name}"
        assert version in recorded[name], (
            f"{name}=={version}: the registry has {', '.join(recorded[name][:5])}, ..."
        )
        if os.environ.get("LLMKILN_ONLINE_PINS") == "1":
            r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            line = next((x for x in r.stdout.splitlines() if x.startswith("Available versions:")), "")
            assert version in [v.strip() for v in line.partition(":")[2].split(",")], (
                f"{name}=={version}: {r.stdout}"
            )


def test_the_registry_check_catches_the_old_pin() -> None:
    import json

    assert "1.32.0" not in json.loads(REGISTRY.read_text())["versions"]["onnxruntime-gpu"]


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
