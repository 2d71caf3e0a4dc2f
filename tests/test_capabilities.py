"""Backend capabilities in one place: every recipe field declares the backends that honour it (llmkiln.capabilities);
a field set on a backend that ignores it is an error naming the field and the backends that take it."""

from __future__ import annotations

import typing
from typing import Any, get_args, get_origin

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from llmkiln.capabilities import ALL_BACKENDS, Backend, field_backends, names
from llmkiln.errors import RecipeError
from llmkiln.recipe import Recipe, ignored_settings, load_recipe

BASE = {
    Backend.ONNX_CPU: ("tiny-fp32", None),
    Backend.ONNX_GPU: ("tiny-fp32", {"backend": "onnx-gpu"}),
    Backend.OPENVINO_CPU: ("stories-ov-fp32", None),
    Backend.TRTLLM: ("tiny-trtllm-fp8", None),
    Backend.TRTLLM_LLMAPI: ("tiny-trtllm-llmapi", None),
}


def _recipe(backend: Backend) -> Recipe:
    name, overrides = BASE[backend]
    return load_recipe(name, overrides=overrides)[0]


def _changed_value(info: FieldInfo, current: Any) -> Any:
    """Some value other than `current` of the field's type (not validated: ignored_settings only compares)."""
    ann = info.annotation
    args = [a for a in get_args(ann) if a is not type(None)]
    if get_origin(ann) is typing.Literal or any(get_origin(a) is typing.Literal for a in args):
        choices = get_args(ann) if get_origin(ann) is typing.Literal else get_args(args[0])
        return next(c for c in choices if c != current)
    if isinstance(current, bool):
        return not current
    if isinstance(current, int | float):
        return current + 1
    if isinstance(current, str):
        return current + "x"
    if isinstance(current, list):
        item = get_args(ann)[0]
        return [*current, "x" if item is str else 1]
    if current is None:
        base = args[0] if args else ann
        if get_origin(base) is list:
            item = get_args(base)[0]
            return [*(current or []), "x" if item is str else 1]
        return {int: 1, float: 1.0, str: "x"}.get(base, 1)
    raise AssertionError(f"no changed value for {info}")


def _fields() -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for name, info in Recipe.model_fields.items():
        t = info.annotation
        if isinstance(t, type) and issubclass(t, BaseModel):
            out += [(name, f) for f in t.model_fields]
        else:
            out.append((name, None))
    return out


FIELDS = _fields()
SKIP_TOP = {"name", "model", "backend"}  # identity and what the backend is: every backend reads them


@pytest.mark.parametrize("backend", list(Backend))
def test_every_field_on_every_backend(backend: Backend) -> None:
    base = _recipe(backend)
    assert ignored_settings(base) == []
    walked = 0
    for section, field in FIELDS:
        if field is None:
            if section in SKIP_TOP:
                continue
            info = Recipe.model_fields[section]
            value = _changed_value(info, getattr(base, section))
            recipe = base.model_copy(update={section: value})
            takes = field_backends(info)
            key = section
        else:
            sec = getattr(base, section)
            info = type(sec).model_fields[field]
            value = _changed_value(info, getattr(sec, field))
            recipe = base.model_copy(update={section: sec.model_copy(update={field: value})})
            sec_backends = field_backends(Recipe.model_fields[section])
            takes = tuple(b for b in field_backends(info) if b in sec_backends)
            key = f"{section}.{field}"
        lines = ignored_settings(recipe)
        walked += 1
        if backend in takes:
            assert lines == [], (key, lines)
        else:
            assert len(lines) == 1 and key in lines[0], (key, lines)
            shown = lines[0]
            assert names(takes) in shown or "this section is only for" in shown, shown
            assert all(b.value in shown for b in takes), shown
    assert walked == len([f for f in FIELDS if f[1] is not None or f[0] not in SKIP_TOP])


def test_the_runtime_fields_the_issue_named_are_cpu_only() -> None:
    for section, field in [
        ("scheduler", "ttft_first"),
        ("scheduler", "tpot_slo_ms"),
    ]:
        info = Recipe.model_fields[section].annotation.model_fields[field]  # type: ignore[union-attr]
        assert set(field_backends(info)) == {Backend.ONNX_CPU, Backend.ONNX_GPU, Backend.OPENVINO_CPU}
    # a slot-resident prefix exists only on the slot runners; openvino-cpu shares blocks by table instead
    info = Recipe.model_fields["kv_cache"].annotation.model_fields["slot_reuse"]  # type: ignore[union-attr]
    assert set(field_backends(info)) == {Backend.ONNX_CPU, Backend.ONNX_GPU}


def test_openvino_recipes_take_openvinos_block_and_no_kv_dtype() -> None:
    with pytest.raises(RecipeError, match="kv_cache.tokens_per_block: 16; backend openvino-cpu .* 32"):
        load_recipe("stories-ov-fp32", overrides={"kv_cache": {"tokens_per_block": 16}})
    with pytest.raises(RecipeError, match="kv_cache.dtype.*openvino-cpu keeps the KV in OpenVINO's blocks"):
        load_recipe("stories-ov-fp32", overrides={"kv_cache": {"dtype": "fp16"}})


def test_a_cpu_field_on_a_trtllm_recipe_is_exit_2_naming_the_field_and_its_backends() -> None:
    with pytest.raises(RecipeError) as exc:
        load_recipe("tiny-trtllm-llmapi", overrides={"scheduler": {"ttft_first": True}})
    msg = str(exc.value)
    assert (
        "scheduler.ttft_first: not used by backend trtllm-llmapi (honoured by onnx-cpu, onnx-gpu, openvino-cpu"
        in msg
    )
    assert exc.value.exit_code == 2


def test_recipe_show_lists_only_what_the_backend_reads() -> None:
    cpu = _recipe(Backend.ONNX_CPU).for_backend()
    assert "trtllm" not in cpu and "llmapi" not in cpu
    assert "free_gpu_memory_fraction" not in cpu["kv_cache"] and "slot_reuse" in cpu["kv_cache"]
    gpu = _recipe(Backend.TRTLLM_LLMAPI).for_backend()
    assert "llmapi" in gpu and "ttft_first" not in gpu["scheduler"] and "max_bytes" not in gpu["kv_cache"]
    assert "gemm_plugin" not in gpu["trtllm"] and "tp_size" in gpu["trtllm"]
    assert set(ALL_BACKENDS) == set(Backend)
