"""Fixtures of the diagnose tests."""

from __future__ import annotations

import pytest

from llmkiln.engine_dir import EngineDir


@pytest.fixture(scope="session")
def stories_engine_dir(engine_factory) -> EngineDir:
    return EngineDir(engine_factory("stories-fp32"))
