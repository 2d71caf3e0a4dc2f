"""Chat templates: the recipe's (or the model's) Jinja template turns messages into a deterministic prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmkiln.build.onnx_export import effective_chat_template
from llmkiln.chat_template import PLAIN_TEMPLATE, render
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe
from llmkiln.tokenizer_files import model_chat_template, model_stop_token_ids

MESSAGES = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A cat?"}]


def test_the_plain_template_puts_the_system_prompt_first() -> None:
    text = render(PLAIN_TEMPLATE, MESSAGES, bos_token="<s>")
    assert text == "<s>You tell stories.\n\nUser: A cat?\nAssistant:"
    other = render(PLAIN_TEMPLATE, [MESSAGES[0], {"role": "user", "content": "A dog?"}], bos_token="<s>")
    assert other.startswith("<s>You tell stories.\n\nUser: A ")  # equal system prompts → equal prefixes


def test_a_model_without_a_template_gets_the_plain_one_and_a_models_own_wins(tmp_path: Path) -> None:
    assert effective_chat_template(None, tmp_path) == (PLAIN_TEMPLATE, "plain (the model ships none)")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ 'cfg' }}"}))
    assert effective_chat_template(None, tmp_path) == ("{{ 'cfg' }}", "model (tokenizer_config.json)")
    (tmp_path / "chat_template.jinja").write_text("{{ 'jinja' }}")  # transformers 5 reads this file first
    assert effective_chat_template(None, tmp_path) == ("{{ 'jinja' }}", "model (chat_template.jinja)")
    assert effective_chat_template("{{ 'recipe' }}", tmp_path) == ("{{ 'recipe' }}", "recipe")
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ 'named' }}"}]
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert model_chat_template(tmp_path) == ("{{ 'named' }}", "tokenizer_config.json")


def test_a_recipe_template_is_not_inherited_through_extends(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text(
        "name: parent\nmodel: {generated: tiny-llama}\nchat_template: \"{{ 'parent' }}\"\n"
    )
    (tmp_path / "child.yaml").write_text("name: child\nextends: parent\n")
    (tmp_path / "own.yaml").write_text("name: own\nextends: parent\nchat_template: \"{{ 'own' }}\"\n")
    assert load_recipe(tmp_path / "parent.yaml")[0].chat_template == "{{ 'parent' }}"
    assert load_recipe(tmp_path / "child.yaml")[0].chat_template is None  # the model's own template applies
    assert load_recipe(tmp_path / "own.yaml")[0].chat_template == "{{ 'own' }}"
    for name in ("stories-fp32", "stories-int8", "smollm2-fp32", "smollm2-ov-bf16", "tiny-fp32"):
        assert load_recipe(name)[0].chat_template is None, (
            name
        )  # no bundled base overrides a model's template


def test_engine_folder_prefers_the_recipe_then_what_the_build_wrote(tmp_path: Path) -> None:
    recipe, _ = load_recipe("stories-fp32")
    folder = EngineDir(tmp_path)
    folder.write_recipe(recipe)
    assert folder.chat_template() is None
    (tmp_path / "chat_template.jinja").write_text("{{ 'model' }}")
    assert folder.chat_template() == "{{ 'model' }}"
    folder.write_chat_template("{{ messages[0]['content'] }}")  # the build: both files get the effective one
    assert folder.chat_template() == "{{ messages[0]['content'] }}"
    assert (tmp_path / "chat_template.jinja").read_text() == "{{ messages[0]['content'] }}"
    folder.write_recipe(recipe.model_copy(update={"chat_template": "{{ 'recipe' }}"}))
    assert folder.chat_template() == "{{ 'recipe' }}"


def test_stop_token_ids_come_from_every_file_that_names_one(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 128001}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": [{"id": 2, "content": "<|im_end|>"}], "model": {"vocab": {}}})
    )
    assert model_stop_token_ids(tmp_path) == (128001, 128009, 2)
    assert model_stop_token_ids(tmp_path / "missing") == ()


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "x"}], r"messages\[0\].role"),
        ([{"role": "user", "content": 3}], r"messages\[0\].content"),
    ],
)
def test_bad_messages_and_templates_are_bad_input(messages, match) -> None:
    with pytest.raises(BadInput, match=match):
        render("{{ messages }}", messages)
    with pytest.raises(BadInput, match="my.yaml: the chat template failed"):
        render("{% if %}", MESSAGES, source="my.yaml")
