"""The OpenAI API through Dynamo's frontend and two llmkiln workers, with the real openai client."""

from __future__ import annotations

import openai
import pytest
from tokenizers import Tokenizer

from llmkiln.chat_template import render
from llmkiln.engine_dir import EngineDir

from .conftest import MODEL, client

pytestmark = pytest.mark.slow

SYSTEM = "You are a storyteller for small children. Keep every story short, kind and simple. " * 4


@pytest.fixture(scope="module")
def cluster(launch, stories_engine):
    return launch(stories_engine, workers=2)


def test_models_lists_the_served_model(cluster):
    models = client(cluster).models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_streaming_and_not_agree(cluster, stories_engine):
    c = client(cluster)
    r = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    tok = Tokenizer.from_file(str(stories_engine / "tokenizer.json"))
    # Dynamo 1.6.1 tokenizes completion text without special tokens; llmkiln's front sends the token ids with the
    # BOS instead, as `kiln serve` (Triton), transformers and vLLM tokenize it
    assert r.usage.prompt_tokens == len(tok.encode("Once upon a time").ids)
    assert tok.encode("Once upon a time").ids[0] == 1
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == r.choices[0].text  # greedy: both paths give the same tokens
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_uses_the_engine_chat_template(cluster, stories_engine):
    """The frontend renders the engine folder's chat template: the prompt it tokenizes is llmkiln's rendering."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about a cat."}]
    r = client(cluster).chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    folder = EngineDir(stories_engine)
    text = render(folder.chat_template(), messages, bos_token="<s>", eos_token="</s>")
    tok = Tokenizer.from_file(str(stories_engine / "tokenizer.json"))
    assert r.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False).ids)


def test_chat_streaming_reports_cached_tokens_on_a_repeated_system_prompt(cluster):
    """Equal system prompts give equal token prefixes; the second request is served from the prefix cache."""
    c = client(cluster)
    usages = []
    for question in ("What does the dog do?", "Where does the bird live?"):
        stream = c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        usages.append(chunks[-1].usage)
    block = 16
    assert usages[1].prompt_tokens_details.cached_tokens >= (usages[0].prompt_tokens // block - 2) * block > 0


def test_bad_request_is_a_client_error(cluster):
    with pytest.raises(openai.BadRequestError):
        client(cluster).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=100_000)
    with pytest.raises(openai.NotFoundError):
        client(cluster).completions.create(model="no-such-model", prompt="x", max_tokens=2)


def test_workers_are_warm_before_they_serve(cluster):
    """Each worker ran the recipe's warmup before it registered (its counters show it from the start)."""
    for i in range(cluster.spec.workers):
        m = cluster.worker_metrics(i)
        assert m["warmup_seconds"] > 0 and m["engine_healthy"] == 1.0
        assert m["requests_finished"] >= 1
        # the recipe's warmup as on every front door: its texts, count times each (not a stand-in prompt)
        recipe = EngineDir(cluster.spec.engine).recipe()
        assert m["warmup_requests_total"] == recipe.warmup.num_requests()


def test_kiln_diagnose_reads_a_worker_like_a_triton_server(cluster):
    """One metric naming for both front doors: the worker's /metrics has llmkiln_engine{metric=...} and the
    llmkiln_* families that `kiln diagnose` reads."""
    from llmkiln.diagnose.diagnosis import collect_signals

    client(cluster).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    url = f"{cluster.spec.status_url(0)}/metrics"
    sig, _ = collect_signals([url], [], None)
    assert sig.prefill_step_ms is not None and sig.max_batch_size is not None


def test_worker_metrics_name_the_cpu_and_the_settings_in_force(cluster):
    """Each worker's /metrics carries llmkiln_cpu_features (this CPU's kind) and its runner's settings."""
    import urllib.request

    from llmkiln.cpu_features import detect

    with urllib.request.urlopen(f"{cluster.spec.status_url(0)}/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    [cpu] = [ln for ln in lines if ln.startswith("llmkiln_cpu_features{")]
    assert f'kind="{detect().kind}"' in cpu and cpu.endswith(" 1")
    settings = [ln for ln in lines if ln.startswith("llmkiln_runtime_setting{")]
    # the worker's intra-op thread cap is the setting in force (WorkerOptions --threads)
    assert any('name="intra_op_threads"' in ln or 'name="INFERENCE_NUM_THREADS"' in ln for ln in settings), (
        settings
    )
