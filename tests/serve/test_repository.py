"""config.pbtxt as a protobuf message; writing and checking repositories (no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.errors import BadInput
from llmkiln.recipe import Warmup
from llmkiln.serve.repository import (
    INPUTS,
    RepoSpec,
    build_model_config,
    check_repository,
    spec_from_engine,
    write_repository,
)


def test_config_matches_the_tensorrtllm_ensemble_io(recipe_engine_dir: Path):
    cfg = build_model_config(spec_from_engine(recipe_engine_dir))
    ins = {i.name: i for i in cfg.input}
    assert ins["text_input"].data_type == mc.TYPE_STRING and list(ins["text_input"].dims) == [1]
    assert ins["max_tokens"].data_type == mc.TYPE_INT32 and not ins["max_tokens"].optional
    assert ins["stream"].data_type == mc.TYPE_BOOL and ins["stream"].optional
    assert ins["random_seed"].data_type == mc.TYPE_UINT64
    assert ins["stop_words"].data_type == mc.TYPE_STRING and list(ins["stop_words"].dims) == [-1]
    outs = {o.name: o for o in cfg.output}
    assert outs["text_output"].data_type == mc.TYPE_STRING
    assert outs["first_token_time_ns"].data_type == mc.TYPE_INT64
    assert cfg.model_transaction_policy.decoupled and cfg.backend == "python" and cfg.max_batch_size == 1
    # the recipe's warmup section travels as a parameter: the engine host runs it in initialize()
    assert not cfg.model_warmup
    assert Warmup.model_validate_json(cfg.parameters["warmup"].string_value).num_requests() == 1
    # round trip through text_format
    again = text_format.Parse(text_format.MessageToString(cfg), mc.ModelConfig())
    assert again == cfg


def test_write_then_check(recipe_engine_dir: Path, tmp_path: Path):
    spec = spec_from_engine(recipe_engine_dir)
    spec.warmup = Warmup(prompts=["You are helpful.\n", "Once upon"], count=3, max_tokens=2)
    model_dir = write_repository(spec, tmp_path / "repo")
    assert (model_dir / "1" / "model.py").is_file()
    [m] = check_repository(tmp_path / "repo")
    assert m.name == "stories-fp32" or m.name == spec.model_name
    assert Warmup.model_validate_json(m.config.parameters["warmup"].string_value) == spec.warmup
    assert m.engine_dir == recipe_engine_dir.resolve()
    with pytest.raises(BadInput, match="not empty"):
        write_repository(spec, tmp_path / "repo")


def _break(config: Path, old: str, new: str) -> None:
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "data_type: TYPE_INT32\n  dims: 1\n}",
            "data_type: TYPE_FP32\n  dims: 1\n}",
            "'max_tokens' has data_type TYPE_FP32",
        ),
        ('backend: "python"', 'backend: "onnxruntime"', "needs 'python'"),
        ("decoupled: true", "decoupled: false", "decoupled must be true"),
        ('name: "text_input"', 'name: "prompt"', "required input 'text_input' is missing"),
        ("max_batch_size: 1", "max_batch_size: x", "not a valid model config"),
        ('key: "engine_dir"', 'key: "engine_path"', "'engine_dir'"),
    ],
)
def test_check_rejects_a_broken_repository(recipe_engine_dir: Path, tmp_path: Path, old, new, message):
    model_dir = write_repository(spec_from_engine(recipe_engine_dir), tmp_path / "repo")
    _break(model_dir / "config.pbtxt", old, new)
    with pytest.raises(BadInput, match=message):
        check_repository(tmp_path / "repo")


def test_check_rejects_missing_files(recipe_engine_dir: Path, tmp_path: Path):
    model_dir = write_repository(spec_from_engine(recipe_engine_dir), tmp_path / "repo")
    (model_dir / "1" / "model.py").unlink()
    with pytest.raises(BadInput) as exc:
        check_repository(tmp_path / "repo")
    assert "model.py" in str(exc.value)


def test_warmup_count_zero_means_no_warmup(recipe_engine_dir: Path, tmp_path: Path):
    spec = spec_from_engine(recipe_engine_dir)
    spec.warmup = Warmup(prompts=["a", "b"], count=0)
    cfg = build_model_config(spec)
    assert not cfg.model_warmup
    assert Warmup.model_validate_json(cfg.parameters["warmup"].string_value).num_requests() == 0


def test_every_input_is_optional_except_prompt_and_max_tokens():
    assert [n for n, (_t, _d, opt) in INPUTS.items() if not opt] == ["text_input", "max_tokens"]


def test_not_an_engine(tmp_path: Path):
    with pytest.raises(BadInput, match="not an engine folder"):
        spec_from_engine(tmp_path)
    with pytest.raises(BadInput, match="not an engine folder"):
        write_repository(RepoSpec("m", tmp_path), tmp_path / "repo")


def test_kiln_repo_cli_writes_checks_and_rejects(recipe_engine_dir: Path, tmp_path: Path):
    kiln = [sys.executable, "-m", "llmkiln.cli.main"]
    out = tmp_path / "repo"
    r = subprocess.run(
        [*kiln, "repo", str(recipe_engine_dir), "-o", str(out)], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*kiln, "repo", "--check", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "ok:" in r.stdout, r.stderr
    _break(next(out.glob("*/config.pbtxt")), "decoupled: true", "decoupled: false")
    r = subprocess.run([*kiln, "repo", "--check", str(out)], capture_output=True, text=True)
    assert r.returncode == 2 and "decoupled must be true" in r.stderr
