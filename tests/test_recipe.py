"""Bad recipes exit 2 with a message naming the field, and nothing is written under engines/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmkiln.build.capacity import check_cpu_memory
from llmkiln.cli.main import main
from llmkiln.errors import BadInput
from llmkiln.jsonl import read_jsonl
from llmkiln.recipe import load_recipe


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
    pytest.param({"serve__http_port": 70000}, "serve.http_port", id="port-out-of-range"),
    pytest.param({"scheduler__max_batch_size": 10**9}, "scheduler.max_batch_size", id="slots-beyond-cap"),
    pytest.param({"kv_cache__max_bytes": 10**15}, "kv_cache.max_bytes", id="store-beyond-cap"),
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


def test_sizes_beyond_this_machine_are_refused_naming_the_field(tmp_path: Path, stories_dir: Path) -> None:
    config = json.loads((stories_dir / "config.json").read_text())
    recipe, _ = load_recipe("stories-fp32")
    small = 2**30  # a 1 GiB machine
    check_cpu_memory(recipe, tmp_path / "r.yaml", config, total=small)  # the real recipe fits
    big_store = recipe.model_copy(
        update={"kv_cache": recipe.kv_cache.model_copy(update={"max_bytes": 2**31})}
    )
    with pytest.raises(BadInput, match="kv_cache.max_bytes"):
        check_cpu_memory(big_store, tmp_path / "r.yaml", config, total=small)
    many = recipe.model_copy(
        update={"scheduler": recipe.scheduler.model_copy(update={"max_batch_size": 4096})}
    )
    with pytest.raises(BadInput, match="scheduler.max_batch_size"):
        check_cpu_memory(many, tmp_path / "r.yaml", config, total=small)


def test_yaml_alias_bomb_is_refused_quickly_with_a_short_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ["name: bomb", "model: {generated: tiny-llama}", 'a: &a ["lol","lol","lol","lol","lol","lol"]']
    prev = "a"
    for name in "bcdefghijk":  # 6**10 values from ~360 bytes
        lines.append(f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]")
        prev = name
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text("\n".join(lines) + "\n")
    assert recipe.stat().st_size < 400
    code, output = _run(["build", str(recipe), "--dry-run"], capsys)
    assert code == 2 and "expands to more than" in output and len(output) < 2000
    many = ["name: bomb", "a: &a 1", "b: [" + ",".join(["*a"] * 100) + "]"]
    recipe.write_text("\n".join(many) + "\n")
    code, output = _run(["build", str(recipe), "--dry-run"], capsys)
    assert code == 2 and "YAML aliases" in output


def test_non_utf8_files_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes(b'name: latin1\ndescription: "caf\xe9"\nmodel: {generated: tiny-llama}\n')
    code, output = _run(["build", str(recipe), "--dry-run"], capsys)
    assert code == 2 and "not UTF-8" in output and "Traceback" not in output
    data = tmp_path / "set.jsonl"
    data.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(BadInput, match=r"set.jsonl:2: not UTF-8"):
        list(read_jsonl(data))


DEEP = [  # issue 21, finding 10: each was a RecursionError traceback and exit 1
    pytest.param("name: deep\nx: " + "[" * 5000 + "\n", id="5000-brackets"),
    pytest.param("name: deep\nx: " + "{" * 3000 + "\n", id="3000-braces"),
    pytest.param(
        "name: deep\nx:\n" + "".join("  " * i + "- \n" for i in range(1, 400)), id="block-sequences"
    ),
]


@pytest.mark.parametrize("text", DEEP)
def test_deeply_nested_yaml_is_exit_2_naming_the_file(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(text)
    for argv in (["build", str(recipe), "--dry-run"], ["recipe", "show", str(recipe)]):
        code, output = _run(argv, capsys)
        assert code == 2 and "deep.yaml" in output and "nested more than" in output, output[-2000:]
        assert "Traceback" not in output and "RecursionError" not in output
    # `kiln recipes` with such a file in the recipe folder: the others are listed, exit 2 names the file
    monkeypatch.setenv("LLMKILN_RECIPES", str(tmp_path))
    code, output = _run(["recipes"], capsys)
    assert code == 2 and "deep.yaml" in output and "stories-fp32" in output and "Traceback" not in output


def test_a_1200_deep_extends_chain_is_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "r0.yaml").write_text("name: r0\nmodel: {generated: tiny-llama}\n")
    for i in range(1, 1201):
        (tmp_path / f"r{i}.yaml").write_text(f"name: r{i}\nextends: r{i - 1}\n")
    code, output = _run(["build", str(tmp_path / "r1200.yaml"), "--dry-run"], capsys)
    assert code == 2 and "r1200.yaml" in output and "a chain of more than" in output, output[-2000:]
    assert "Traceback" not in output and len(output) < 2000
    # a chain within the limit still merges, child over parent
    (tmp_path / "short.yaml").write_text("name: short\nextends: r20\nprecision: int8\n")
    recipe, _ = load_recipe(tmp_path / "short.yaml")
    assert recipe.name == "short" and recipe.precision == "int8" and recipe.model.generated == "tiny-llama"


def test_deeply_nested_json_is_bad_input(tmp_path: Path) -> None:
    data = tmp_path / "deep.jsonl"
    data.write_text('{"text": "ok"}\n' + "[" * 5000 + "\n")
    with pytest.raises(BadInput, match=r"deep.jsonl:2: not valid JSON \(nested more than"):
        list(read_jsonl(data))
    data.write_text('{"a": ' * 80 + "1" + "}" * 80 + "\n")
    with pytest.raises(BadInput, match=r"deep.jsonl:1: not valid JSON \(nested more than"):
        list(read_jsonl(data))


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_out_of_range_ports_exit_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run(["serve", "stories-fp32", "--http-port", port], capsys)
    assert code == 2 and "--http-port" in output and "Traceback" not in output
