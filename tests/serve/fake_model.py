"""Test model for the real-server tests: the real ServeCore over the stand-in engine.

conftest.fake_repository copies this file over a repository's `1/model.py` and fake_engine.py next to it.
"""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import triton_python_backend_utils as pb_utils

from llmkiln.host.engine_host import EngineHost
from llmkiln.serve.handler import ServeCore, ServeSettings, StubLog
from llmkiln.serve.parent_watch import exit_with_parent


def _fake_engine_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "llmkiln_fake_engine", Path(__file__).with_name("fake_engine.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        exit_with_parent()
        engine = _fake_engine_module().FakeEngine().start()
        host = EngineHost(engine, log=StubLog(pb_utils))
        self.core = ServeCore(pb_utils, host, ServeSettings.from_args(args))
        self.core.warm()  # the repository's warmup section, as the real model does

    async def execute(self, requests: list[Any]) -> None:
        await self.core.execute(requests)
        return None

    def finalize(self) -> None:
        self.core.shutdown()
