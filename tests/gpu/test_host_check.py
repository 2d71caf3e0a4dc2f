"""`kiln build --resume`'s host check: tensorrt_llm / tensorrt versions and the GPU's compute capability
against pins.json and the recipe, with stand-in packages the test puts on sys.path (no GPU here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmkiln.errors import NeedsGpuHost
from llmkiln.recipe import load_recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.host import HostFacts, check_host, host_problems, probe_host


@pytest.fixture()
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write stand-in `tensorrt_llm` and `tensorrt` packages with the given versions and put them first on
    sys.path (removed again by monkeypatch)."""

    def make(trtllm: str, trt: str) -> None:
        for name, version in (("tensorrt_llm", trtllm), ("tensorrt", trt)):
            pkg = tmp_path / f"{name}-{version}" / name
            pkg.mkdir(parents=True)
            (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
            monkeypatch.syspath_prepend(str(pkg.parent))
            monkeypatch.delitem(sys.modules, name, raising=False)

    return make


def test_probe_reads_the_installed_versions(stand_ins) -> None:
    stand_ins("1.2.1", "10.14.1.48")
    facts = probe_host()
    assert (facts.tensorrt_llm, facts.tensorrt) == ("1.2.1", "10.14.1.48")
    assert facts.compute_capability is None  # no CUDA on this host


def test_wrong_generation_is_one_clear_exit_3_message(stand_ins) -> None:
    stand_ins("1.1.0", "10.13.3.9")
    recipe, _ = load_recipe("tiny-trtllm-fp8")
    with pytest.raises(NeedsGpuHost) as exc:
        check_host(recipe)
    msg = str(exc.value)
    assert exc.value.exit_code == 3
    assert "tensorrt_llm 1.1.0 found, needs 1.2.1" in msg
    assert "tensorrt 10.13.3.9 found, needs 10.14.1.48" in msg
    assert "GPU: none found, needs compute capability >= 8.9" in msg
    assert pins.container() in msg


def test_matching_versions_and_an_fp8_gpu_pass() -> None:
    recipe, _ = load_recipe("tiny-trtllm-fp8")
    good = HostFacts("1.2.1", "10.14.1.48", (9, 0), "H100")
    assert check_host(recipe, good) is good
    # the TensorRT build number may differ; major.minor.patch may not
    assert host_problems(recipe, HostFacts("1.2.1", "10.14.1.49", (8, 9), "L40S")) == []
    assert host_problems(recipe, HostFacts("1.2.1", "10.13.3.9", (8, 9), "L40S")) == [
        "tensorrt 10.13.3.9 found, needs 10.14.1.48"
    ]


def test_fp8_needs_sm_89() -> None:
    recipe, _ = load_recipe("tiny-trtllm-llmapi")
    problems = host_problems(recipe, HostFacts("1.2.1", "10.14.1.48", (8, 6), "A10"))
    assert problems == [
        "GPU A10 has compute capability 8.6, needs >= 8.9 (recipe tiny-trtllm-llmapi: precision fp8, "
        "kv_cache.dtype fp8)"
    ]
