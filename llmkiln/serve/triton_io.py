"""Pure request/response conversion for the Triton model (no pb_utils import: unit-tested without a server).

Requests follow the tensorrtllm_backend ensemble: every tensor arrives as a numpy array of shape [batch, n]
(batch 1) or [n]. `parse_request(get)` turns them into a `ParsedRequest`, raising `InvalidRequest` with a
message naming the input, the bad value and what is allowed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np


class InvalidRequest(ValueError):
    """A request the model refuses; the message is sent to the client as a Triton error. Messages name the
    input and what is allowed, never the raw value (it may be bytes a client should not see echoed)."""


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# a hand-off's JSON: the prefill engine's NIXL agent metadata (a few KiB) and one block id per prompt block
MAX_HANDOFF_BYTES = 1 << 20
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class RequestLimits:
    """Size limits checked on the raw tensors before any decoding or tokenization (recipe `serve:` fields)."""

    max_prompt_bytes: int = 256 * 1024
    max_stop_words: int = 32
    max_stop_word_bytes: int = 256


class SamplingKwargs(TypedDict, total=False):
    """The keyword arguments of llmkiln.runtime.request.SamplingParams that a Triton request sets."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop_token_ids: tuple[int, ...]
    num_speculative_tokens: int | None


@dataclass(frozen=True)
class ParsedRequest:
    """One generation request, decoded from Triton tensors."""

    prompt: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    end_id: int | None = None
    stop_words: tuple[str, ...] = ()
    priority: int = 0
    stream: bool = False
    exclude_input_in_output: bool = False
    return_perf_metrics: bool = False
    num_speculative_tokens: int | None = None  # drafts per step (an engine with speculation); 0: none
    # a decode-role model: the prefill-role model's hand-off, the text of its `disaggregated_params` output
    disaggregated_params: str | None = None

    def sampling_kwargs(self) -> SamplingKwargs:
        """Keyword arguments for llmkiln.runtime.request.SamplingParams."""
        kw: SamplingKwargs = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }
        if self.end_id is not None:
            kw["stop_token_ids"] = (self.end_id,)
        if self.num_speculative_tokens is not None:
            kw["num_speculative_tokens"] = self.num_speculative_tokens
        return kw


ArrayGetter = Callable[[str], "np.ndarray | None"]


def _flat(name: str, arr: np.ndarray) -> np.ndarray:
    a = np.asarray(arr)
    if a.ndim > 2 or (a.ndim == 2 and a.shape[0] != 1):
        raise InvalidRequest(
            f"input {name!r}: shape {list(a.shape)} not supported; send batch size 1, shape [1, n]"
        )
    return a.reshape(-1)


def _scalar(name: str, arr: np.ndarray) -> object:
    a = _flat(name, arr)
    if a.size != 1:
        raise InvalidRequest(
            f"input {name!r}: expected one value, got {a.size} (shape {list(np.shape(arr))})"
        )
    return a[0]


def _raw_bytes(name: str, value: object, limit: int, what: str) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes | np.bytes_):
        raise InvalidRequest(f"input {name!r}: expected BYTES (a UTF-8 string), got {type(value).__name__}")
    raw = bytes(value)
    if len(raw) > limit:
        raise InvalidRequest(f"input {name!r}: {len(raw)} bytes is more than {what} ({limit} bytes)")
    return raw


def _text(name: str, value: object, limit: int, what: str) -> str:
    """A BYTES element as text, its size checked before it is decoded."""
    raw = _raw_bytes(name, value, limit, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"input {name!r}: not valid UTF-8 (at byte {exc.start})") from None


