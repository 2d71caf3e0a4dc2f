"""Bad recipes exit 2 with a message naming the field, and nothing is written under engines/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmkiln.cli.main import main


def _recipe(stories_dir: Path, **changes: object) -> dict:
    data: dict = {
        "name": "bad",
        "description": "a recipe for the tests",
        "model": {"path": str(stories_dir)},
        "backend": "onnx-cpu",
        "precision": "fp32",
        "limits": {"max_input_len": 128, "max_seq_len": 256},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value
    return data


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out + out.err


CASES = [
    pytest.param({"scheduler__max_batch": 4}, "scheduler.max_batch", id="unknown-key"),
    pytest.param({"limits__max_input_len": "many"}, "limits.max_input_len", id="wrong-type"),
    pytest.param({"model": {"path": "/nonexistent/stories260K"}}, "model.path", id="missing-model-folder"),
    pytest.param({"backend": "tpu"}, "backend", id="unknown-backend"),
    pytest.param({"precision": "fp8"}, "precision", id="precision-not-on-backend"),
    pytest.param(
        {"limits": {"max_input_len": 128, "max_seq_len": 4096}},
        "limits.max_seq_len",
        id="beyond-model-context",
    ),
    pytest.param({"kv_cache__tokens_per_block": 12}, "kv_cache.tokens_per_block", id="bad-value"),
]


@pytest.mark.parametrize(("changes", "field"), CASES)
def test_bad_recipe_exits_2_and_writes_nothing(
    tmp_path: Path, stories_dir: Path, capsys: pytest.CaptureFixture[str], changes: dict, field: str
) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(stories_dir, **changes)))
    engines = tmp_path / "engines"
    code, output = _run(["build", str(recipe), "--engines-dir", str(engines), "--quiet"], capsys)
    assert code == 2, output
    assert field in output
    assert str(recipe) in output or "bad" in output
    assert not engines.exists() or not any(engines.iterdir())


def test_missing_shared_model_message_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the stories recipes point at ../../shared/models/stories260K relative to the recipe file
    recipe = tmp_path / "recipes" / "stories-copy.yaml"
    recipe.parent.mkdir()
    recipe.write_text(
        yaml.safe_dump({"name": "stories-copy", "model": {"path": "../../shared/models/stories260K"}})
    )
    code, output = _run(["build", str(recipe), "--engines-dir", str(tmp_path / "engines"), "-q"], capsys)
    assert code == 2
    assert "model.path" in output and "does not exist" in output
    assert not (tmp_path / "engines").exists()


def test_recipes_list_and_show(capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run(["recipes"], capsys)
    assert code == 0 and "stories-fp32" in output and "tiny-fp32" in output
    code, output = _run(["recipe", "show", "stories-int8"], capsys)
    assert code == 0
    shown = yaml.safe_load(output)
    assert shown["precision"] == "int8" and shown["backend"] == "onnx-cpu"
