"""`kiln build` of a trtllm recipe on a host without GPU: runs the CPU stages, stops with exit 3 and a plan that
`kiln build --resume` finishes. The resume plumbing is exercised here with a stand-in `trtllm-build` executable
(it writes engine/config.json + rank0.engine the way the real one lays them out); the real build runs in
test_gpu_engine.py on a GPU host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmkiln.errors import NeedsGpuHost
from llmkiln.trtllm.plan import get_step, read_plan
from llmkiln.trtllm.repo_check import check_trtllm_repository, load_configs
from llmkiln.trtllm.resume import resume_build

KILN = Path(sys.executable).with_name("kiln")
pytestmark = pytest.mark.slow

FAKE_TRTLLM_BUILD = '''#!{python}
"""Stand-in for trtllm-build (tests only): lays out engine/ like TensorRT-LLM's Engine.save."""
import json, sys
from pathlib import Path
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
ckpt = json.loads((Path(args["--checkpoint_dir"]) / "config.json").read_text())
out = Path(args["--output_dir"]); out.mkdir()
plugin = {{"gpt_attention_plugin": args["--gpt_attention_plugin"], "gemm_plugin": args["--gemm_plugin"],
          "use_paged_context_fmha": args["--use_paged_context_fmha"] == "enable",
          "use_fp8_context_fmha": args["--use_fp8_context_fmha"] == "enable",
          "tokens_per_block": int(args["--tokens_per_block"]),
          "multiple_profiles": args["--multiple_profiles"] == "enable"}}
build = {{k: int(args["--" + k]) for k in ("max_batch_size", "max_seq_len", "max_num_tokens")}}
build["max_input_len"] = build["max_seq_len"]  # no --max_input_len: trtllm-build clips its default to max_seq_len
(out / "config.json").write_text(json.dumps({{"version": "stand-in", "pretrained_config": ckpt,
                                             "build_config": dict(build, plugin_config=plugin)}}))
