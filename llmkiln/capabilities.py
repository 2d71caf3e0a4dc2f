"""Backends and what each honours: the one place that says which recipe field takes effect on which backend.

`Backend` is the one list of backend names (compare against its members, never against strings). A recipe
field declares the backends that honour it with `honoured_by(...)` in its `Field(json_schema_extra=...)`; a
field without a declaration is honoured by every backend, a section's declaration covers all its fields.
`llmkiln.recipe` walks every field of a recipe against its backend: one that differs from its default on a
backend that ignores it is an error naming the field and the backends that take it (exit 2), so a setting never
silently does nothing. `kiln recipe show` shows only the fields the recipe's backend reads; llmkiln.trtllm.rules
keeps only the value rules (a field TensorRT-LLM reads, with a value it would override).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from pydantic.fields import FieldInfo

HONOURED_BY = "honoured_by"
WHY = "ignored_because"


class Backend(enum.StrEnum):
    """What an engine is built for and served by."""

    ONNX_CPU = "onnx-cpu"  # onnxruntime-genai's export, llmkiln's runtime on the CPU
    ONNX_GPU = "onnx-gpu"  # the same export with a CUDA / TensorRT execution provider
    OPENVINO_CPU = "openvino-cpu"  # an OpenVINO IR run as OpenVINO's PagedAttention graph, llmkiln's runtime
    TRTLLM = "trtllm"  # TensorRT engine (trtllm-build) + the tensorrtllm Triton model set
    TRTLLM_LLMAPI = "trtllm-llmapi"  # TensorRT-LLM's PyTorch backend (LLM API) on the ModelOpt HF checkpoint

    @property
    def is_trtllm(self) -> bool:
        return self in TRTLLM_BACKENDS

    @property
    def runs_llmkiln_runtime(self) -> bool:
        """llmkiln's own runtime (scheduler, block store, onnxruntime or OpenVINO runner) serves this backend's
        engines."""
        return self in LLMKILN_RUNTIME


TRTLLM_BACKENDS: tuple[Backend, ...] = (Backend.TRTLLM, Backend.TRTLLM_LLMAPI)
LLMKILN_RUNTIME: tuple[Backend, ...] = (Backend.ONNX_CPU, Backend.ONNX_GPU, Backend.OPENVINO_CPU)
ONNX_BACKENDS: tuple[Backend, ...] = (Backend.ONNX_CPU, Backend.ONNX_GPU)
ALL_BACKENDS: tuple[Backend, ...] = tuple(Backend)

# Which precisions each backend can build.
BACKEND_PRECISIONS: dict[Backend, tuple[str, ...]] = {
    Backend.ONNX_CPU: ("fp32", "int8", "int4"),
    Backend.ONNX_GPU: ("fp32", "int8", "int4"),
    Backend.OPENVINO_CPU: (
        "fp32",
        "bf16",
    ),  # bf16: OpenVINO's inference precision (AVX512-BF16 / AMX), bf16 KV
    Backend.TRTLLM: ("fp8",),
    Backend.TRTLLM_LLMAPI: ("fp8",),
}

# openvino-cpu: the KV lives in OpenVINO's PagedAttention blocks, which are the KV cache manager's blocks; its CPU
# plugin's block (checked again by the runner against the compiled graph at load)
OPENVINO_BLOCK_SIZE = 32


def honoured_by(*backends: Backend, why: str = "") -> dict[str, Any]:
    """A field's capability declaration, for Field(json_schema_extra=...); `why` is shown to a user who set the
    field on another backend (e.g. what to set there instead)."""
    if not backends:
        raise ValueError("honoured_by() needs at least one backend")
    out: dict[str, Any] = {HONOURED_BY: [b.value for b in backends]}
    if why:
        out[WHY] = why
    return out


def field_backends(info: FieldInfo) -> tuple[Backend, ...]:
    """The backends a field (or section) honours: its declaration, else all."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and HONOURED_BY in extra:
        names = extra[HONOURED_BY]
        assert isinstance(names, list)
        return tuple(Backend(str(n)) for n in names)
    return ALL_BACKENDS


def field_why(info: FieldInfo) -> str:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get(WHY), str):
        return str(extra[WHY])
    return ""


def names(backends: Iterable[Backend]) -> str:
    return ", ".join(b.value for b in backends)
