"""The trtllm-build argv and the plan file: every flag known, every value valid, the recipe mapped exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe
from llmkiln.trtllm.flags import TRTLLM_BUILD_FLAGS, parse_argv
from llmkiln.trtllm.plan import (
    build_argv,
    check_recipe,
    get_step,
    make_plan,
    read_plan,
    render_plan,
    validate_argv,
    write_plan,
)

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "trtllm-triton.md"
RECIPES = ("7b-fp8", "tiny-trtllm-fp8")


def _flags(recipe_name: str) -> tuple[list[str], dict]:
    recipe, _ = load_recipe(recipe_name)
    argv = build_argv(recipe)
    return argv, parse_argv(argv)


@pytest.mark.parametrize("name", RECIPES)
def test_argv_maps_the_recipe(name: str) -> None:
    recipe, _ = load_recipe(name)
    argv, f = _flags(name)
    assert argv[0] == "trtllm-build"
    t = recipe.trtllm
    expected = {
        "--checkpoint_dir": "checkpoint",
        "--output_dir": "engine",
        "--max_batch_size": str(recipe.scheduler.max_batch_size),
        "--max_seq_len": str(recipe.limits.max_seq_len),
        "--max_num_tokens": str(recipe.scheduler.max_num_tokens),
        "--tokens_per_block": str(recipe.kv_cache.tokens_per_block),
        "--kv_cache_type": "paged",
        "--gpt_attention_plugin": t.gpt_attention_plugin,
        "--gemm_plugin": t.gemm_plugin,
        "--use_paged_context_fmha": "enable" if t.use_paged_context_fmha else "disable",
        "--use_fp8_context_fmha": "enable" if t.use_fp8_context_fmha else "disable",
        "--multiple_profiles": "enable" if t.multiple_profiles else "disable",
        "--use_fused_mlp": "enable" if t.use_fused_mlp else "disable",
        "--max_beam_width": str(t.max_beam_width),
        "--workers": str(t.workers),
    }
    for flag, value in expected.items():
        assert f[flag] == value, flag
    # trtllm-build ignores --max_input_len with remove_input_padding + context FMHA: not passed at all
    assert "--max_input_len" not in f


@pytest.mark.parametrize("name", RECIPES)
def test_every_flag_is_in_the_reference_flag_list(name: str) -> None:
    """Each flag of the argv is in our table and in ../shared/reference/trtllm-triton.md (§1.5)."""
    if not REFERENCE.is_file():
        pytest.skip(f"{REFERENCE} is absent (../shared next to the checkout)")
    text = REFERENCE.read_text()
    documented = set(re.findall(r"(--[a-z][a-z0-9_]+)", text))
    argv, _ = _flags(name)
    for flag in (a for a in argv if a.startswith("--")):
        assert flag in TRTLLM_BUILD_FLAGS
        assert flag in documented, f"{flag} is not in the reference flag list"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (["--no_such_flag", "1"], "unknown flag '--no_such_flag'"),
        (["--tokens_per_block", "48"], "power of two"),
        (["--gemm_plugin", "fp9"], "is not one of"),
        (["--max_batch_size", "0"], "must be positive"),
        (["--max_num_tokens", "many"], "not an integer"),
        (["--paged_kv_cache", "enable"], "deprecated"),
    ],
)
def test_bad_argv_is_rejected(patch: list[str], message: str) -> None:
    argv, _ = _flags("tiny-trtllm-fp8")
    if patch[0] in argv:  # a bad value for a flag the argv has: replace it
        argv[argv.index(patch[0]) + 1] = patch[1]
    else:
        argv += patch
    with pytest.raises(BadInput, match=message):
        validate_argv(argv)


def test_repeated_or_valueless_flags_are_rejected() -> None:
    argv, _ = _flags("tiny-trtllm-fp8")
    with pytest.raises(BadInput, match="given twice"):
        validate_argv(argv + ["--max_seq_len", "1024"])
    with pytest.raises(BadInput, match="needs a value"):
        validate_argv(argv + ["--logits_dtype"])
    with pytest.raises(BadInput, match="must start with 'trtllm-build'"):
        validate_argv(["python", *argv[1:]])


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (("--context_fmha", "disable"), "needs --context_fmha enable"),
        (("--kv_cache_type", "continuous"), "kv_cache_type paged"),
        (("--remove_input_padding", "disable"), "remove_input_padding"),
        (("--output_dir", "/abs/engine"), "inside the plan folder"),
        (("--checkpoint_dir", "../elsewhere"), "inside the plan folder"),
    ],
)
def test_builder_rules(replace: tuple[str, str], message: str) -> None:
    argv, _ = _flags("tiny-trtllm-fp8")
    i = argv.index(replace[0])
    argv[i + 1] = replace[1]
    with pytest.raises(BadInput, match=message):
        validate_argv(argv)


def test_opt_num_tokens_conflicts_with_multiple_profiles() -> None:
    argv, _ = _flags("7b-fp8")  # multiple_profiles enable
    with pytest.raises(BadInput, match="opt_num_tokens"):
        validate_argv(argv + ["--opt_num_tokens", "512"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"trtllm": {"use_paged_context_fmha": False}}, "trtllm.use_paged_context_fmha"),
        ({"scheduler": {"batching": "static"}}, "scheduler.batching"),
    ],
)
def test_build_flag_combinations_trtllm_would_reject(overrides: dict, field: str) -> None:
    recipe, path = load_recipe("tiny-trtllm-fp8", overrides=overrides)
    with pytest.raises(BadInput, match=re.escape(field)):
        check_recipe(recipe, str(path))


def test_plan_round_trip_and_tampering(tmp_path: Path) -> None:
    recipe, path = load_recipe("7b-fp8")
    plan = make_plan(recipe, recipe_file=path, done={"hash-weights": {"files": 3}}, publish_to="../../7b-fp8")
    write_plan(tmp_path / "plan.json", plan)
    back = read_plan(tmp_path)
    assert get_step(back, "trtllm-build")["argv"] == build_argv(recipe)
    assert [s["status"] for s in back["steps"]][:2] == ["done", "pending"]
    assert get_step(back, "trtllm-build")["where"] == "gpu"
    assert back["pins"]["container"].startswith("nvcr.io/nvidia/tritonserver:")
    assert "trtllm-build --checkpoint_dir checkpoint" in render_plan(back)
    data = json.loads((tmp_path / "plan.json").read_text())
    get_step(data, "trtllm-build")["argv"] += ["--frobnicate", "yes"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match="unknown flag '--frobnicate'"):
        read_plan(tmp_path / "plan.json")
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(BadInput, match="not an llmkiln TensorRT-LLM plan"):
        read_plan(tmp_path / "plan.json")
