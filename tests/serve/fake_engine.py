"""A tiny stand-in engine for the serving tests: byte tokens, echoes the prompt.

It implements the serving seam, llmkiln.runtime.protocol.ServingEngine (with ServingHandle handles), as
llmkiln.runtime.engine.LLMEngine does; mypy checks both against it (`_conforms` below; this file is in
pyproject's [tool.mypy] files). Built from the runtime's own request, metric and config types. Unit tests hand
it to ServeCore directly; the real-server tests run it through fake_model.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmkiln.runtime.metrics import EngineMetric
from llmkiln.runtime.request import PromptTooLong, QueueFull, RequestTimings, SamplingParams, TokenEvent
from llmkiln.runtime.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from llmkiln.recipe import Recipe
    from llmkiln.runtime.engine import LLMEngine
    from llmkiln.runtime.handle import RequestHandle
    from llmkiln.runtime.handoff import KvHandoff
    from llmkiln.runtime.kv_blocks import BlockStore
    from llmkiln.runtime.profile import Profiler
    from llmkiln.runtime.protocol import ServingEngine, ServingHandle

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
    request_id: str = "fake"
    finish_reason: str | None = None
    exported: None = None  # moves no KV

    def result(self, timeout: float | None = None) -> list[int]:
        """The whole output at once (the host's warmup waits on it): the prompt echoed, max_tokens long."""
        self.finish_reason = "length"
        return [self.prompt_ids[i % len(self.prompt_ids)] for i in range(self.params.max_tokens)]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def cancel(self) -> None:
        self.cancelled = True

    async def aiter(self) -> AsyncIterator[TokenEvent]:
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
    """Implements llmkiln.runtime.protocol.ServingEngine (mypy checks it: tests/test_types.py runs mypy over this file)."""

    tokenizer = ByteTokenizer()
    runtime_settings: dict[str, str] = {"precision": "fake"}
    config = SchedulerConfig.make(tokens_per_block=16)
    recipe: Recipe | None = None
    block_store: BlockStore | None = None
    profiler: Profiler | None = None
    engine_dir = None
    healthy = True
    failure: str | None = None

    def __init__(self) -> None:
        self.active = 0
        self.seen: dict[tuple[int, ...], int] = {}
        self._ids = 0

    def start(self) -> FakeEngine:
        return self

    @property
    def num_in_flight(self) -> int:
        return self.active

    stalled_for_s = 0.0  # the stand-in never stalls (tests of the liveness check use the real engine)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens)

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
        handoff: KvHandoff | None = None,
    ) -> Handle:
        if handoff is not None:
            raise NotImplementedError(
                "the front-door fake engine moves no KV (tests/host: LLMEngine on a fake runner)"
            )
        ids = list(prompt.encode("utf-8")) if isinstance(prompt, str) else list(prompt)
        if len(ids) > MAX_PROMPT:
            raise PromptTooLong(f"prompt has {len(ids)} tokens, the engine accepts at most {MAX_PROMPT}")
        if self.active >= MAX_ACTIVE:
            raise QueueFull(f"queue full ({MAX_ACTIVE} requests waiting); retry later")
        if params is None:
            params = SamplingParams()
        self._ids += 1
        rid = request_id or f"fake-{self._ids}"
        h = Handle(self, ids, params, RequestTimings(arrival_ns=time.time_ns()), request_id=rid)
        h.num_cached_tokens = (len(ids) // 16) * 16 if tuple(ids) in self.seen else 0
        self.seen[tuple(ids)] = 1
        return h

    def metrics(self) -> dict[str, float]:
        values = {str(m): 0.0 for m in EngineMetric}
        values[EngineMetric.KV_BLOCKS_USED] = float(len(self.seen))
        values[EngineMetric.NUM_RUNNING] = float(self.active)
        return values

    def shutdown(self, timeout_s: float = 10.0) -> None:
        pass


def _conforms(fake: FakeEngine, real: LLMEngine, fake_handle: Handle, real_handle: RequestHandle) -> None:
    """Never called: mypy checks that the stand-in and the real engine (and their handles) fit the seam."""
    engines: list[ServingEngine] = [fake, real]
    handles: list[ServingHandle] = [fake_handle, real_handle]
    del engines, handles
