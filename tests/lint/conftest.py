"""Fixtures of the lint tests."""

from __future__ import annotations

import pytest

from llmkiln.engine_dir import EngineDir


@pytest.fixture(scope="session")
def stories_engine(engine_factory) -> EngineDir:
    """The stories260K engine (built once per session)."""
    return EngineDir(engine_factory("stories-fp32"))
