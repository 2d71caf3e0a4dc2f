"""The tensorrtllm Triton model set: protobuf configs, every parameter accounted for, no placeholders, warmup."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe
from llmkiln.trtllm import model_io as io
from llmkiln.trtllm.repo_check import check_trtllm_repository, load_configs
from llmkiln.trtllm.repository import (
    MODELS,
    TrtllmRepoSpec,
    build_configs,
    tokenize_warmup,
    write_trtllm_repository,
)

PROMPTS = ["You are a helpful assistant. Answer briefly.\n", "Once upon a time"]


@pytest.fixture()
def recipe():
    r, _ = load_recipe("tiny-trtllm-fp8", overrides={"warmup": {"prompts": PROMPTS, "count": 2}})
    return r


@pytest.fixture()
def spec(recipe, stories_dir: Path) -> TrtllmRepoSpec:
    ids, end_id, pad_id = tokenize_warmup(recipe, stories_dir)
    return TrtllmRepoSpec(recipe, Path("/srv/engines/x/engine"), stories_dir, ids, end_id, pad_id)


@pytest.fixture()
def repo(spec: TrtllmRepoSpec, tmp_path: Path) -> Path:
    return write_trtllm_repository(spec, tmp_path / "triton_repo")


def test_repository_parses_and_checks_clean(repo: Path) -> None:
    assert sorted(p.name for p in repo.iterdir()) == sorted(MODELS)
    for name in MODELS:
        text = (repo / name / "config.pbtxt").read_text()
        assert "${" not in text
        cfg = text_format.Parse(text, mc.ModelConfig())
        assert cfg.name == name
    for f in repo.rglob("*"):
        if f.is_file() and f.suffix in (".pbtxt", ".md"):
            assert "${" not in f.read_text()
    assert check_trtllm_repository(repo) == []


def test_every_template_parameter_is_filled_or_documented(repo: Path, recipe) -> None:
    cfgs = load_configs(repo)
    for name in MODELS:
        filled = set(cfgs[name].parameters)
        omitted = set(io.OMITTED_PARAMETERS.get(name, {}))
        if name == "tensorrt_llm" and recipe.trtllm.max_tokens_in_paged_kv_cache is None:
            omitted.add("max_tokens_in_paged_kv_cache")
        assert filled | omitted == set(io.UPSTREAM_PARAMETERS[name]), name
        assert not filled & omitted, name
    for key, value in cfgs["tensorrt_llm"].parameters.items():
        if key not in ("guided_decoding_backend", "xgrammar_tokenizer_info_path"):
            assert value.string_value, f"tensorrt_llm parameter {key} is empty"


def test_parameters_map_the_recipe(repo: Path, recipe) -> None:
    p = {k: v.string_value for k, v in load_configs(repo)["tensorrt_llm"].parameters.items()}
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["gpt_model_path"] == "/srv/engines/x/engine"
    assert p["enable_kv_cache_reuse"] == "true"
    assert p["enable_chunked_context"] == "true"
    assert p["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert float(p["kv_cache_free_gpu_mem_fraction"]) == recipe.kv_cache.free_gpu_memory_fraction
    assert p["exclude_input_in_output"] == "true"
    assert p["cuda_graph_mode"] == "false" and p["cuda_graph_cache_size"] == "0"
    assert p["max_attention_window_size"] == str(recipe.limits.max_seq_len)
    assert p["FORCE_CPU_ONLY_INPUT_TENSORS"] == "no"


def test_recipe_changes_reach_the_configs(spec: TrtllmRepoSpec) -> None:
    r, _ = load_recipe(
        "tiny-trtllm-fp8",
        overrides={
            "kv_cache": {"prefix_reuse": False, "free_gpu_memory_fraction": 0.5},
            "scheduler": {"max_batch_size": 3, "max_queue_size": 7},
            "trtllm": {
                "cuda_graph_mode": True,
                "cuda_graph_cache_size": 32,
                "batch_scheduler_policy": "max_utilization",
                "max_tokens_in_paged_kv_cache": 4096,
                "max_queue_delay_microseconds": 100,
            },
        },
    )
    spec.recipe = r
    cfgs = build_configs(spec)
    p = {k: v.string_value for k, v in cfgs["tensorrt_llm"].parameters.items()}
    assert p["enable_kv_cache_reuse"] == "false"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert p["cuda_graph_mode"] == "true" and p["cuda_graph_cache_size"] == "32"
    assert p["batch_scheduler_policy"] == "max_utilization"
    assert p["max_tokens_in_paged_kv_cache"] == "4096"
    trt = cfgs["tensorrt_llm"]
    assert trt.max_batch_size == 3
    assert list(trt.dynamic_batching.preferred_batch_size) == [3]
    assert trt.dynamic_batching.default_queue_policy.max_queue_size == 7
    assert trt.dynamic_batching.max_queue_delay_microseconds == 100
    assert {c.max_batch_size for c in cfgs.values()} == {3}


def test_streaming_models_are_decoupled(repo: Path) -> None:
    cfgs = load_configs(repo)
    assert cfgs["tensorrt_llm"].model_transaction_policy.decoupled
    assert cfgs["tensorrt_llm_bls"].model_transaction_policy.decoupled
    assert cfgs["tensorrt_llm"].backend == "tensorrtllm"
    assert cfgs["ensemble"].platform == "ensemble"
    assert {cfgs[m].backend for m in ("preprocessing", "postprocessing", "tensorrt_llm_bls")} == {"python"}
    ens_in = {i.name for i in cfgs["ensemble"].input}
    assert {"text_input", "max_tokens", "stream", "exclude_input_in_output"} <= ens_in
    assert "text_output" in {o.name for o in cfgs["ensemble"].output}


def test_warmup_primes_the_prefixes_with_preprocessing_token_ids(
    repo: Path, recipe, stories_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(stories_dir))
    cfg = load_configs(repo)["tensorrt_llm"]
    texts = [*recipe.warmup.prefixes, *PROMPTS]  # the shared prefixes first: they prime the KV block cache
    assert len(recipe.warmup.prefixes) == 1 and len(cfg.model_warmup) == len(texts)
    for i, (w, prompt) in enumerate(zip(cfg.model_warmup, texts, strict=True)):
        assert w.batch_size == 1 and w.count == 2
        raw = (repo / "tensorrt_llm" / "warmup" / w.inputs["input_ids"].input_data_file).read_bytes()
        ids = list(struct.unpack(f"<{len(raw) // 4}i", raw))
        assert ids == tok.encode(prompt, add_special_tokens=True), i
        assert ids[0] == tok.bos_token_id
        assert list(w.inputs["input_ids"].dims) == [len(ids)]
        out_len = (
            repo / "tensorrt_llm" / "warmup" / w.inputs["request_output_len"].input_data_file
        ).read_bytes()
        assert struct.unpack("<i", out_len)[0] == recipe.warmup.max_tokens
        assert {k for k in w.inputs} == {
            "input_ids",
            "input_lengths",
            "request_output_len",
            "end_id",
            "pad_id",
        }
        assert all(v.data_type == mc.TYPE_INT32 for v in w.inputs.values())


def test_checker_finds_broken_repositories(repo: Path) -> None:
    path = repo / "ensemble" / "config.pbtxt"
    cfg = text_format.Parse(path.read_text(), mc.ModelConfig())
    cfg.ensemble_scheduling.step[1].input_map["input_lengths"] = "_NOWHERE"
    path.write_text(text_format.MessageToString(cfg))
    problems = check_trtllm_repository(repo)
    assert any("_NOWHERE" in p for p in problems)
    trt = repo / "tensorrt_llm" / "config.pbtxt"
    trt.write_text(trt.read_text().replace('"inflight_fused_batching"', '"${batching_strategy}"'))
    with pytest.raises(BadInput, match="placeholder"):
        check_trtllm_repository(repo)


def test_python_model_files_come_from_upstream(repo: Path, spec: TrtllmRepoSpec, tmp_path: Path) -> None:
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        readme = (repo / name / "1" / "UPSTREAM.md").read_text()
        assert "triton_backend/all_models/inflight_batcher_llm" in readme
    assert any("missing" in p for p in check_trtllm_repository(repo, require_model_files=True))
    upstream = tmp_path / "inflight_batcher_llm"
    for name, files in {"preprocessing": ["model.py"], "postprocessing": ["model.py"],
                        "tensorrt_llm_bls": ["model.py", "lib/decode.py", "lib/triton_decoder.py"]}.items():  # fmt: skip
        for rel in files:
            f = upstream / name / "1" / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"# stand-in for upstream {name}/{rel}\n")
    out = write_trtllm_repository(spec, tmp_path / "repo2", upstream_models=upstream)
    assert check_trtllm_repository(out, require_model_files=True) == []


def test_warmup_prompt_longer_than_the_prompt_limit_is_bad_input(stories_dir: Path) -> None:
    r, _ = load_recipe("tiny-trtllm-fp8", overrides={"warmup": {"prompts": ["once upon a time " * 200]}})
    with pytest.raises(BadInput, match=r"warmup.prompts\[0\] is \d+ tokens, over the prompt limit 508"):
        tokenize_warmup(r, stories_dir)


def test_warmup_prefix_shorter_than_one_kv_block_is_bad_input(stories_dir: Path) -> None:
    r, _ = load_recipe("tiny-trtllm-fp8", overrides={"warmup": {"prefixes": ["You are helpful."]}})
    with pytest.raises(BadInput, match=r"warmup.prefixes\[0\] is \d+ tokens, shorter than one KV block"):
        tokenize_warmup(r, stories_dir)


@pytest.mark.slow
def test_the_built_repository_points_at_the_published_engine(cpu_build) -> None:
    repo = cpu_build.pending / "triton_repo"
    assert check_trtllm_repository(repo) == []
    p = load_configs(repo)["tensorrt_llm"].parameters
    final = cpu_build.engines_root / "tiny-trtllm-fp8"
    assert p["gpt_model_path"].string_value == str(final / "engine")
    assert load_configs(repo)["preprocessing"].parameters["tokenizer_dir"].string_value == str(
        final / "tokenizer"
    )
