"""ProxyFront: a LoopThread whose aiohttp app forwards to http://upstream through one client session — the base of
the HTTP front before Triton (serve/http_front.py) and the OpenAI front before Dynamo's frontend
(dynamo/openai_front.py). A subclass builds its app and session in `_serve()` and hands them to `_listen()`;
`_cleanup()` closes the listener, then the session."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from llmkiln.serve.loop_thread import LoopThread


class ProxyFront(LoopThread):
    def __init__(self, host: str, port: int, upstream: str) -> None:
        super().__init__()
        self.host, self.port, self.upstream = host, port, upstream
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _listen(
        self, app: web.Application, session: aiohttp.ClientSession, **runner_options: Any
    ) -> None:
        """Keep `session` for forwarding and listen on host:port with `app` (no access log, no signal handlers)."""
        self._session = session
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, **runner_options)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
