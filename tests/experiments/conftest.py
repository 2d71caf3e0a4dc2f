"""The experiments' tests (experiments/ is imported from the repository root: pyproject's pytest `pythonpath`).

No __init__.py here: as a package this folder would be named `experiments` and hide the experiments themselves.
`report_factory` is tests/bench's synthetic report (tests/ is on sys.path as the root conftest's folder)."""

from __future__ import annotations

import pytest
from bench.conftest import fake_report


@pytest.fixture
def report_factory():
    return fake_report
