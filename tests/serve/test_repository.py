"""config.pbtxt as a protobuf message; writing and checking repositories (no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from llmkiln.errors import BadInput, RecipeError
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole
from llmkiln.recipe import Warmup, load_recipe
from llmkiln.serve.http_checks import GENERATE_INPUTS
from llmkiln.serve.repository import (
    INPUTS,
    RepoSpec,
    build_model_config,
    check_repository,
    role_options,
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


def test_a_killed_writers_temp_folder_does_not_block_the_next_write(recipe_engine_dir: Path, tmp_path: Path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / "repo" / f".tmp-repo@{int(gone.stdout)}-x"  # its writer exited mid-write
    stale.mkdir(parents=True)
    model_dir = write_repository(spec_from_engine(recipe_engine_dir), tmp_path / "repo")
    assert not stale.exists() and (model_dir / "1" / "model.py").is_file()


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


BAD_NAMES = ["..", ".", ".hidden", "-x", "a/b", "../escape", "a\\b", "x" * 129, "", "na me"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_model_names_are_refused_in_the_recipe_and_the_repository(name: str, tmp_path: Path):
    """Issue 21, finding 11: serve.model_name '..' was accepted (and wrote outside the -o folder)."""
    recipe = tmp_path / "named.yaml"
    recipe.write_text(
        yaml.safe_dump({"name": "named", "model": {"generated": "tiny-llama"}, "serve": {"model_name": name}})
    )
    with pytest.raises(RecipeError, match="serve.model_name"):
        load_recipe(recipe)
    with pytest.raises(BadInput, match="a Triton model name is"):
        RepoSpec(name, tmp_path)


def test_safe_model_names_pass(tmp_path: Path):
    for name in ("llmkiln", "my.model-1", "_x", "A" * 128):
        assert RepoSpec(name, tmp_path).model_name == name


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_kiln_repo_writes_nothing_outside_its_folder(recipe_engine_dir: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    before = _tree(tmp_path)
    for name in ("..", "../../x", "a/../.."):
        r = _kiln("repo", str(recipe_engine_dir), "-o", str(work / "repo"), "--model-name", name)
        assert r.returncode == 2 and "a Triton model name is" in r.stderr and "Traceback" not in r.stderr, (
            r.stderr
        )
        assert _tree(tmp_path) == before  # nothing outside, and no -o folder either
    # an engine whose resolved recipe names '..' (edited after the build): refused when it is read
    resolved = recipe_engine_dir / "recipe.resolved.yaml"
    data = yaml.safe_load(resolved.read_text())
    data["serve"]["model_name"] = ".."
    resolved.write_text(yaml.safe_dump(data))
    before = _tree(tmp_path)
    r = _kiln("repo", str(recipe_engine_dir), "-o", str(work / "repo"))
    assert r.returncode == 2 and "serve.model_name" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _tree(tmp_path) == before


def test_a_failed_write_leaves_nothing(recipe_engine_dir: Path, tmp_path: Path, monkeypatch):
    from llmkiln.serve import repository

    spec = spec_from_engine(recipe_engine_dir)
    old = write_repository(spec, tmp_path / "kept")
    (tmp_path / "empty").mkdir()

    def fail(repo: Path):
        raise BadInput("broken on purpose")

    monkeypatch.setattr(repository, "check_repository", fail)
    before = _tree(tmp_path)
    for out, overwrite in (
        (tmp_path / "new" / "repo", False),
        (tmp_path / "empty", False),
        (tmp_path / "kept", True),
    ):
        with pytest.raises(BadInput, match="broken on purpose"):
            write_repository(spec, out, overwrite=overwrite)
        assert _tree(tmp_path) == before, out  # no temp folder, no half-written model, the old one intact
    assert (old / "config.pbtxt").is_file()
    monkeypatch.undo()
    (old / "stale-file").write_text("x")
    again = write_repository(spec, tmp_path / "kept", overwrite=True)
    assert again == old and sorted(p.name for p in (tmp_path / "kept").iterdir()) == [spec.model_name]
    assert not (old / "stale-file").exists()


def test_a_role_and_its_kv_options_travel_as_parameters_and_come_back(
    recipe_engine_dir: Path, tmp_path: Path
):
    kv = KvTransferOptions(export_timeout_s=5.0, max_local_prefill_tokens=0)
    spec = spec_from_engine(recipe_engine_dir, role=WorkerRole.DECODE, kv=kv)
    model_dir = write_repository(spec, tmp_path / "repo")
    [m] = check_repository(tmp_path / "repo")
    params = {k: v.string_value for k, v in m.config.parameters.items()}
    assert params["role"] == "decode"
    back = role_options(params)
    assert back.role is WorkerRole.DECODE and back.kv == kv
    # an aggregated model writes its role and no KV options; its parameters give the default host options
    agg = build_model_config(spec_from_engine(recipe_engine_dir))
    agg_params = {k: v.string_value for k, v in agg.parameters.items()}
    assert agg_params["role"] == "aggregated" and "kv_transfer" not in agg_params
    assert role_options(agg_params) == role_options({})
    # a hand-off input and output on every model: a decode model takes it, a prefill model answers with it
    assert {i.name for i in agg.input} >= {"disaggregated_params"}
    assert {o.name for o in agg.output} >= {"disaggregated_params"}
    _break(model_dir / "config.pbtxt", 'string_value: "decode"', 'string_value: "encode"')
    with pytest.raises(BadInput, match="parameter role='encode': give one of aggregated, prefill, decode"):
        check_repository(tmp_path / "repo")


def test_kv_options_on_an_aggregated_model_are_refused_naming_the_flag(recipe_engine_dir: Path):
    with pytest.raises(
        BadInput, match="--kv-export-timeout: KV transfer option.s. of the prefill and decode"
    ):
        spec_from_engine(recipe_engine_dir, kv=KvTransferOptions(export_timeout_s=5.0))
    with pytest.raises(BadInput, match="parameter kv_transfer is not a JSON object"):
        role_options({"role": "prefill", "kv_transfer": '{"export_timeout": 5}'})
    with pytest.raises(BadInput, match="--max-local-prefill-tokens must be >= 0"):
        role_options({"role": "prefill", "kv_transfer": '{"max_local_prefill_tokens": -1}'})


def test_the_http_fronts_generate_inputs_are_the_models_inputs():
    wire = {mc.TYPE_STRING: "BYTES", mc.TYPE_INT32: "INT32", mc.TYPE_BOOL: "BOOL", mc.TYPE_FP32: "FP32"}
    wire[mc.TYPE_UINT64] = "UINT64"
    assert GENERATE_INPUTS == {name: wire[dtype] for name, (dtype, _dims, _opt) in INPUTS.items()}
