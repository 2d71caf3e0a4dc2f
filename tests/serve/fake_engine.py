"""A tiny stand-in engine for the serving tests: byte tokens, echoes the prompt.

The same surface as llmkiln.runtime.engine.LLMEngine that the serving core uses (submit, handles with aiter /
cancel / timings, metrics, tokenizer, config, shutdown), built from the runtime's own request, metric and config
types. Unit tests hand it to ServeCore directly; the real-server tests run it through fake_model.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from llmkiln.runtime.metrics import EngineMetric
from llmkiln.runtime.request import PromptTooLong, QueueFull, RequestTimings, SamplingParams, TokenEvent
from llmkiln.runtime.scheduler import SchedulerConfig

MAX_PROMPT = 200
MAX_ACTIVE = 64
EOS = 0


@dataclass(frozen=True)
class Encoding:
    ids: list[int]


class ByteTokenizer:
    """Token id = byte value; decoding an incomplete UTF-8 character gives U+FFFD (as byte-fallback tokenizers do)."""

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(256)}

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[Encoding]:
        return [Encoding(list(t.encode("utf-8"))) for t in texts]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


@dataclass(eq=False)
class Handle:
    engine: FakeEngine
    prompt_ids: list[int]
    params: SamplingParams
    timings: RequestTimings = field(default_factory=lambda: RequestTimings(arrival_ns=time.time_ns()))
    cancelled: bool = False
    num_cached_tokens: int = 0
    error: str | None = None
    finish_reason: str | None = None

    def result(self, timeout: float | None = None) -> list[int]:
        """The whole output at once (the host's warmup waits on it): the prompt echoed, max_tokens long."""
        self.finish_reason = "length"
        return [self.prompt_ids[i % len(self.prompt_ids)] for i in range(self.params.max_tokens)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def cancel(self) -> None:
        self.cancelled = True

    async def aiter(self):
        self.engine.active += 1
        try:
            self.timings.first_scheduled_ns = time.time_ns()
            n = self.params.max_tokens
            for i in range(n):
                await asyncio.sleep(0.002)
                if self.cancelled:  # like the runtime: a final event with no token
                    yield TokenEvent(None, i, True, "cancelled")
                    return
                tok = self.prompt_ids[i % len(self.prompt_ids)]
                if i == 0:
                    self.timings.first_token_ns = time.time_ns()
                last = i == n - 1
                if last:
                    self.timings.finish_ns = time.time_ns()
                yield TokenEvent(tok, i, last, "length" if last else None)
        finally:
            self.engine.active -= 1


class FakeEngine:
    """Implements llmkiln.host.protocol.ServingEngine (mypy checks it: tests/serve/test_fake_conforms.py)."""

    tokenizer = ByteTokenizer()
    config = SchedulerConfig.make(tokens_per_block=16)
    profiler = None
    recipe = None
    block_store = None
    engine_dir = None
    healthy = True
    failure = None

    def __init__(self) -> None:
        self.active = 0
        self.seen: dict[tuple[int, ...], int] = {}

    def start(self) -> FakeEngine:
        return self

    def submit(self, prompt, params, priority=0, request_id=None) -> Handle:
        ids = list(prompt.encode("utf-8")) if isinstance(prompt, str) else list(prompt)
        if len(ids) > MAX_PROMPT:
            raise PromptTooLong(f"prompt has {len(ids)} tokens, the engine accepts at most {MAX_PROMPT}")
        if self.active >= MAX_ACTIVE:
            raise QueueFull(f"queue full ({MAX_ACTIVE} requests waiting); retry later")
        h = Handle(self, ids, params, RequestTimings(arrival_ns=time.time_ns()))
        h.num_cached_tokens = (len(ids) // 16) * 16 if tuple(ids) in self.seen else 0
        self.seen[tuple(ids)] = 1
        return h

    def metrics(self) -> dict[str, float]:
        values = {str(m): 0.0 for m in EngineMetric}
        values[EngineMetric.KV_BLOCKS_USED] = float(len(self.seen))
        values[EngineMetric.NUM_RUNNING] = float(self.active)
        return values

    @property
    def num_in_flight(self) -> int:
        return self.active

    def enable_profile(self, path):
        raise NotImplementedError("the stand-in engine has no step profile")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        pass
