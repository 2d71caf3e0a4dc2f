"""Triton python-backend model for llmkiln (copied into a repository as <model>/1/model.py).

Deliberately thin: the stub runs the venv's Python, so llmkiln is importable, and everything testable lives
in llmkiln.serve.handler. The engine folder comes from the config parameter `engine_dir`.
"""

import faulthandler
from typing import Any

import triton_python_backend_utils as pb_utils

from llmkiln.serve.handler import ServeCore
from llmkiln.serve.parent_watch import exit_with_parent


class TritonPythonModel:
    """Decoupled model: execute() is a coroutine, so many requests are in flight at once."""

    def initialize(self, args: dict[str, Any]) -> None:
        exit_with_parent()  # a killed tritonserver's stub would otherwise keep its ports for minutes
        faulthandler.enable(all_threads=True)  # a native crash prints the Python stacks into the server's log
        self.core = ServeCore.from_args(args, pb_utils)

    async def execute(self, requests: list[Any]) -> None:
        await self.core.execute(requests)
        return None

    def finalize(self) -> None:
        self.core.shutdown()
