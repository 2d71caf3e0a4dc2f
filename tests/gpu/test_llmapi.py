"""Backend trtllm-llmapi, produced entirely on this CPU host with exit 0: the ModelOpt HF checkpoint with hashes
in the manifest, llm_api_options.yaml whose keys are all in the pinned LlmArgs facts, the Triton llmapi
repository (model_config_pb2, upstream I/O names, warmup), the deploy commands, and the deploy-time comparison
with the container's model files (stand-in folders written here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe
from llmkiln.trtllm.facts import check_options, fields, unknown_keys
from llmkiln.trtllm.llmapi import llm_api_options
from llmkiln.trtllm.llmapi_repo import LLMAPI_INPUTS, LLMAPI_OUTPUTS, check_llmapi_repository
from llmkiln.trtllm.upstream import check_and_take, compare

KILN = Path(sys.executable).with_name("kiln")
RECIPE = "tiny-trtllm-llmapi"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`kiln build tiny-trtllm-llmapi` once (calibration included); it must end with exit 0 on this host."""
    root = tmp_path_factory.mktemp("llmapi-engines")
    r = subprocess.run([str(KILN), "build", RECIPE, "--engines-dir", str(root), "-q"], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return root / RECIPE


@pytest.mark.parametrize("name", ["tiny-trtllm-llmapi", "7b-fp8-llmapi"])
def test_options_only_use_keys_of_the_pinned_llm_args(name: str) -> None:
    recipe, _ = load_recipe(name)
    options = llm_api_options(recipe)
    assert unknown_keys(options) == []
    assert set(options) <= fields("TorchLlmArgs")
    assert set(options["kv_cache_config"]) <= fields("KvCacheConfig")
    assert set(options["scheduler_config"]) <= fields("SchedulerConfig")
    assert set(options["cuda_graph_config"]) <= fields("CudaGraphConfig")


def test_options_map_the_recipe() -> None:
    recipe, _ = load_recipe("7b-fp8-llmapi")
    o = llm_api_options(recipe)
    assert (o["max_batch_size"], o["max_num_tokens"], o["max_seq_len"], o["max_input_len"]) == (
        64,
        8192,
        4096,
        3072,
    )
    assert o["enable_chunked_prefill"] is True
    assert o["kv_cache_config"] == {"enable_block_reuse": True, "dtype": "fp8", "free_gpu_memory_fraction": 0.9,
                                    "tokens_per_block": 32}  # fmt: skip
    assert o["cuda_graph_config"] == {"enable_padding": True, "batch_sizes": [1, 2, 4, 8, 16, 32, 64]}
    assert o["scheduler_config"] == {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT",
                                     "context_chunking_policy": "FIRST_COME_FIRST_SERVED"}  # fmt: skip
    off, _ = load_recipe("7b-fp8-llmapi", overrides={"llmapi": {"cuda_graphs": False}, "scheduler": {
        "chunked_prefill": False}, "trtllm": {"max_tokens_in_paged_kv_cache": 4096}})  # fmt: skip
    o = llm_api_options(off)
    assert o["cuda_graph_config"] is None and "context_chunking_policy" not in o["scheduler_config"]
    assert o["kv_cache_config"]["max_tokens"] == 4096


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(
        BadInput, match=r"kv_cache_config.enable_prefix_caching \(not a KvCacheConfig field\)"
    ):
        check_options({"kv_cache_config": {"enable_prefix_caching": True}}, "x.yaml")
    assert unknown_keys({"use_cuda_graph": True}) == ["use_cuda_graph (not a TorchLlmArgs field)"]
    assert (
        "capacity_scheduler_policy='FIFO'"
        in unknown_keys({"scheduler_config": {"capacity_scheduler_policy": "FIFO"}})[0]
    )


def test_the_build_ends_with_a_complete_engine_folder(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["backend"] == "trtllm-llmapi"
    ckpt = manifest["llmapi-checkpoint"]["checkpoint"]
    assert ckpt["quant_algo"] == "FP8" and ckpt["kv_cache_quant_algo"] == "FP8"
    for name in ("model.safetensors", "config.json", "hf_quant_config.json", "tokenizer.json"):
        assert len(ckpt["sha256"][name]) == 64
        assert manifest["engine_files"][f"hf_checkpoint/{name}"] == ckpt["sha256"][name]
    cfg = json.loads((built / "hf_checkpoint" / "config.json").read_text())
    assert (
        cfg["rope_theta"] == 10000.0 and "rope_scaling" not in cfg
    )  # readable by the container's transformers
    assert not (built / "calibration" / "trtllm_checkpoint").exists()
    options = yaml.safe_load((built / "llm_api_options.yaml").read_text())
    recipe, _ = load_recipe(RECIPE)
    assert options == llm_api_options(recipe)


def test_the_repository_parses_with_model_config_pb2_and_names_the_upstream_io(built: Path) -> None:
    repo = built / "triton_repo"
    assert check_llmapi_repository(repo) == []
    cfg = text_format.Parse((repo / "tensorrt_llm" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert cfg.name == "tensorrt_llm" and cfg.backend == "python"
    assert cfg.max_batch_size == 0 and not cfg.HasField("model_transaction_policy")  # set by model.yaml
    assert [i.name for i in cfg.input] == [n for n, *_ in LLMAPI_INPUTS]
    assert [o.name for o in cfg.output] == [n for n, *_ in LLMAPI_OUTPUTS]
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert doc["model"] == str(built / "hf_checkpoint") and doc["backend"] == "pytorch"
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()  # taken from the container at deploy time
    recipe, _ = load_recipe(RECIPE)
    texts = [*recipe.warmup.prefixes, *recipe.warmup.prompts]
    assert len(cfg.model_warmup) == len(texts)
    for w, text in zip(cfg.model_warmup, texts, strict=True):
        raw = (repo / "tensorrt_llm" / "warmup" / w.inputs["text_input"].input_data_file).read_bytes()
        assert raw[4:].decode() == text and int.from_bytes(raw[:4], "little") == len(text.encode())
    tokens = json.loads((built / "manifest.json").read_text())["llmapi-repo"]["warmup_tokens"]
    assert tokens[0] >= recipe.kv_cache.tokens_per_block  # the prefix fills at least one KV block


def test_deploy_commands_are_written_beside_the_artifacts(built: Path) -> None:
    cmds = json.loads((built / "deploy.json").read_text())
    assert cmds["container"] == "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3"
    docker = cmds["docker_run"]
    assert "--shm-size=2g" in docker and f"{built}:{built}" in docker and "pip" not in docker
    assert cmds["trtllm_serve"][:4] == ["trtllm-serve", str(built / "hf_checkpoint"), "--backend", "pytorch"]
    assert cmds["trtllm_serve"][-1] == str(built / "llm_api_options.yaml")
    assert "--host" in cmds["trtllm_serve"] and "127.0.0.1" in cmds["trtllm_serve"]
    assert (
        cmds["take_model_files"][0] == "cp"
        and "/app/all_models/llmapi/tensorrt_llm/1/model.py" in cmds["take_model_files"]
    )
    deploy_md = (built / "DEPLOY.md").read_text()
    assert "trtllm-serve" in deploy_md
    # the launcher caveat: upstream's launch_triton_server.py skips the auto_complete_config that applies decoupled
    assert "launch_triton_server.py" in deploy_md and "--disable-auto-complete-config" in deploy_md
    assert "decoupled" in deploy_md


def test_the_options_file_header_names_the_tensorrt_llm_it_targets(built: Path) -> None:
    header = (built / "llm_api_options.yaml").read_text().splitlines()[0]
    assert header.startswith(
        "# LLM(**kwargs) for TensorRT-LLM 1.2.1 (PyTorch backend) in nvcr.io/nvidia/tritonserver:26.05"
    )


def _stand_in_llmapi(built: Path, out: Path) -> Path:
    """A stand-in for the container's /app/all_models/llmapi: the same config.pbtxt, stub model code."""
    model = out / "tensorrt_llm"
    (model / "1").mkdir(parents=True)
    shutil.copyfile(built / "triton_repo" / "tensorrt_llm" / "config.pbtxt", model / "config.pbtxt")
    for f in ("model.py", "helpers.py"):
        (model / "1" / f).write_text(f"# stand-in for the container's {f}\n")
    return out


def test_model_files_are_taken_from_the_container_after_the_comparison(built: Path, tmp_path: Path) -> None:
    repo = tmp_path / "triton_repo"
    shutil.copytree(built / "triton_repo", repo)
    upstream = _stand_in_llmapi(built, tmp_path / "llmapi")
    assert compare(repo, upstream) == []
    assert check_and_take(repo, upstream) == ["tensorrt_llm/1/model.py", "tensorrt_llm/1/helpers.py"]
    assert check_llmapi_repository(repo, require_model_files=True) == []
    r = subprocess.run([str(KILN), "repo", "--check", str(repo), "--upstream-models", str(upstream)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0 and "matches the container's model files" in r.stdout, r.stderr
    cfg = upstream / "tensorrt_llm" / "config.pbtxt"
    cfg.write_text(
        cfg.read_text().replace('name: "sampling_param_seed"', 'name: "sampling_param_random_seed"')
    )
    r = subprocess.run([str(KILN), "repo", "--check", str(repo), "--upstream-models", str(upstream)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2
    assert "tensorrt_llm: input 'sampling_param_random_seed' is in the container's" in r.stderr
    assert "tensorrt_llm: input 'sampling_param_seed' is in llmkiln's config.pbtxt but not" in r.stderr


@pytest.mark.parametrize("command", [["serve"], ["generate", "--max-tokens", "2"], ["verify"]])
def test_llmkiln_runtime_commands_refuse_it_and_name_its_deploy_file(built: Path, command: list[str]) -> None:
    """serve / generate exit 2 naming the backend and the folder's DEPLOY.md (nothing started); verify, which
    only checks files, still works."""
    args = [str(KILN), command[0], str(built), *(["Once upon a time"] if command[0] == "generate" else [])]
    r = subprocess.run([*args, *command[1:]], capture_output=True, text=True, timeout=120)
    if command[0] == "verify":
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "trtllm-llmapi" in r.stderr and str(built / "DEPLOY.md") in r.stderr.replace("\n", ""), r.stderr
