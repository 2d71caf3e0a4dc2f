"""A stand-in for triton_python_backend_utils: enough surface for ServeCore unit tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


class TritonError:
    INVALID_ARG = 3
    UNAVAILABLE = 14

    def __init__(self, message: str, code: int | None = None) -> None:
        self.msg, self.code = message, code

    def message(self) -> str:
        return self.msg


@dataclass
class Tensor:
    name: str
    arr: np.ndarray

    def as_numpy(self) -> np.ndarray:
        return self.arr


@dataclass
class InferenceResponse:
    output_tensors: list[Tensor] = field(default_factory=list)
    error: TritonError | None = None

    def out(self, name: str) -> np.ndarray | None:
        return next((t.arr for t in self.output_tensors if t.name == name), None)


class Logger:
    lines: list[str] = []

    @classmethod
    def log_info(cls, m: str) -> None:
        cls.lines.append("I " + m)

    @classmethod
    def log_warn(cls, m: str) -> None:
        cls.lines.append("W " + m)

    @classmethod
    def log_error(cls, m: str) -> None:
        cls.lines.append("E " + m)

    @classmethod
    def log_verbose(cls, m: str) -> None:
        cls.lines.append("V " + m)


class _Metric:
    def __init__(self, labels: dict[str, str], buckets: list[float] | None = None) -> None:
        self.value = 0.0
        self.observed: list[float] = []

    def increment(self, v: float) -> None:
        self.value += v

    def set(self, v: float) -> None:
        self.value = v

    def observe(self, v: float) -> None:
        self.observed.append(v)


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> _Metric:
        return _Metric(labels, buckets)


def get_input_tensor_by_name(request: Any, name: str) -> Tensor | None:
    arr = request.inputs.get(name)
    return None if arr is None else Tensor(name, np.asarray(arr))


class Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self.done_at = 0.0  # time.perf_counter() of the FINAL response

    def send(self, response: object | None = None, flags: int = 0) -> None:
        assert not any(f & TRITONSERVER_RESPONSE_COMPLETE_FINAL for _, f in self.sent), "sent after FINAL"
        assert response is None or isinstance(response, InferenceResponse), f"not a response: {response!r}"
        self.sent.append((response, flags))
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.done_at = time.perf_counter()

    @property
    def final(self) -> bool:
        return bool(self.sent) and bool(self.sent[-1][1] & TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def texts(self) -> list[str]:
        out = []
        for r, _ in self.sent:
            text = None if r is None else r.out("text_output")
            if text is not None:
                out.append(text[0, 0].decode())
        return out

    def errors(self) -> list[str]:
        return [r.error.msg for r, _ in self.sent if r is not None and r.error is not None]


class Request:
    def __init__(self, rid: str = "", cancel_after: int | None = None, **inputs: Any) -> None:
        self.inputs = inputs
        self.sender = Sender()
        self.rid = rid
        self.checks = 0
        self.cancel_after = cancel_after

    def get_response_sender(self) -> Sender:
        return self.sender

    def request_id(self) -> str:
        return self.rid

    def is_cancelled(self) -> bool:
        self.checks += 1
        return self.cancel_after is not None and self.checks > self.cancel_after


if TYPE_CHECKING:  # mypy checks this module against the surface it stands in for
    from llmkiln.serve.triton_pb import TritonPb, TritonRequest
    from tests.serve import pb_stub

    _conforms: TritonPb = pb_stub
    _request: TritonRequest = Request()
