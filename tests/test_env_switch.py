"""llmkiln.env_switch: one spelling of on/off for every $LLMKILN_* switch, and a clear error for anything else."""

from __future__ import annotations

import pytest

from llmkiln.env_switch import env_switch
from llmkiln.errors import BadInput
from llmkiln.runtime import cascade_attention

NAME = "LLMKILN_TEST_SWITCH"


@pytest.mark.parametrize("default", [True, False])
@pytest.mark.parametrize("raw", [None, "", "  "])
def test_unset_or_empty_keeps_the_default(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, default: bool
) -> None:
    if raw is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, raw)
    assert env_switch(NAME, default) is default


@pytest.mark.parametrize("raw", ["1", "true", "ON", " Yes ", "True"])
def test_on(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(NAME, raw)
    assert env_switch(NAME, False) is True


@pytest.mark.parametrize("raw", ["0", "false", "OFF", " no ", "False"])
def test_off(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(NAME, raw)
    assert env_switch(NAME, True) is False


@pytest.mark.parametrize("raw", ["of", "2", "enabled"])
def test_anything_else_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(NAME, raw)
    with pytest.raises(BadInput, match=rf"\${NAME}={raw!r}: give one of 1/true/on/yes"):
        env_switch(NAME, True)


def test_cascade_reads_off_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    # before the shared helper, $LLMKILN_CASCADE=OFF counted as on (the scheduler's switch lowercased, this did not)
    monkeypatch.setenv(cascade_attention.ENV, "OFF")
    assert cascade_attention.from_env(True) is False
    monkeypatch.delenv(cascade_attention.ENV)
    assert cascade_attention.from_env(True) is True
