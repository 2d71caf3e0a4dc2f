"""Checks of a JSON body for Triton's HTTP generate endpoints, made before Triton converts it.

Triton 2.51 converts generate JSON into input tensors itself (server src/http_server.cc, tag v2.51.0,
`ReadDataFromJsonHelper`): an integer for an INT32 input is cast with `(int32_t)si`, so `max_tokens`
4294967301 reaches the model as 5; a value of the wrong JSON type fails with TRITONSERVER_ERROR_INTERNAL, which
`HttpCodeFromError` answers with HTTP 500; `stream: true` on `/generate` makes the model send several responses,
and Triton then answers 200 with an error body. The model cannot see any of that, so llmkiln's HTTP front
(serve/http_front.py) checks the body first: every known input must have its JSON type and fit its wire type,
and `/generate` refuses `stream: true` — a 400 naming the field and what is allowed, never echoing the value.

The body must also be one Triton reads the way Python does: strict UTF-8, RFC 8259 JSON
(no NaN/Infinity), no key twice in an object (Python keeps the last, Triton's rapidjson the first: a string
`temperature` before a number one reached Triton and gave HTTP 500), no lone UTF-16 surrogate (`"\\ud800"`:
Triton answered 500), bounded nesting, and `id` (Triton's request id) a string (Triton answered 500 otherwise).
A one-element list counts as its element (`"stream": [true]` is `stream: true`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable
from typing import Any, NoReturn

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
    "num_speculative_tokens": "INT32",
    "disaggregated_params": "BYTES",
}
LIST_INPUTS = {"stop_words"}
REQUEST_ID = "id"  # Triton's generate request id: a JSON string or Triton answers 500
MAX_DEPTH = 64  # arrays/objects inside each other; a generate body needs 3


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _not_json(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _structure_error(data: object, inputs: Collection[str]) -> str | None:
    """Lone surrogates (in keys or strings) and nesting deeper than MAX_DEPTH, anywhere in the parsed body."""
    stack: list[tuple[object, int, str | None]] = [(data, 1, None)]
    while stack:
        value, depth, field = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                where = f"field '{field}'" if field in inputs else "a string in the request body"
                return f"{where} is not valid Unicode (a lone UTF-16 surrogate escape such as \\ud800)"
            continue
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return f"the request body is nested more than {MAX_DEPTH} levels deep"
            if isinstance(value, dict):
                for key, item in value.items():
                    stack.append((key, depth, field))
                    stack.append((item, depth + 1, key if depth == 1 else field))
            else:
                stack.extend((item, depth + 1, field) for item in value)
    return None


def _element_error(name: str, wire: str, value: object) -> str | None:
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
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or abs(value) > FP32_MAX
        ):
            return f"field '{name}' must be a finite number that fits FP32"
        return None
    return None


def first(value: object) -> object:
    """A field's value with a one-element list read as its element (what Triton does with batch-1 inputs)."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def parse_json_object(
    body: bytes, fields: Collection[str] = (), shape: str = "a JSON object"
) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """(the body's JSON object, None), or (None, its first problem): strict UTF-8 (what Triton reads; json.loads
    would guess UTF-16/32), RFC 8259 JSON (no NaN or Infinity), no key twice in one object, no lone UTF-16
    surrogate, nesting bounded. `fields`: the names a message may name (anything else is "a key" / "a string");
    `shape`: what the body must be, for the message when it is no object."""
    try:
        text = body.decode("utf-8")  # strictly: json.loads would guess UTF-16/32
    except UnicodeDecodeError:
        return None, "the request body is not UTF-8 text"
    try:
        data = json.loads(text, object_pairs_hook=_object, parse_constant=_not_json)
    except _DuplicateKey as dup:
        where = f"field '{dup.key}'" if dup.key in fields else "a key"
        return None, f"{where} appears more than once in one JSON object; send each field once"
    except RecursionError:
        return None, f"the request body is nested more than {MAX_DEPTH} levels deep"
    except ValueError:
        return None, "the request body is not valid JSON"
    if not isinstance(data, dict):
        return None, f"the request body must be {shape}"
    problem = _structure_error(data, fields)
    return (None, problem) if problem is not None else (data, None)


def parse_generate_body(
    body: bytes, streaming: bool, inputs: dict[str, str] | None = None
) -> tuple[dict[str, Any], None] | tuple[None, str]:
    """(the body's JSON object, None) when Triton may convert it safely, else (None, its first problem)."""
    inputs = GENERATE_INPUTS if inputs is None else inputs
    example = 'a JSON object of inputs, e.g. {"text_input": ..., "max_tokens": 16}'
    parsed = parse_json_object(body, (*inputs, REQUEST_ID), example)
    if parsed[0] is None:
        return parsed
    data = parsed[0]
    problem = _fields_error(data, streaming, inputs)
    return (None, problem) if problem is not None else (data, None)


PARAMETERS = "parameters"


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | bool | int | float)


def _parameter_error(name: str, value: object) -> str | None:
    """Triton reads a non-input field as a request parameter (a string, number or boolean) and `parameters` as an
    object of them; anything else it answers with HTTP 500 (measured: `"parameters": null`)."""
    if name == REQUEST_ID:
        return None
    if name == PARAMETERS:
        if not isinstance(value, dict):
            return f"field '{PARAMETERS}' must be a JSON object of strings, numbers or booleans"
        bad = next((k for k, v in value.items() if not _is_scalar(v)), None)
        if bad is not None:
            return f"field '{PARAMETERS}.{bad}' must be a string, a number or a boolean"
        return None
    if not _is_scalar(value):
        return f"field '{name}' (a request parameter) must be a string, a number or a boolean"
    return None


def _fields_error(data: dict[str, object], streaming: bool, inputs: dict[str, str]) -> str | None:
    """The first field of a parsed body (parse_json_object) that Triton would mangle, or None."""
    if REQUEST_ID in data and not isinstance(data[REQUEST_ID], str):
        return f"field '{REQUEST_ID}' (the request id) must be a string"
    for name, value in data.items():
        wire = inputs.get(name)
        if wire is None:  # not an input: Triton passes it on as a request parameter
            problem = _parameter_error(name, value)
            if problem is not None:
                return problem
            continue
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and name not in LIST_INPUTS and len(value) != 1:
            return f"field '{name}' takes one value"
        for v in values:
            problem = _element_error(name, wire, v)
            if problem is not None:
                return problem
    if not streaming and first(data.get("stream")) is True:  # [true] too: Triton reads it as true
        return (
            "'stream': true needs the streaming endpoint: POST .../generate_stream (server-sent events); "
            "/generate returns exactly one response"
        )
    return None


# A prompt with more UTF-8 bytes than max_input_len x (longest token in bytes) x this factor cannot fit in
# max_input_len tokens (the factor leaves room for normalizers that drop characters): it is refused before it is
# tokenized, so an oversized prompt costs no tokenizer time at all (the Triton model and the OpenAI front).
PRESCREEN_FACTOR = 4


def prompt_byte_bound(vocab: Iterable[str], max_input_len: int) -> int:
    """UTF-8 bytes beyond which a prompt surely exceeds `max_input_len` tokens (the vocabulary's longest token
    times max_input_len, with a margin): a prompt above it is refused before it is tokenized."""
    longest = max((len(t.encode("utf-8")) for t in vocab), default=1)
    return max_input_len * max(longest, 1) * PRESCREEN_FACTOR