(out / "rank0.engine").write_bytes(b"not a TensorRT engine")
Path(args["--output_timing_cache"]).write_bytes(b"cache")
print("stand-in trtllm-build done")
'''


def stand_in_container_models(repo: Path, out: Path) -> Path:
    """A stand-in for the container's /app/all_models/inflight_batcher_llm: config.pbtxt files with the same
    I/O and parameter keys as the generated ones (placeholders where upstream has them), stub python files."""
    from llmkiln.trtllm.repository import PYTHON_MODELS

    for model_dir in repo.iterdir():
        dst = out / model_dir.name
        dst.mkdir(parents=True)
        text = (model_dir / "config.pbtxt").read_text()
        text = re.sub(r"max_batch_size: \d+", "max_batch_size: ${triton_max_batch_size}", text)
        (dst / "config.pbtxt").write_text(text)
        for rel in PYTHON_MODELS.get(model_dir.name, ()):
            (dst / "1" / rel).parent.mkdir(parents=True, exist_ok=True)
            (dst / "1" / rel).write_text(f"# stand-in for the container's {model_dir.name}/1/{rel}\n")
    return out


def _kiln(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(KILN), *args], capture_output=True, text=True, timeout=600)


def test_cpu_host_stops_with_a_plan(cpu_build) -> None:
    assert "needs a GPU host" in cpu_build.error
    assert "CUDA" in cpu_build.error and "TensorRT-LLM" in cpu_build.error
    assert f"kiln build --resume {cpu_build.plan_path}" in cpu_build.error
    assert not (cpu_build.engines_root / "tiny-trtllm-fp8").exists()  # nothing half-published
    assert not list(cpu_build.engines_root.glob(".tmp-*"))
    plan = read_plan(cpu_build.plan_path)
    status = {s["name"]: s["status"] for s in plan["steps"]}
    assert status == {
        "hash-weights": "done",
        "calibrate": "done",
        "checkpoint": "done",
        "triton-repo": "done",
        "trtllm-build": "pending",
        "engine-manifest": "pending",
        "publish": "pending",
    }
    ckpt = get_step(plan, "checkpoint")["result"]
    assert ckpt["quant_algo"] == "FP8" and ckpt["kv_cache_quant_algo"] == "FP8" and ckpt["rotary_base"] > 0
    assert plan["manifest_draft"]["backend"] == "trtllm"
    assert plan["manifest_draft"]["source"]["weights"]
    for rel in ("checkpoint/config.json", "checkpoint/rank0.safetensors", "triton_repo/tensorrt_llm/config.pbtxt",
                "tokenizer/tokenizer.json", "calibration/hf_config.json", "recipe.resolved.yaml"):  # fmt: skip
        assert (cpu_build.pending / rel).is_file(), rel


def test_cli_exit_codes(cpu_build) -> None:
    r = _kiln("build", "tiny-trtllm-fp8", "--engines-dir", str(cpu_build.engines_root), "-q")
    assert r.returncode == 3, r.stderr
    assert "kiln build --resume" in r.stderr
    r = _kiln("build", "--resume", str(cpu_build.plan_path))
    assert r.returncode == 3, r.stderr
    # one message naming what this host has and what the pinned generation needs
    assert "does not match the pinned TensorRT-LLM generation" in r.stderr
    assert "tensorrt_llm: not importable, needs 1.2.1" in r.stderr and "GPU: none found" in r.stderr


def test_dry_run_prints_the_whole_plan_and_writes_nothing(tmp_path: Path) -> None:
    r = _kiln("build", "tiny-trtllm-fp8", "--engines-dir", str(tmp_path / "e"), "--dry-run")
    assert r.returncode == 0, r.stderr
    for step in ("calibrate", "checkpoint", "triton-repo", "trtllm-build", "engine-manifest", "publish"):
        assert step in r.stdout
    assert "trtllm-build --checkpoint_dir checkpoint --output_dir engine" in r.stdout
    assert not (tmp_path / "e" / ".pending").exists()
    assert not (tmp_path / "e" / "tiny-trtllm-fp8").exists()


def test_7b_without_its_model_folder_is_bad_input(tmp_path: Path) -> None:
    r = _kiln("build", "7b-fp8", "--engines-dir", str(tmp_path / "e"))
    assert r.returncode == 2
    assert "model.path" in r.stderr and "--model /path" in r.stderr
    assert not (tmp_path / "e" / ".pending").exists()


def test_model_override_is_checked_against_the_recipe_limits(stories_dir: Path, tmp_path: Path) -> None:
    r = _kiln("build", "7b-fp8", "--model", str(stories_dir), "--engines-dir", str(tmp_path / "e"))
    assert r.returncode == 2, r.stderr
    assert "limits.max_seq_len" in r.stderr and "max_position_embeddings (512)" in r.stderr
    # and, in the same message, the shape TensorRT-LLM's kernels would reject
    assert "head size 8" in r.stderr and "64, 80, 96" in r.stderr and "not a multiple of 16" in r.stderr
    assert not (tmp_path / "e" / ".pending").exists()


def test_resume_finishes_and_publishes(cpu_build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "engines"
    pending = root / ".pending" / "tiny-trtllm-fp8"
    shutil.copytree(cpu_build.pending, pending)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "trtllm-build"
    fake.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    upstream = stand_in_container_models(pending / "triton_repo", tmp_path / "inflight_batcher_llm")
    monkeypatch.setenv("LLMKILN_TRTLLM_MODELS", str(upstream))
    with pytest.raises(NeedsGpuHost):
        resume_build(pending / "plan.json")  # the host check still applies
    done = resume_build(pending / "plan.json", check_host=False)
    final = root / "tiny-trtllm-fp8"
    assert done.engine_dir == final.resolve()
    assert not pending.exists()
    for rel in ("engine/config.json", "engine/rank0.engine", "timing.cache", "manifest.json", "plan.json"):
        assert (final / rel).is_file(), rel
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["backend"] == "trtllm" and manifest["recipe"] == "tiny-trtllm-fp8"
    assert manifest["trtllm-engine"]["argv"][0] == "trtllm-build"
    assert "engine/rank0.engine" in manifest["engine_files"]
    assert all(s["status"] == "done" for s in read_plan(final / "plan.json")["steps"])
    repo = final / "triton_repo"
    assert check_trtllm_repository(repo, check_paths=True, require_model_files=True) == []
    assert (repo / "tensorrt_llm_bls" / "1" / "lib" / "decode.py").read_text().startswith("# stand-in")
    assert load_configs(repo)["tensorrt_llm"].parameters["gpt_model_path"].string_value == str(
        final.resolve() / "engine"
    )
    # The resumed manifest records the key `kiln build` computes: building again is a no-op.
    from llmkiln.backends import build as build_engine

    again = build_engine("tiny-trtllm-fp8", engines_root=root)
    assert again.cached and again.engine_dir == final.resolve()


def test_resume_refuses_container_model_files_that_do_not_match(
    cpu_build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container whose config.pbtxt has an input llmkiln does not generate: bad input naming the key, before
    trtllm-build runs (no stand-in build on PATH: reaching it would fail differently)."""
    from tritonclient.grpc import model_config_pb2 as mc

    from llmkiln.errors import BadInput

    pending = tmp_path / "engines" / ".pending" / "tiny-trtllm-fp8"
    shutil.copytree(cpu_build.pending, pending)
    upstream = stand_in_container_models(pending / "triton_repo", tmp_path / "inflight_batcher_llm")
    cfg = upstream / "tensorrt_llm" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + 'input { name: "retention_new_knob" data_type: TYPE_INT32 dims: 1 }\n')
    (upstream / "postprocessing" / "config.pbtxt").write_text(
        (upstream / "postprocessing" / "config.pbtxt")
        .read_text()
        .replace('key: "skip_special_tokens"', 'key: "x"')
    )
    monkeypatch.setenv("LLMKILN_TRTLLM_MODELS", str(upstream))
    with pytest.raises(BadInput) as exc:
        resume_build(pending / "plan.json", check_host=False)
    msg = str(exc.value)
    assert "tensorrt_llm: input 'retention_new_knob' is in the container's" in msg
    assert "postprocessing: parameter 'skip_special_tokens' is in llmkiln's config.pbtxt but not" in msg
    assert "postprocessing: parameter 'x' is in the container's" in msg
    assert not (pending / "engine").exists() and pending.is_dir()
    assert mc.ModelConfig  # the comparison parsed both sides as ModelConfig messages


def test_resume_with_stand_in_trtllm_packages_names_versions_and_gpu(cpu_build, tmp_path: Path) -> None:
    """`kiln build --resume` with stand-in tensorrt_llm / tensorrt packages of the wrong generation on the path:
    exit 3, one message naming what was found and what the pins need."""
    stand_ins = tmp_path / "site"
    for name, version in (("tensorrt_llm", "1.1.0"), ("tensorrt", "10.13.3.9")):
        (stand_ins / name).mkdir(parents=True)
        (stand_ins / name / "__init__.py").write_text(f'__version__ = "{version}"  # stand-in (tests only)\n')
    # stand-ins first, then whatever the caller put on the path (a worktree's checkout)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(stand_ins), os.environ.get("PYTHONPATH")) if p)
    )
    r = subprocess.run([str(KILN), "build", "--resume", str(cpu_build.plan_path)], capture_output=True, text=True,
                       timeout=300, env=env)  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "tensorrt_llm 1.1.0 found, needs 1.2.1" in r.stderr
    assert "tensorrt 10.13.3.9 found, needs 10.14.1.48" in r.stderr
    assert "GPU: none found, needs compute capability >= 8.9" in r.stderr
    assert "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3" in r.stderr
