"""KV-aware routing across two workers whose prefix stores each hold only part of the shared system prompts:
every prompt's requests land on one worker and hit its cache (stories260K, real frontend, real openai client)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from tokenizers import Tokenizer

from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir
from llmkiln.runtime.kv_quant import bytes_per_block

from .conftest import MODEL, client

pytestmark = pytest.mark.slow

K = 4  # distinct system prompts
ROUNDS = 4  # requests per prompt (the first ones are cold)
BLOCK = 16
SPARE_BLOCKS = 8  # per worker, beyond three prompts' blocks: user turns (room for three prompts, never four)


def system_prompt(k: int) -> str:
    """~230 tokens; prompts differ from their first word, so they share no block."""
    head = ["Rabbits", "Dragons", "Pirates", "Robots"][k]
    body = (
        f"{head} are the heroes of every story you tell. Tell short stories for small children, with a happy "
        "ending, simple words and one friend who helps. "
    )
    return body * 3


def store_blocks(engine) -> int:
    """Blocks of three system prompts (as the chat template renders them) plus SPARE_BLOCKS."""
    folder = EngineDir(engine)
    tok = Tokenizer.from_file(str(engine / "tokenizer.json"))
    longest = max(
        len(
            tok.encode(
                render(
                    folder.chat_template(),
                    [{"role": "system", "content": system_prompt(k)}],
                    add_generation_prompt=False,
                    bos_token="<s>",
                ),
                add_special_tokens=False,
            ).ids
        )
        for k in range(K)
    )
    return 3 * (longest // BLOCK + 1) + SPARE_BLOCKS


@pytest.fixture(scope="module")
def cluster(launch, stories_engine):
    info = EngineDir(stories_engine).genai_config()
    per_block = bytes_per_block("fp32", info.num_layers, info.kv_heads, BLOCK, info.head_size)
    overrides = {
        "kv_cache": {"max_bytes": store_blocks(stories_engine) * per_block, "tokens_per_block": BLOCK}
    }
    return launch(stories_engine, workers=2, router_mode="kv", overrides=overrides)


def ask(c, k: int, turn: int):
    messages = [
        {"role": "system", "content": system_prompt(k)},
        {"role": "user", "content": f"Story {turn}: what happens next?"},
    ]
    return c.chat.completions.create(model=MODEL, messages=messages, max_tokens=4).usage


def test_each_prompt_lands_on_one_worker_and_hits_its_cache(cluster):
    c = client(cluster)
    capacity = cluster.worker_metrics(0)["kv_blocks_total"]
    assert cluster.worker_metrics(1)["kv_blocks_total"] == capacity
    # Round 1: the cold requests arrive together (the router spreads them by load).
    with ThreadPoolExecutor(K) as pool:
        first = list(pool.map(lambda k: ask(c, k, 0), range(K)))
    system_tokens = min(u.prompt_tokens for u in first) - 12
    assert system_tokens > 10 * BLOCK
    assert K * (system_tokens // BLOCK) > capacity  # one store cannot hold every prompt
    served_by: dict[int, set[int]] = {k: set() for k in range(K)}
    for turn in range(1, ROUNDS):
        for k in range(K):
            before = [cluster.worker_metrics(i)["prefix_cache_hit_tokens"] for i in range(2)]
            usage = ask(c, k, turn)
            after = [cluster.worker_metrics(i)["prefix_cache_hit_tokens"] for i in range(2)]
            cached = usage.prompt_tokens_details.cached_tokens
            # hits its cache: the whole system prompt (but the block it shares with the user turn)
            assert cached >= (system_tokens // BLOCK - 1) * BLOCK, (k, turn, usage)
            # the worker whose hit counter moved by exactly this request's cached tokens served it
            moved = [i for i in range(2) if after[i] - before[i] == cached]
            assert len(moved) == 1, (before, after, cached)
            served_by[k].add(moved[0])
    assert all(len(workers) == 1 for workers in served_by.values()), served_by
    assert set().union(*served_by.values()) == {0, 1}, served_by  # both workers hold part of the prompts
