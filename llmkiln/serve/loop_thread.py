"""LoopThread: a server on its own asyncio event loop in a daemon thread of the launcher process — the base of
llmkiln's fronts (the HTTP front and the gRPC front before Triton, the OpenAI front before Dynamo's frontend).

A subclass implements `_serve()` (bind and start listening, on the loop) and `_cleanup()` (close, on the loop
after it stopped). `start()` returns once `_serve()` is done and raises its error (e.g. the port is taken);
`stop()` stops the loop and joins the thread (idempotent)."""

from __future__ import annotations

import asyncio
import threading


class LoopThread:
    thread_name = "llmkiln-loop"

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    async def _serve(self) -> None:
        raise NotImplementedError

    async def _cleanup(self) -> None:
        return None

    def _start_error(self, exc: BaseException) -> BaseException:
        """What start() raises for an error of _serve() (the error itself unless a subclass says otherwise)."""
        return exc

    def start(self) -> None:
        """Bind and serve in a background thread; raises the bind error (e.g. the port is taken)."""
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported to start()
            self._error = self._start_error(exc)
            self._started.set()
            return
        self._started.set()
        loop.run_forever()
        loop.run_until_complete(self._cleanup())
        loop.close()

    def stop(self) -> None:
        """Stop the loop (then _cleanup runs on it) and join the thread (idempotent)."""
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
