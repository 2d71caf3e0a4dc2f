"""RequestHandle: the caller's side of one submitted request — a sync and an async token stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future

from llmkiln.errors import KilnError
from llmkiln.runtime.request import Request, RequestTimings, TokenEvent


class RequestFailed(KilnError):
    """The runner failed while this request was running."""


class RequestHandle:
    """Returned by LLMEngine.submit. Iterate it (blocking) or `async for` over `aiter()`; events are kept, so
    every consumer sees the whole stream from the first token."""

    def __init__(self, request: Request, cancel: Callable[[str], None]) -> None:
        self._request = request
        self._cancel = cancel
        self._events: list[TokenEvent] = []
        self._cond = threading.Condition()
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenEvent]]] = []
        self.error: str | None = None
        # submit(..., export_prefix=True): the prompt's stored block ids, pinned by the scheduler thread right
        # after the request's last step published its blocks ([] when it did not end normally)
        self.exported: Future[list[int]] | None = None

    # ------------------------------------------------------------------ read-only views
    @property
    def request_id(self) -> str:
        return self._request.request_id

    @property
    def prompt_ids(self) -> list[int]:
        return self._request.prompt_ids

    @property
    def num_prompt_tokens(self) -> int:
        return self._request.num_prompt_tokens

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens loaded from the prefix cache instead of computed."""
        return self._request.num_cached_tokens

    @property
    def timings(self) -> RequestTimings:
        return self._request.timings

    @property
    def finished(self) -> bool:
        with self._cond:
            return bool(self._events) and self._events[-1].finished

    @property
    def finish_reason(self) -> str | None:
        with self._cond:
            return self._events[-1].finish_reason if self._events and self._events[-1].finished else None

    @property
    def output_ids(self) -> list[int]:
        with self._cond:
            return [e.token_id for e in self._events if e.token_id is not None]

    # ------------------------------------------------------------------ engine side
    def _push(self, event: TokenEvent, error: str | None = None) -> None:
        push_events([(self, event)], error)

    def _append(
        self, event: TokenEvent, error: str | None
    ) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenEvent]]]:
        """Record the event; returns the async listeners to hand it to (none once the stream ended)."""
        with self._cond:
            if self._events and self._events[-1].finished:
                return []
            if error is not None:
                self.error = error
            self._events.append(event)
            self._cond.notify_all()
            return list(self._listeners)

    def events_since(self, index: int) -> list[TokenEvent]:
        """The events after the first `index` ones (a caller that steps the engine itself polls with this)."""
        with self._cond:
            return self._events[index:]

    # ------------------------------------------------------------------ caller side
    def cancel(self) -> None:
        """Ask the engine to stop this request; its slot and blocks are freed at the next step."""
        self._cancel(self.request_id)

    def __iter__(self) -> Iterator[TokenEvent]:
        i = 0
        while True:
            with self._cond:
                while i >= len(self._events):
                    self._cond.wait()
                event = self._events[i]
            i += 1
            yield event
            if event.finished:
                self._raise_if_failed()
                return

    async def aiter(self) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        with self._cond:
            backlog = list(self._events)
            self._listeners.append((loop, queue))
        try:
            for event in backlog:
                yield event
                if event.finished:
                    self._raise_if_failed()
                    return
            while True:  # events after the backlog arrive only through the queue
                event = await queue.get()
                yield event
                if event.finished:
                    self._raise_if_failed()
                    return
        finally:
            with self._cond:
                self._listeners.remove((loop, queue))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until finished; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._events) and self._events[-1].finished, timeout)

    def result(self, timeout: float | None = None) -> list[int]:
        """The generated token ids (the final EOS/stop token included) once finished."""
        if not self.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        self._raise_if_failed()
        return self.output_ids

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RequestFailed(f"request {self.request_id} failed: {self.error}")


def push_events(items: list[tuple[RequestHandle, TokenEvent]], error: str | None = None) -> None:
    """Hand a step's events to their streams: one wake-up per event loop, not one per event (each
    call_soon_threadsafe is a syscall and a GIL hand-over to the serving loop)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]] = {}
    for handle, event in items:
        for loop, queue in handle._append(event, error):
            by_loop.setdefault(loop, []).append((queue, event))
    for loop, deliveries in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, deliveries)
        except RuntimeError:  # the consumer's loop is closed
            pass


def _deliver(deliveries: list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]) -> None:
    for queue, event in deliveries:
        queue.put_nowait(event)
