"""The serving seam: what a front door (the Triton model, the Dynamo worker, the host they share) uses of an engine.

`LLMEngine` implements `ServingEngine` and its `RequestHandle` implements `ServingHandle`; so do the tests'
stand-ins (tests/serve/fake_engine.py), and mypy checks all of them against these Protocols (pyproject's
[tool.mypy] `files`). Type a front door against these rather than against LLMEngine, so that what the tests run
stays what production runs. Structural only: nothing here is imported at run time by the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol, Self

from llmkiln.recipe import Recipe
from llmkiln.runtime.block_memory import BlockMemory
from llmkiln.runtime.handoff import KvHandoff
from llmkiln.runtime.kv_blocks import BlockStore, Reservation
from llmkiln.runtime.profile import Profiler
from llmkiln.runtime.request import RequestTimings, SamplingParams, TokenEvent
from llmkiln.runtime.scheduler import SchedulerConfig


class HasIds(Protocol):
    """One encoded text (tokenizers.Encoding)."""

    @property
    def ids(self) -> Sequence[int]: ...


class TextTokenizer(Protocol):
    """What the front doors use of the engine's tokenizer (tokenizers.Tokenizer): the vocabulary (to bound prompt
    bytes), batch encoding (it releases the GIL, so it runs in a worker thread) and decoding."""

    def get_vocab(self) -> Mapping[str, int]: ...

    def encode_batch(self, texts: list[str], /, *, add_special_tokens: bool = True) -> Sequence[HasIds]: ...

    def decode(self, ids: list[int], /, skip_special_tokens: bool = True) -> str: ...


class ServingHandle(Protocol):
    """One submitted request, as the front doors read it (runtime.handle.RequestHandle)."""

    @property
    def request_id(self) -> str: ...

    @property
    def prompt_ids(self) -> Sequence[int]: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens loaded from the prefix cache instead of computed."""
        ...

    @property
    def timings(self) -> RequestTimings: ...

    @property
    def finish_reason(self) -> str | None:
        """Why the request ended (runtime.request.FinishReason values); None while it runs."""
        ...

    @property
    def error(self) -> str | None:
        """Why the request failed (its last event has finish_reason "error"); None otherwise."""
        ...

    @property
    def exported(self) -> Future[list[int]] | None:
        """Submitted with handoff.export_prefix: the prompt's stored block ids, pinned at the request's end
        ([] when it did not end normally); None otherwise."""
        ...

    def cancel(self) -> None: ...

    def aiter(self) -> AsyncIterator[TokenEvent]:
        """The token events from the first one on; the last has finished=True."""
        ...

    def result(self, timeout: float | None = None) -> list[int]:
        """Block until finished; the generated token ids."""
        ...


class ServingEngine(Protocol):
    """A started engine, as the front doors drive it (runtime.engine.LLMEngine)."""

    @property
    def config(self) -> SchedulerConfig: ...

    @property
    def recipe(self) -> Recipe | None: ...

    @property
    def tokenizer(self) -> TextTokenizer | None: ...

    @property
    def block_store(self) -> BlockStore | None:
        """The prefix block store (None without prefix reuse): its listeners see blocks stored and removed."""
        ...

    @property
    def profiler(self) -> Profiler | None: ...

    @property
    def runtime_settings(self) -> Mapping[str, str]:
        """What the runner runs with, by name (Runner.runtime_settings: the CPU, precision, threads, ...)."""
        ...

    @property
    def healthy(self) -> bool:
        """False once the scheduler thread died (every request then fails at once)."""
        ...

    @property
    def failure(self) -> str | None: ...

    @property
    def stalled_for_s(self) -> float:
        """Seconds without an engine step while requests are in flight (0 when idle): the liveness signal."""
        ...

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished yet (queued or running)."""
        ...

    def start(self) -> Self: ...

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
        handoff: KvHandoff | None = None,
    ) -> ServingHandle:
        """Queue a request; raises a RequestRejected subclass at once instead of blocking. `handoff`: KV it
        brings from, or hands to, another engine (runtime.handoff; None: neither)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def metrics(self) -> dict[str, float]:
        """Values by runtime.metrics.EngineMetric name."""
        ...

    def shutdown(self, timeout_s: float = 5.0) -> None: ...


class KvPort(Protocol):
    """An engine's KV hand-off (runtime.engine_kv.EngineKv): every call that changes the KV cache manager runs on
    the engine's scheduler thread (a Future of its result)."""

    @property
    def block_memory(self) -> BlockMemory | None:
        """Where the prefix store's blocks live (None: no store)."""
        ...

    def cached_prefix_estimate(self, token_ids: Sequence[int]) -> int:
        """Tokens of the prompt's longest stored prefix, read without the scheduler thread: a routing hint."""
        ...

    def release_blocks(self, block_ids: Sequence[int]) -> Future[None]: ...

    def reserve_import(self, token_ids: Sequence[int], num_blocks: int) -> Future[Reservation]: ...

    def end_import(self, reservation: Reservation, filled: bool) -> Future[None]: ...


class KvEngine(ServingEngine, Protocol):
    """A ServingEngine whose prompt KV moves to and from another engine's (what host.kv_transfer drives)."""

    @property
    def kv(self) -> KvPort: ...
