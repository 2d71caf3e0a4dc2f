"""scripts/gpu_verify.sh's setup step against the pinned container's layout, built on CPU.

The stand-in container: a "container venv" made with Python 3.12 (the container's Python, pins.json) holding
stand-in `tensorrt_llm` / `tensorrt` / `torch` distributions at the pinned versions (tiny dist-info packages: a
torch whose CUDA device 0 is SM 9.0, a tensorrt_llm whose `llmapi.TorchLlmArgs` is a strict pydantic model with a
nested KvCacheConfig and an enum), the rest of what the container ships (pydantic, numpy, transformers, ...)
taken from the cached Python 3.12 test venv (scripts/py312_env.sh) through a .pth file, and `/app/all_models`-like
model files. The script's own setup step runs against it; then `smoke versions` passes, `smoke options` accepts
good options and prints pydantic's error for a bad nested key, and a tensorrt_llm at another version exits 3 with
its message. The real container is checked by the same script on a GPU host (docs/gpu.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmkiln.trtllm import pins

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT.parent / "shared" / "models" / "stories260K"
# what the r26.05 image ships where llmkiln pins otherwise (NVIDIA/TensorRT-LLM requirements.txt: numpy<2,
# transformers==4.57.1; huggingface_hub 0.36.2 is the newest that transformers 4.57.1 accepts, with requests)
CONTAINER_VERSIONS = (
    "numpy==1.26.4",
    "transformers==4.57.1",
    "huggingface_hub==0.36.2",
    "requests==2.32.5",  # huggingface_hub 0.x needs it (the image has it; the seed venv does not)
    "charset_normalizer==3.4.4",
)
pytestmark = pytest.mark.slow

FAKE_TORCH = """
__version__ = {version!r}


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def get_device_capability(index=0):
        return (9, 0)

    @staticmethod
    def get_device_name(index=0):
        return "stand-in H100 (CPU test)"
"""

FAKE_LLMAPI = """
from enum import Enum
from pydantic import BaseModel, ConfigDict


class CapacitySchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KvCacheConfig(_Strict):
    enable_block_reuse: bool = True
    dtype: str = "auto"
    free_gpu_memory_fraction: float = 0.9
    tokens_per_block: int = 32


class SchedulerConfig(_Strict):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT


class TorchLlmArgs(_Strict):
    model: str
    max_batch_size: int = 2048
    kv_cache_config: KvCacheConfig = KvCacheConfig()
    scheduler_config: SchedulerConfig = SchedulerConfig()
"""

FAKE_LLM_UTILS = """
import yaml


def update_llm_args_with_extra_options(llm_args, extra_llm_api_options):
    with open(extra_llm_api_options) as f:
        return llm_args | yaml.safe_load(f)
"""


FAKE_LLM = """
import time


class SamplingParams:
    def __init__(self, max_tokens=16, temperature=1.0):
        self.max_tokens = max_tokens


class _Out:
    def __init__(self, n):
        self.outputs = [type("Completion", (), {"token_ids": list(range(n))})()]


class LLM:
    \"\"\"Stand-in LLM API: with a speculative_config every step drafts 4 tokens and accepts 3, and runs faster.\"\"\"

    def __init__(self, model, speculative_config=None, enable_iter_perf_stats=False, **kwargs):
        self.spec = speculative_config
        self.stats = []

    def generate(self, prompts, params):
        time.sleep(0.02 if self.spec else 0.05)
        if self.spec:
            self.stats += [{"specDecodingStats": {"numDraftTokens": 4, "numAcceptedTokens": 3}} for _ in prompts]
        return [_Out(params.max_tokens) for _ in prompts]

    def get_stats(self, timeout=2):
        out, self.stats = self.stats, []
        return out

    def shutdown(self):
        pass
