"""The pinned TensorRT-LLM generation (pins.json beside this file): the one place versions come from.

Engine path and LLM-API path share one container: nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3 with
TensorRT-LLM 1.2.1 and TensorRT 10.14.1.48 (why this pairing: docs/gpu.md "Pinned generation"). Every fact in
pins.json carries its source; `pin(name)` returns the value, `PINS` the whole table (recorded in plan files).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

PINS_FILE = Path(__file__).with_name("pins.json")


@cache
def _table() -> dict[str, Any]:
    data = json.loads(PINS_FILE.read_text(encoding="utf-8"))
    return {k: v for k, v in data.items() if k != "about"}


def pin(name: str) -> Any:
    """The pinned value of `name` (KeyError names the known facts)."""
    table = _table()
    if name not in table:
        raise KeyError(f"no pin {name!r} in {PINS_FILE.name}; known: {', '.join(sorted(table))}")
    return table[name]["value"]


def source(name: str) -> str:
    """Where the fact `name` comes from."""
    return str(_table()[name]["source"])


def pins() -> dict[str, Any]:
    """{fact: value} of the whole table."""
    return {k: v["value"] for k, v in _table().items()}


def container() -> str:
    return str(pin("container"))


def version_tuple(version: str, parts: int) -> tuple[str, ...]:
    """The first `parts` dot-separated components ('1.2.1rc3' -> ('1', '2', '1rc3'))."""
    return tuple(version.split("+")[0].split(".")[:parts])
