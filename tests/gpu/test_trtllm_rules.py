"""No silently ignored settings on the trtllm backends, and models TensorRT-LLM's kernels cannot run rejected
at once (exit 2, before anything is written), naming the value and the supported set."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmkiln.build.generate import get_spec
from llmkiln.errors import RecipeError
from llmkiln.recipe import load_recipe
from llmkiln.trtllm.rules import model_problems, recipe_problems

KILN = Path(sys.executable).with_name("kiln")


@pytest.mark.parametrize("name", ["tiny-trtllm-fp8", "7b-fp8", "tiny-trtllm-llmapi", "7b-fp8-llmapi"])
def test_bundled_trtllm_recipes_are_clean(name: str) -> None:
    recipe, _ = load_recipe(name)
    assert recipe_problems(recipe) == []


@pytest.mark.parametrize(
    ("recipe", "overrides", "expected"),
    [
        ("tiny-trtllm-fp8", {"kv_cache": {"dtype": "fp16"}}, "kv_cache.dtype: 'fp16'"),
        ("tiny-trtllm-fp8", {"scheduler": {"policy": "priority"}}, "scheduler.policy: 'priority'"),
        ("tiny-trtllm-fp8", {"trtllm": {"use_fp8_context_fmha": False}}, "forces FP8 context FMHA on"),
        (
            "tiny-trtllm-fp8",
            {"trtllm": {"cuda_graph_mode": True}},
            "cuda_graph_cache_size: 0 with cuda_graph_mode",
        ),
        (
            "tiny-trtllm-fp8",
            {"trtllm": {"cuda_graph_cache_size": 8}},
            "has no effect with cuda_graph_mode false",
        ),
        (
            "tiny-trtllm-fp8",
            {"scheduler": {"chunked_prefill": False, "max_num_tokens": 512}, "limits": {"max_seq_len": 1024}},
            "scheduler.max_num_tokens: 512 is below limits.max_seq_len",
        ),
        ("tiny-trtllm-llmapi", {"scheduler": {"batching": "static"}}, "batches in flight only"),
        (
            "tiny-trtllm-llmapi",
            {"llmapi": {"cuda_graph_batch_sizes": [1, 64]}},
            "[64] exceed scheduler.max_batch",
        ),
        (
            "tiny-trtllm-llmapi",
            {"llmapi": {"cuda_graphs": False, "cuda_graph_batch_sizes": [1, 2]}},
            "no effect with llmapi.cuda_graphs false",
        ),
    ],
)
def test_fields_trtllm_would_ignore_are_rejected(recipe: str, overrides: dict, expected: str) -> None:
    r, _ = load_recipe(recipe, overrides=overrides)
    problems = recipe_problems(r)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("recipe", "overrides", "expected"),
    [
        (
            "tiny-trtllm-fp8",
            {"scheduler": {"max_prefill_tokens": 256}},
            "scheduler.max_prefill_tokens: not used",
        ),
        ("tiny-trtllm-fp8", {"scheduler": {"intra_op_threads": 2}}, "scheduler.intra_op_threads: not used"),
        ("tiny-trtllm-fp8", {"kv_cache": {"max_bytes": 1024}}, "kv_cache.max_bytes: not used"),
        ("tiny-trtllm-fp8", {"limits": {"max_input_len": 300}}, "trtllm-build ignores --max_input_len"),
        ("tiny-trtllm-fp8", {"llmapi": {"cuda_graphs": False}}, "llmapi: this section is only for backend"),
        (
            "tiny-trtllm-llmapi",
            {"trtllm": {"gemm_plugin": "auto"}},
            "trtllm.gemm_plugin: not used by backend",
        ),
        ("tiny-trtllm-llmapi", {"scheduler": {"max_queue_size": 9}}, "scheduler.max_queue_size: not used"),
        ("tiny-fp32", {"llmapi": {"disable_overlap_scheduler": True}}, "llmapi: this section is only for"),
    ],
)
def test_fields_a_backend_does_not_honour_are_refused_by_the_schema(
    recipe: str, overrides: dict, expected: str
) -> None:
    with pytest.raises(RecipeError, match=re.escape(expected)):
        load_recipe(recipe, overrides=overrides)


def test_resolved_recipe_checks_the_same_as_its_file() -> None:
    """A field counts as set when it differs from the default, so a resolved recipe (all fields written) passes."""
    from llmkiln.recipe import validate

    r, _ = load_recipe("7b-fp8")
    again = validate(r.model_dump(mode="json"), "resolved")
    assert recipe_problems(again) == []


def test_head_size_and_fp8_alignment() -> None:
    assert model_problems(get_spec("gpu-smoke-llama").hf_config()) == []
    assert model_problems(get_spec("bench-llama-125m").hf_config()) == []
    problems = model_problems(get_spec("tiny-llama").hf_config())
    assert (
        problems[0].startswith("head size 16 ")
        and "supported: 32, 48, 64, 80, 96, 104, 112, 128" in problems[0]
    )
    assert "intermediate_size 344 is not a multiple of 16" in problems[1]
    llama3 = {"num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096, "head_dim": 128,
              "intermediate_size": 14336, "vocab_size": 128256}  # fmt: skip
    assert model_problems(llama3) == []


def test_a_generated_model_with_an_unsupported_head_size_is_rejected_before_anything_is_written(
    tmp_path: Path,
) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "bad-head.yaml").write_text(
        "name: bad-head\nextends: tiny-trtllm-llmapi\nmodel:\n  generated: tiny-llama\n  seed: 0\n"
    )
    engines = tmp_path / "engines"
    r = subprocess.run([str(KILN), "--recipes-dir", str(recipes), "build", "bad-head", "--engines-dir", str(engines)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "model (generated tiny-llama): head size 16" in r.stderr
    assert "supported: 32, 48, 64, 80, 96, 104, 112, 128, 144, 160, 192, 224, 256" in r.stderr
    assert "intermediate_size 344" in r.stderr
    assert not engines.exists() or not any(engines.rglob("config.json"))  # not even the model was generated
