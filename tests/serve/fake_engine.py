"""A tiny stand-in engine for the Triton plumbing tests: byte tokens, echoes the prompt.

Loaded inside the python-backend stub through the model parameter engine_loader="<this file>:load".
Same surface as llmkiln.runtime.engine.LLMEngine (submit / aiter / timings / metrics / shutdown).
"""

from __future__ import annotations

import asyncio
import codecs
import time
from dataclasses import dataclass, field

# The real request types: the serving core sees the same parameters and rejections as with LLMEngine.
from llmkiln.runtime.request import PromptTooLong, QueueFull, RequestRejected, SamplingParams  # noqa: F401

MAX_PROMPT = 200
MAX_ACTIVE = 64
EOS = 0


@dataclass
class TokenEvent:
    token_id: int
    index: int
    finished: bool
    finish_reason: str | None


@dataclass
class Timings:
    arrival_ns: int = 0
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finish_ns: int | None = None


class ByteDetokenizer:
    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(bytes([token_id]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


@dataclass
class Handle:
    engine: FakeEngine
    prompt_ids: list[int]
    params: SamplingParams
    timings: Timings = field(default_factory=Timings)
    cancelled: bool = False
    num_cached_tokens: int = 0

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
                if self.cancelled:
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
    tokenizer = None

    def __init__(self) -> None:
        self.active = 0
        self.seen: dict[tuple[int, ...], int] = {}

    def start(self) -> None:
        pass

    def submit(self, prompt, params, priority=0, request_id=None) -> Handle:
        ids = list(prompt.encode("utf-8")) if isinstance(prompt, str) else list(prompt)
        if len(ids) > MAX_PROMPT:
            raise PromptTooLong(f"prompt has {len(ids)} tokens, the engine accepts at most {MAX_PROMPT}")
        if self.active >= MAX_ACTIVE:
            raise QueueFull(f"queue full ({MAX_ACTIVE} requests waiting); retry later")
        h = Handle(self, ids, params, Timings(arrival_ns=time.time_ns()))
        h.num_cached_tokens = (len(ids) // 16) * 16 if tuple(ids) in self.seen else 0
        self.seen[tuple(ids)] = 1
        return h

    def metrics(self) -> dict[str, float]:
        return {"kv_blocks_used": float(len(self.seen)), "queue_length": 0.0}

    def shutdown(self, timeout_s: float = 10.0) -> None:
        pass


def load(engine_dir):
    """engine_loader entry point; the serving core asks for SamplingParams and a detokenizer from the runtime."""
    return FakeEngine()


def make_detokenizer(engine, handle):
    return ByteDetokenizer()
