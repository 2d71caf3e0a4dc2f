"""The engine seam of the host: what a front door's host needs of an engine. `llmkiln.runtime.engine.LLMEngine`
implements it; so do the tests' stand-ins (tests/serve/fake_engine.py), checked by mypy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from llmkiln.recipe import Recipe
from llmkiln.runtime.handle import RequestHandle
from llmkiln.runtime.kv_blocks import BlockStore
from llmkiln.runtime.profile import Profiler
from llmkiln.runtime.request import SamplingParams
from llmkiln.runtime.scheduler import SchedulerConfig

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class ServingEngine(Protocol):
    """A started engine: submit requests, read metrics and health, shut down."""

    config: SchedulerConfig
    recipe: Recipe | None
    tokenizer: Tokenizer | None
    block_store: BlockStore | None
    profiler: Profiler | None
    engine_dir: Path | None

    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
    ) -> RequestHandle: ...

    def metrics(self) -> dict[str, float]: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def failure(self) -> str | None: ...

    @property
    def num_in_flight(self) -> int: ...

    def enable_profile(self, path: str | Path) -> Profiler: ...

    def shutdown(self, timeout_s: float = 5.0) -> None: ...