def _int(name: str, value: object, lo: int, hi: int) -> int:
    """An integer in [lo, hi]; the value itself is never echoed."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise InvalidRequest(f"input {name!r}: expected an integer, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidRequest(f"input {name!r} is out of range: must be >= {lo} and <= {hi}")
    return v


def _float(name: str, value: object) -> float:
    """A finite number; the value itself is never echoed."""
    if not isinstance(value, float | np.floating | int | np.integer) or isinstance(value, bool | np.bool_):
        raise InvalidRequest(f"input {name!r}: expected a number, got {type(value).__name__}")
    v = float(value)
    if not np.isfinite(v):
        raise InvalidRequest(f"input {name!r}: expected a finite number")
    return v


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise InvalidRequest(f"input {name!r}: expected BOOL, got {type(value).__name__}")


def parse_request(
    get: ArrayGetter, exclude_input_default: bool = False, limits: RequestLimits | None = None
) -> ParsedRequest:
    """Decode one request; `get(name)` returns the input's numpy array or None when absent.

    Sizes are checked against `limits` before anything is decoded. Integers are checked against the width of
    their wire type (INT32, UINT64) and floats for finiteness, with messages that never echo the value; the
    sampling ranges are checked once, by the runtime's SamplingParams (whose messages do not echo it either)."""
    limits = limits or RequestLimits()
    raw = get("text_input")
    if raw is None:
        raise InvalidRequest("input 'text_input' is missing (BYTES, shape [1, 1]: the prompt)")
    prompt = _text(
        "text_input", _scalar("text_input", raw), limits.max_prompt_bytes, "serve.max_prompt_bytes"
    )
    if not prompt:
        raise InvalidRequest("input 'text_input' is empty; send a non-empty prompt")
    raw = get("max_tokens")
    if raw is None:
        raise InvalidRequest("input 'max_tokens' is missing (INT32, shape [1, 1]: tokens to generate)")
    kw: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": _int("max_tokens", _scalar("max_tokens", raw), INT32_MIN, INT32_MAX),
        "exclude_input_in_output": exclude_input_default,
    }
    scalars: dict[str, Callable[[object], float | bool]] = {
        "temperature": lambda v: _float("temperature", v),
        "top_p": lambda v: _float("top_p", v),
        "top_k": lambda v: _int("top_k", v, INT32_MIN, INT32_MAX),
        "random_seed": lambda v: _int("random_seed", v, 0, UINT64_MAX),
        "seed": lambda v: _int("seed", v, 0, UINT64_MAX),
        "end_id": lambda v: _int("end_id", v, INT32_MIN, INT32_MAX),
        "priority": lambda v: _int("priority", v, INT32_MIN, INT32_MAX),
        "stream": lambda v: _bool("stream", v),
        "exclude_input_in_output": lambda v: _bool("exclude_input_in_output", v),
        "return_perf_metrics": lambda v: _bool("return_perf_metrics", v),
        "num_speculative_tokens": lambda v: _int("num_speculative_tokens", v, INT32_MIN, INT32_MAX),
    }
    for name, conv in scalars.items():
        arr = get(name)
        if arr is None:
            continue
        value = conv(_scalar(name, arr))
        kw["seed" if name == "random_seed" else name] = value
    arr = get("stop_words")
    if arr is not None:
        flat = _flat("stop_words", arr)
        if flat.size > limits.max_stop_words:
            raise InvalidRequest(
                f"input 'stop_words': {flat.size} stop strings is more than serve.max_stop_words "
                f"({limits.max_stop_words})"
            )
        words = tuple(
            _text("stop_words", v, limits.max_stop_word_bytes, "serve.max_stop_word_bytes") for v in flat
        )
        kw["stop_words"] = tuple(w for w in words if w)
    arr = get("disaggregated_params")
    if arr is not None:
        name = "disaggregated_params"
        kw[name] = _text(name, _scalar(name, arr), MAX_HANDOFF_BYTES, "a hand-off's limit")
    return ParsedRequest(**kw)


# ---------------------------------------------------------------------------------------------------------------
# Stop strings


@dataclass
class StopMatcher:
    """Cuts generated text at the first stop string, holding back a tail that might start one.

    feed(delta) returns (text safe to emit now, stopped). Text is never emitted past a stop string and a
    partial match is withheld until it is resolved; finish() releases what is held.
    """

    stops: tuple[str, ...] = ()
    _held: str = field(default="", init=False)

    def feed(self, delta: str) -> tuple[str, bool]:
        if not self.stops:
            return delta, False
        buf = self._held + delta
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = 0
        for s in self.stops:
            # the longest tail of buf that starts s: only positions holding s[0] can start one
            i = buf.find(s[0], max(len(buf) - len(s) + 1, 0))
            while i != -1:
                if s.startswith(buf[i:]):
                    keep = max(keep, len(buf) - i)
                    break
                i = buf.find(s[0], i + 1)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def finish(self) -> str:
        held, self._held = self._held, ""
        return held


# ---------------------------------------------------------------------------------------------------------------
# Responses


def text_array(text: str) -> np.ndarray:
    """text_output tensor: shape [1, 1] (batch 1, one sequence), dtype object of UTF-8 bytes."""
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


@dataclass(frozen=True)
class PerfFields:
    """Per-request perf outputs in the spirit of tensorrtllm's return_perf_metrics (times are time.time_ns())."""

    arrival_time_ns: int
    first_scheduled_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int
    kv_cache_reused_tokens: int
    kv_cache_reused_blocks: int
    num_input_tokens: int
    num_output_tokens: int


def perf_arrays(perf: PerfFields) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"):
        out[name] = np.array([[getattr(perf, name)]], dtype=np.int64)
    for name in ("kv_cache_reused_tokens", "kv_cache_reused_blocks", "num_input_tokens", "num_output_tokens"):
        out[name] = np.array([[getattr(perf, name)]], dtype=np.int32)
    return out


def response_arrays(
    text: str, perf: PerfFields | None = None, disaggregated_params: Mapping[str, Any] | None = None
) -> dict[str, np.ndarray]:
    """Output tensors of one response: text_output, plus the perf fields on the final response when asked, plus
    a prefill-role model's hand-off (JSON text: the decode-role model's `disaggregated_params` input)."""
    out = {"text_output": text_array(text)}
    if perf is not None:
        out.update(perf_arrays(perf))
    if disaggregated_params is not None:
        out["disaggregated_params"] = text_array(json.dumps(disaggregated_params, separators=(",", ":")))
    return out
