"""Chat templates: the recipe's (or the model's) Jinja template turns messages into a deterministic prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import BadInput
from llmkiln.recipe import load_recipe

MESSAGES = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A cat?"}]


def test_bundled_cpu_template_puts_the_system_prompt_first() -> None:
    recipe, _ = load_recipe("stories-fp32")
    assert recipe.chat_template
    text = render(recipe.chat_template, MESSAGES, bos_token="<s>")
    assert text == "<s>You tell stories.\n\nUser: A cat?\nAssistant:"
    other = render(
        recipe.chat_template, [MESSAGES[0], {"role": "user", "content": "A dog?"}], bos_token="<s>"
    )
    assert other.startswith("<s>You tell stories.\n\nUser: A ")  # equal system prompts → equal prefixes


def test_engine_folder_prefers_the_recipe_then_the_model(tmp_path: Path) -> None:
    recipe, _ = load_recipe("stories-fp32")
    folder = EngineDir(tmp_path)
    folder.write_recipe(recipe.model_copy(update={"chat_template": None}))
    assert folder.chat_template() is None
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages[0]['content'] }}"})
    )
    assert folder.chat_template() == "{{ messages[0]['content'] }}"
    folder.write_recipe(recipe)
    assert folder.chat_template() == recipe.chat_template


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
