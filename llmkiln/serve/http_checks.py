"""Checks of a JSON body for Triton's HTTP generate endpoints, made before Triton converts it.

Triton 2.51 converts generate JSON into input tensors itself (server src/http_server.cc, tag v2.51.0,
`ReadDataFromJsonHelper`): an integer for an INT32 input is cast with `(int32_t)si`, so `max_tokens`
4294967301 reaches the model as 5; a value of the wrong JSON type fails with TRITONSERVER_ERROR_INTERNAL, which
`HttpCodeFromError` answers with HTTP 500; `stream: true` on `/generate` makes the model send several responses,
and Triton then answers 200 with an error body. The model cannot see any of that, so llmkiln's HTTP front
(serve/http_front.py) checks the body first: every known input must have its JSON type and fit its wire type,
and `/generate` refuses `stream: true` — a 400 naming the field and what is allowed, never echoing the value.
"""

from __future__ import annotations

import json
import math
from typing import Any

INT_RANGES = {"INT32": (-(2**31), 2**31 - 1), "INT64": (-(2**63), 2**63 - 1), "UINT64": (0, 2**64 - 1)}
FP32_MAX = 3.4028234663852886e38

# the model's inputs (llmkiln.serve.repository.INPUTS) by their Triton wire type
GENERATE_INPUTS: dict[str, str] = {
    "text_input": "BYTES",
    "max_tokens": "INT32",
    "stream": "BOOL",
    "exclude_input_in_output": "BOOL",
    "temperature": "FP32",
    "top_p": "FP32",
    "top_k": "INT32",
    "random_seed": "UINT64",
    "seed": "UINT64",
    "end_id": "INT32",
    "stop_words": "BYTES",
    "priority": "INT32",
    "return_perf_metrics": "BOOL",
}
LIST_INPUTS = {"stop_words"}


def _element_error(name: str, wire: str, value: Any) -> str | None:
    if wire == "BYTES":
        return None if isinstance(value, str) else f"field '{name}' must be a string"
    if wire == "BOOL":
        return None if isinstance(value, bool) else f"field '{name}' must be true or false"
    if wire in INT_RANGES:
        lo, hi = INT_RANGES[wire]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return f"field '{name}' must be an integer in [{lo}, {hi}] ({wire})"
        return None
    if wire == "FP32":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(float(value)) or abs(float(value)) > FP32_MAX:
            return f"field '{name}' must be a finite number that fits FP32"
        return None
    return None


def check_generate_body(body: bytes, streaming: bool, inputs: dict[str, str] | None = None) -> str | None:
    """The first problem of a generate request body (None when Triton may convert it safely)."""
    inputs = GENERATE_INPUTS if inputs is None else inputs
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "the request body is not valid JSON"
    if not isinstance(data, dict):
        return 'the request body must be a JSON object of inputs, e.g. {"text_input": ..., "max_tokens": 16}'
    for name, value in data.items():
        wire = inputs.get(name)
        if wire is None:
            continue  # not an input: Triton passes it on as a request parameter
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and name not in LIST_INPUTS and len(value) != 1:
            return f"field '{name}' takes one value"
        for v in values:
            problem = _element_error(name, wire, v)
            if problem is not None:
                return problem
    if not streaming and data.get("stream") is True:
        return (
            "'stream': true needs the streaming endpoint: POST .../generate_stream (server-sent events); "
            "/generate returns exactly one response"
        )
    return None