"""


def _dist(site: Path, name: str, version: str, files: dict[str, str]) -> None:
    """A package and its dist-info (METADATA, INSTALLER, RECORD): what pip and importlib.metadata read."""
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("stand-in\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))


def _set_trtllm_version(site: Path, version: str) -> None:
    text = f"__version__ = {version!r}\nfrom tensorrt_llm._stand_in_llm import LLM, SamplingParams\n"
    (site / "tensorrt_llm" / "__init__.py").write_text(text)


@pytest.fixture(scope="module")
def py312() -> Path:
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/py312_env.sh")], capture_output=True, text=True, timeout=1800
    )
    if r.returncode != 0:
        pytest.fail(f"scripts/py312_env.sh failed:\n{r.stderr[-3000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def container(py312: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """/opt/venv-tritonserver and /app/all_models under a tmp folder."""
    top = tmp_path_factory.mktemp("container")
    cvenv = top / "opt" / "venv-tritonserver"
    subprocess.run([str(py312), "-m", "venv", "--without-pip", str(cvenv)], check=True, timeout=300)
    site = Path(
        subprocess.check_output(
            [str(cvenv / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    seed = subprocess.check_output(
        [str(py312), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    (site / "_container_stack.pth").write_text(
        seed + "\n"
    )  # pydantic, numpy, transformers, ... of "the image"
    _dist(
        site, "torch", pins.pin("torch"), {"torch/__init__.py": FAKE_TORCH.format(version=pins.pin("torch"))}
    )
    _dist(
        site,
        "tensorrt",
        pins.pin("tensorrt"),
        {"tensorrt/__init__.py": f"__version__ = {pins.pin('tensorrt')!r}\n"},
    )
    _dist(
        site,
        "tensorrt_llm",
        pins.pin("tensorrt_llm"),
        {
            "tensorrt_llm/__init__.py": "",
            "tensorrt_llm/_stand_in_llm.py": FAKE_LLM,
            "tensorrt_llm/llmapi/__init__.py": FAKE_LLMAPI,
            "tensorrt_llm/llmapi/llm_utils.py": FAKE_LLM_UTILS,
        },
    )
    _set_trtllm_version(site, pins.pin("tensorrt_llm"))
    # the image's own versions where they differ from llmkiln's pins (TensorRT-LLM's requirements.txt: numpy<2,
    # transformers==4.57.1, which needs huggingface_hub<1): in the container venv itself, ahead of the seed's
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
         "3.12", "--target", str(site), *CONTAINER_VERSIONS],
        check=True, timeout=600,
    )  # fmt: skip
    models = top / "app" / "all_models"
    llmapi = models / "llmapi" / "tensorrt_llm"
    for rel in ("config.pbtxt", "1/model.py", "1/helpers.py", "1/model.yaml"):
        (llmapi / rel).parent.mkdir(parents=True, exist_ok=True)
        (llmapi / rel).write_text(f"# stand-in {rel}\n")
    (models / "inflight_batcher_llm" / "tensorrt_llm").mkdir(parents=True)
    return {
        "top": top,
        "venv": cvenv,
        "site": site,
        "models": models / "inflight_batcher_llm",
        "llmapi_models": models / "llmapi",
    }


@pytest.fixture(scope="module")
def gpu_venv(container: dict[str, Path]) -> dict[str, object]:
    """scripts/gpu_verify.sh setup, run against the stand-in container."""
    venv = container["top"] / "checkout-venv-gpu"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env |= {
        "LLMKILN_CONTAINER_VENV": str(container["venv"]),
        "LLMKILN_GPU_VENV": str(venv),
        "LLMKILN_TRTLLM_MODELS": str(container["models"]),
        "LLMKILN_TRTLLM_LLMAPI_MODELS": str(container["llmapi_models"]),
        "LLMKILN_ENGINES": str(container["top"] / "engines"),
    }
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_verify.sh"), "setup"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"venv": venv, "env": env, "setup": r}


def _py(gpu_venv: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
    venv = gpu_venv["venv"]
    assert isinstance(venv, Path)
    env = gpu_venv["env"]
    assert isinstance(env, dict)
    return subprocess.run(
        [str(venv / "bin/python"), *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def test_the_gpu_venv_runs_the_containers_python_and_this_checkout(gpu_venv: dict[str, object]) -> None:
    r = _py(
        gpu_venv, "-c", "import sys, llmkiln, tensorrt_llm; print(sys.version_info[:2], llmkiln.__file__)"
    )
    assert r.returncode == 0, r.stderr
    assert "(3, 12)" in r.stdout and str(ROOT / "llmkiln") in r.stdout


def test_setup_kept_the_containers_torch_tensorrt_llm_and_tensorrt(gpu_venv: dict[str, object]) -> None:
    setup = gpu_venv["setup"]
    assert isinstance(setup, subprocess.CompletedProcess)
    out = setup.stdout
    for name in ("torch", "tensorrt_llm", "tensorrt"):
        assert f"{name}=={pins.pin(name)}" in out
    r = _py(gpu_venv, str(ROOT / "scripts/gpu_missing_deps.py"), str(ROOT / "pyproject.toml"))
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout  # nothing left to install
    venv = gpu_venv["venv"]
    assert isinstance(venv, Path)
    own = list(venv.glob("lib/python3.12/site-packages/*"))
    assert not [p for p in own if p.name.startswith(("torch", "tensorrt"))], own  # none shadowed in the venv
    # the stand-in image's packages come through a .pth file inside its site-packages: the setup's site.addsitedir
    # processes it, so nothing the container has was installed again into the venv (only llmkiln itself)
    dists = sorted(p.name for p in own if p.name.endswith(".dist-info"))
    assert [d for d in dists if not d.startswith(("llmkiln-", "pip-", "setuptools-"))] == [], (
        dists
    )  # venv tooling aside
    r = _py(gpu_venv, str(ROOT / "scripts/gpu_missing_deps.py"), str(ROOT / "pyproject.toml"), "--installed")
    pins_now = r.stdout.split()
    assert r.returncode == 0 and any(p.startswith("pydantic==") for p in pins_now), r.stdout
    assert not any(p.lower().startswith("llmkiln==") for p in pins_now)


def test_missing_deps_lists_only_what_no_distribution_provides(
    gpu_venv: dict[str, object], tmp_path: Path
) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\nversion = "0"\ndependencies = ["torch==2.13.0", "tensorrt-llm==9.9", '
        '"pydantic==0.1", "llmkiln-no-such-dist==1.0", "other-dist==2.0; python_version < \'3.12\'"]\n'
    )
    r = _py(gpu_venv, str(ROOT / "scripts/gpu_missing_deps.py"), str(pyproject))
    assert r.returncode == 0, r.stderr
    # protected ones are never reinstalled, an installed pydantic is kept at its version, markers apply
    assert r.stdout.split() == ["llmkiln-no-such-dist==1.0"]


def test_smoke_versions_passes_in_the_pinned_container(gpu_venv: dict[str, object]) -> None:
    r = _py(gpu_venv, "-m", "llmkiln.trtllm.smoke", "versions", "tiny-trtllm-llmapi")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["tensorrt_llm"] == pins.pin("tensorrt_llm") and facts["compute_capability"] == [9, 0]


def test_the_upstream_model_files_come_from_the_container_path(gpu_venv: dict[str, object]) -> None:
    code = "from llmkiln.trtllm.upstream import default_upstream as d; print(d('engine')); print(d('llmapi'))"
    r = _py(gpu_venv, "-c", code)
    assert r.returncode == 0, r.stderr
    env = gpu_venv["env"]
    assert isinstance(env, dict)
    assert r.stdout.split() == [env["LLMKILN_TRTLLM_MODELS"], env["LLMKILN_TRTLLM_LLMAPI_MODELS"]]


def test_smoke_options_accepts_good_options_and_prints_the_pydantic_error(
    gpu_venv: dict[str, object], tmp_path: Path
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "max_batch_size: 8\nkv_cache_config: {dtype: fp8}\nscheduler_config: {capacity_scheduler_policy: MAX_UTILIZATION}\n"
    )
    r = _py(gpu_venv, "-m", "llmkiln.trtllm.smoke", "options", str(good), "--model", str(tmp_path))
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kv_cache_config: {enable_blok_reuse: true}\nscheduler_config: {capacity_scheduler_policy: FASTEST}\n"
    )
    r = _py(gpu_venv, "-m", "llmkiln.trtllm.smoke", "options", str(bad), "--model", str(tmp_path))
    assert r.returncode == 1
    assert "ValidationError" in r.stderr and "kv_cache_config.enable_blok_reuse" in r.stderr
    assert "scheduler_config.capacity_scheduler_policy" in r.stderr


def test_a_tensorrt_llm_at_another_version_exits_3_with_its_message(
    gpu_venv: dict[str, object], container: dict[str, Path]
) -> None:
    _set_trtllm_version(container["site"], "1.3.0rc29")
    try:
        r = _py(gpu_venv, "-m", "llmkiln.trtllm.smoke", "versions", "tiny-trtllm-llmapi")
    finally:
        _set_trtllm_version(container["site"], pins.pin("tensorrt_llm"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"tensorrt_llm 1.3.0rc29 found, needs {pins.pin('tensorrt_llm')}" in r.stderr
    assert pins.container() in r.stderr


def test_smoke_speculative_records_acceptance_and_tokens_per_second(
    gpu_venv: dict[str, object], tmp_path: Path
) -> None:
    """The measuring plumbing of `gpu_verify.sh speculative`, against the stand-in LLM API (the numbers are the
    stand-in's; on a GPU host they are TensorRT-LLM's)."""
    engine = tmp_path / "tiny-trtllm-llmapi-ngram"
    (engine / "hf_checkpoint").mkdir(parents=True)
    (engine / "llm_api_options.yaml").write_text(
        "max_batch_size: 8\nspeculative_config: {decoding_type: NGram, max_draft_len: 4, max_matching_ngram_size: 3}\n"
    )
    out = tmp_path / "results"
    r = _py(
        gpu_venv,
        "-m",
        "llmkiln.trtllm.smoke",
        "speculative",
        str(engine),
        "--out",
        str(out),
        "--max-tokens",
        "8",
    )
    assert r.returncode == 0, r.stderr
    (path,) = out.glob("*-tiny-trtllm-llmapi-ngram-speculative.json")
    result = json.loads(path.read_text())
    assert result["with"]["acceptance_rate"] == 0.75 and result["without"]["acceptance_rate"] is None
    assert result["with"]["output_tokens"] == result["without"]["output_tokens"] == 16 * 8
    assert result["speedup"] > 1 and result["speculative_config"]["decoding_type"] == "NGram"
    assert "acceptance rate 0.75" in r.stdout


def test_llmkiln_builds_its_gpu_artifacts_with_the_containers_versions(gpu_venv: dict[str, object]) -> None:
    """In the GPU venv the container's numpy and transformers are the ones imported (not llmkiln's pins), and the
    warmup token ids of the Triton repository (transformers.AutoTokenizer, as the upstream preprocessing model)
    come out the same as with llmkiln's own transformers."""
    code = textwrap.dedent(
        f"""
        import os
        os.environ["USE_TORCH"] = "0"  # the stand-in torch is a stub: transformers must not build on it
        import json, numpy, transformers
        from pathlib import Path
        from llmkiln.recipe import load_recipe
        from llmkiln.trtllm.repository import tokenize_warmup
        ids, end, pad = tokenize_warmup(load_recipe("tiny-trtllm-llmapi")[0], Path({str(STORIES)!r}))
        print(json.dumps({{"numpy": numpy.__version__, "transformers": transformers.__version__, "ids": ids,
                           "end": end, "pad": pad}}))
        """
    )
    r = _py(gpu_venv, "-c", code)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["numpy"], got["transformers"]) == ("1.26.4", "4.57.1")
    from llmkiln.recipe import load_recipe
    from llmkiln.trtllm.repository import tokenize_warmup

    ids, end, pad = tokenize_warmup(load_recipe("tiny-trtllm-llmapi")[0], STORIES)
    assert (got["ids"], got["end"], got["pad"]) == (ids, end, pad)
