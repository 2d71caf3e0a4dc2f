"""The recipe's `speculative:` section (backend trtllm-llmapi): mapped into speculative_config for both pinned
TensorRT-LLM versions (1.2.1 in the Triton container, 1.3.0rc29 in Dynamo's runtime), every key checked against
that version's facts, and rejected with exit 2 naming the field on every other backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmkiln.dynamo.deploy import DeployOptions, write_deployment
from llmkiln.errors import RecipeError
from llmkiln.recipe import load_recipe
from llmkiln.trtllm import pins
from llmkiln.trtllm.facts import facts, unknown_keys
from llmkiln.trtllm.llmapi import llm_api_options
from llmkiln.trtllm.smoke import _spec_counts

DRAFT = "/models/draft-llama"
EXPECTED = {  # (method, target) -> speculative_config
    ("ngram", "triton"): {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    ("ngram", "dynamo"): {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    ("draft_target", "triton"): {
        "decoding_type": "DraftTarget",
        "max_draft_len": 4,
        "speculative_model_dir": DRAFT,
    },
    ("draft_target", "dynamo"): {
        "decoding_type": "Draft_Target",
        "max_draft_len": 4,
        "speculative_model": DRAFT,
    },
    ("eagle3", "triton"): {
        "decoding_type": "Eagle",
        "max_draft_len": 4,
        "speculative_model_dir": DRAFT,
        "eagle3_one_model": True,
    },
    ("eagle3", "dynamo"): {  # no eagle3_one_model: gone from Eagle3DecodingConfig in 1.3.0rc27+
        "decoding_type": "Eagle3",
        "max_draft_len": 4,
        "speculative_model": DRAFT,
    },
}


def _recipe(method: str):
    section: dict[str, object] = {"method": method, "max_draft_len": 4}
    if method == "ngram":
        section["max_matching_ngram_size"] = 3
    else:
        section["draft_model"] = DRAFT
    return load_recipe("tiny-trtllm-llmapi", overrides={"speculative": section})[0]


@pytest.mark.parametrize(("method", "target"), sorted(EXPECTED))
def test_each_method_maps_to_the_targets_speculative_config(method: str, target: str) -> None:
    options = llm_api_options(_recipe(method), target=target)  # type: ignore[arg-type]
    assert options["speculative_config"] == EXPECTED[(method, target)]
    assert unknown_keys(options, target=target) == []  # type: ignore[arg-type]


def test_without_the_section_there_is_no_speculative_config() -> None:
    recipe, _ = load_recipe("tiny-trtllm-llmapi")
    assert recipe.speculative is None
    assert "speculative_config" not in llm_api_options(recipe)


def test_the_bundled_ngram_recipe_is_the_measured_one() -> None:
    recipe, _ = load_recipe("tiny-trtllm-llmapi-ngram")
    assert recipe.speculative is not None and recipe.speculative.method == "ngram"
    assert "tiny-trtllm-llmapi-ngram" in (Path(__file__).parents[2] / "scripts/gpu_verify.sh").read_text()


@pytest.mark.parametrize("target", ["triton", "dynamo"])
def test_speculative_keys_and_decoding_types_are_checked_against_the_facts(target: str) -> None:
    bad_key = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "max_ngram": 3}}
    assert unknown_keys(bad_key, target=target) == [  # type: ignore[arg-type]
        "speculative_config.max_ngram (not a NGramDecodingConfig field)"
    ]
    (problem,) = unknown_keys({"speculative_config": {"decoding_type": "Medusa"}}, target=target)  # type: ignore[arg-type]
    assert problem.startswith("speculative_config.decoding_type='Medusa' (allowed: NGram,")


def test_the_two_facts_files_name_their_versions_and_sources() -> None:
    assert facts("triton")["tensorrt_llm"] == pins.pin("tensorrt_llm") == "1.2.1"
    assert facts("dynamo")["tensorrt_llm"] == pins.pin("dynamo_tensorrt_llm") == "1.3.0rc29"
    for target in ("triton", "dynamo"):
        f = facts(target)  # type: ignore[arg-type]
        assert f["source"] and f["speculative"]["source"]
        for m in f["speculative"]["methods"].values():
            assert "decoding_type" in f["classes"][m["class"]]
            assert m["model_key"] is None or m["model_key"] in f["classes"][m["class"]]


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"method": "draft_target"}, "draft_model"),
        ({"method": "ngram", "draft_model": DRAFT}, "draft_model"),
        ({"method": "eagle3", "draft_model": DRAFT, "max_matching_ngram_size": 5}, "max_matching_ngram_size"),
        ({"method": "medusa"}, "method"),
    ],
)
def test_bad_sections_name_the_field(section: dict[str, object], field: str) -> None:
    with pytest.raises(RecipeError, match=field):
        load_recipe("tiny-trtllm-llmapi", overrides={"speculative": section})


@pytest.mark.parametrize("base", ["tiny-fp32", "tiny-trtllm-fp8"])
def test_other_backends_reject_the_section_with_exit_2_naming_it(base: str, tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(
        yaml.safe_dump({"name": "spec", "extends": base, "speculative": {"method": "ngram"}})
    )
    r = subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", "--recipes-dir", str(tmp_path), "recipe", "show", "spec"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "speculative: this section is only for backend(s) trtllm-llmapi" in r.stderr, r.stderr


def test_kiln_deploy_dynamo_writes_the_1_3_speculative_config_and_names_the_version(tmp_path: Path) -> None:
    pytest.importorskip(
        "dynamo", reason="kiln deploy dynamo reads the ai-dynamo wheel's templates (make setup installs it)"
    )
    out = tmp_path / "deploy"
    write_deployment(
        "tiny-trtllm-llmapi-ngram", out, DeployOptions(workers=1, engines_root=tmp_path / "none")
    )
    version = pins.pin("dynamo_tensorrt_llm")
    llm_api = (out / "llm_api.yaml").read_text()
    assert llm_api.startswith(f"# TensorRT-LLM {version} (Dynamo {pins.pin('dynamo')}'s dynamo.trtllm")
    assert yaml.safe_load(llm_api)["speculative_config"]["decoding_type"] == "NGram"
    written = sorted(out.glob("*.yaml"))
    assert len(written) == 3  # the DynamoGraphDeployment, llm_api.yaml and its ConfigMap
    for path in written:
        assert path.read_text().startswith(f"# TensorRT-LLM {version} "), path
    cm = yaml.safe_load(next(out.glob("*configmap*.yaml")).read_text())
    assert next(iter(cm["data"].values())).startswith(f"# TensorRT-LLM {version}")
    assert version in (out / "README.md").read_text()


def test_acceptance_counts_are_read_from_iteration_stats() -> None:
    stats = [
        {"iter": 1, "specDecodingStats": {"numDraftTokens": 8, "numAcceptedTokens": 5}},
        '{"iter": 2, "specDecodingStats": {"numDraftTokens": 4, "numAcceptedTokens": 1}}',
        {"iter": 3},
    ]
    assert _spec_counts(stats) == (12, 6)


# DecodingBaseConfig at v1.3.0rc29 (https://nvidia.github.io/TensorRT-LLM/1.3.0rc29/llm-api/reference/
# AutoDecodingConfig.html): every speculative class of Dynamo's TensorRT-LLM has these fields.
RC29_DECODING_BASE = {
    "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model", "moe_backend",
    "max_concurrency", "draft_len_schedule", "load_format", "acceptance_rate_window_size",
    "acceptance_rate_threshold", "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode",
    "enable_penalty",
}  # fmt: skip


def test_the_1_3_0rc29_facts_are_the_tags() -> None:
    """The rc29 facts were an older copy: acceptance_window / acceptance_length_threshold instead of rc29's
    acceptance_rate_window_size / acceptance_rate_threshold, and eagle3_one_model, gone since 1.3.0rc27."""
    f = facts("dynamo")
    assert f["read"]["tag"] == "v1.3.0rc29" and "1.3.0rc29" in f["read"]["speculative_classes"]
    for m in f["speculative"]["methods"].values():
        fields = set(f["classes"][m["class"]])
        assert RC29_DECODING_BASE <= fields, m["class"]
        assert not {"acceptance_window", "acceptance_length_threshold"} & fields, m["class"]
    assert "eagle3_one_model" not in f["classes"]["Eagle3DecodingConfig"]
    assert (
        "eagle3_one_model"
        in facts("triton")["classes"][facts("triton")["speculative"]["methods"]["eagle3"]["class"]]
    )


def test_dynamo_gets_no_eagle3_one_model_and_the_facts_refuse_it() -> None:
    options = llm_api_options(_recipe("eagle3"), target="dynamo")
    assert "eagle3_one_model" not in options["speculative_config"]
    assert unknown_keys(options, target="dynamo") == []
    stale = {"speculative_config": dict(options["speculative_config"], eagle3_one_model=True)}
    assert unknown_keys(stale, target="dynamo") == [
        "speculative_config.eagle3_one_model (not a Eagle3DecodingConfig field)"
    ]
    rc29_gate = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4,
                                         "acceptance_rate_window_size": 32, "acceptance_rate_threshold": 0.3}}  # fmt: skip
    assert unknown_keys(rc29_gate, target="dynamo") == []
