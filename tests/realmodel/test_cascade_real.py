"""Cascade attention on the real model (SmolLM2-135M-Instruct, OpenVINO fp32): chats that share a long system
prompt, decoded together so their shared blocks go through the cascade op, reply exactly as transformers' greedy
`generate` does on each prompt alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime import cascade_attention
from llmkiln.runtime.loader import load_engine
from llmkiln.runtime.request import SamplingParams

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are the reference desk of a small public library. Answer the visitor's question in one or two short "
    "sentences, plainly and correctly, without lists or headings. If a question is about the library itself, say "
    "that the library opens at nine in the morning, closes at six in the evening, and lends up to five books for "
    "three weeks. Do not invent facts you are not sure of."
)
QUESTIONS = [
    "What is the capital of Italy?",
    "When does the library open?",
    "How many legs does a spider have?",
    "What gas do plants take in from the air?",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def engine(engine_factory) -> Path:
    return engine_factory("smollm2-ov-fp32")


def test_shared_system_prompt_replies_equal_transformers_with_cascade(
    engine: Path, smollm2_hf: Path, monkeypatch
):
    import torch
    from transformers import AutoModelForCausalLM

    template = EngineDir(engine).chat_template()
    assert template is not None
    model = AutoModelForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    # the system prompt is ~100 tokens, the replies grow to 32 of their own: the speed rule would hand the later
    # steps to PagedAttention; here every step with shared blocks goes through the cascade op
    monkeypatch.setattr(cascade_attention, "routing", lambda cpu, bf16: cascade_attention.ALWAYS)
    with load_engine(EngineDir(engine), {"kv_cache": {"cascade": True}}) as eng:
        prompts = [
            eng.encode(
                render(template, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
            )
            for q in QUESTIONS
        ]
        common = next(i for i, col in enumerate(zip(*prompts, strict=False)) if len(set(col)) > 1)
        assert common >= 64  # at least two of OpenVINO's 32-token blocks shared
        params = SamplingParams(max_tokens=MAX_TOKENS)
        eng.generate([prompts[0]], params)  # the system prompt's blocks are cached from here on
        replies = eng.generate(prompts, params)  # decoded together: the shared blocks once per step
        runner = eng.runner
        assert runner.runtime_settings["cascade_attention"] == "on"
        assert runner.cascade_runs >= 8, runner.cascade_runs  # the batch's steps while two or more decode
    for ids, reply in zip(prompts, replies, strict=True):
        with torch.no_grad():
            want = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=eos
            )
        assert reply == want[0][len(ids) :].tolist()
