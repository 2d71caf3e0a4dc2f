"""Protocols for what llmkiln uses of `triton_python_backend_utils` (the python-backend stub's module, which has no
types): the module itself (`TritonPb`: logger, metric families, errors, responses, tensors, inputs by name), a
request (`TritonRequest`), its response sender and an input tensor. Nothing here runs; it only types.

`serve.metrics.TritonMetrics` and the serving core (`serve.handler.ServeCore`, `serve.response_stream`) take the
module typed as `TritonPb`, its requests as `TritonRequest` and their senders as `ResponseSender`; mypy checks the
unit tests' stand-in (tests/serve/pb_stub.py, its module and its request) against them. Responses, output tensors
and errors stay opaque (`object`): llmkiln builds them with the stub's constructors and hands them back to the stub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np


class TritonMetric(Protocol):
    """One labelled counter, gauge or histogram of a metric family."""

    def increment(self, value: float, /) -> None: ...

    def set(self, value: float, /) -> None: ...

    def observe(self, value: float, /) -> None: ...


class TritonMetricFamily(Protocol):
    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> TritonMetric: ...


class TritonMetricFamilyClass(Protocol):
    """`pb.MetricFamily`: the kinds, and the constructor of a family."""

    @property
    def COUNTER(self) -> int: ...

    @property
    def GAUGE(self) -> int: ...

    @property
    def HISTOGRAM(self) -> int: ...

    def __call__(self, name: str, description: str, kind: int) -> TritonMetricFamily: ...


class TritonLogger(Protocol):
    """`pb.Logger`: lines in tritonserver's log."""

    def log_info(self, message: str, /) -> None: ...

    def log_warn(self, message: str, /) -> None: ...

    def log_error(self, message: str, /) -> None: ...

    def log_verbose(self, message: str, /) -> None: ...


class TritonTensor(Protocol):
    def as_numpy(self) -> np.ndarray: ...


class ResponseSender(Protocol):
    """A decoupled request's response sender: responses, then one with the FINAL flag (possibly no response)."""

    def send(self, response: object | None = None, flags: int = 0) -> None: ...


class TritonRequest(Protocol):
    """One request handed to execute()."""

    def get_response_sender(self) -> ResponseSender: ...

    def request_id(self) -> str: ...

    def is_cancelled(self) -> bool: ...


class TritonPb(Protocol):
    """The module `triton_python_backend_utils`, as far as llmkiln uses it."""

    @property
    def TRITONSERVER_RESPONSE_COMPLETE_FINAL(self) -> int: ...

    @property
    def Logger(self) -> TritonLogger: ...

    @property
    def MetricFamily(self) -> TritonMetricFamilyClass: ...

    @property
    def TritonError(self) -> Callable[..., object]:
        """TritonError(message[, code]); codes (UNAVAILABLE, INVALID_ARG) as class attributes where the stub has
        them."""
        ...

    @property
    def InferenceResponse(self) -> Callable[..., object]:
        """InferenceResponse(output_tensors=[...]) or InferenceResponse(error=TritonError(...))."""
        ...

    @property
    def Tensor(self) -> Callable[[str, np.ndarray], object]: ...

    def get_input_tensor_by_name(self, request: object, name: str, /) -> TritonTensor | None: ...
