"""ONNX export with onnxruntime-genai's model builder (GroupQueryAttention + rotary, SkipSimplifiedLayerNorm,
MatMulNBits for int8/int4), offline from a local HF folder; plus copying the source tokenizer files.

fp32 keeps every weight bit-identical (the builder only transposes and concatenates q/k/v). int8/int4 use the
builder's weight-only RTN quantization with accuracy_level=1 (fp32 activations), which keeps prefill and
decode numerically consistent on CPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmkiln.build.capacity import check_model_fits
from llmkiln.build.logs import output_to
from llmkiln.build.rope_fix import derive_position_ids, needs_separate_rope
from llmkiln.build.stages import BuildContext
from llmkiln.capabilities import Backend
from llmkiln.chat_template import PLAIN_TEMPLATE
from llmkiln.engine_dir import GENAI_CONFIG, HF_CONFIG, EngineDir
from llmkiln.errors import BadInput, BuildFailed
from llmkiln.tokenizer_files import (
    GENERATION_CONFIG,
    TOKENIZER_FILES,
    copy_tokenizer_files,
    model_chat_template,
)
from llmkiln.versions import package_versions

# Files the builder writes; everything the engine needs from the export.
EXPORT_FILES = ("model.onnx", "model.onnx.data", "genai_config.json")

# Files copied verbatim from the source model when present (the tokenizer stage's); config.json is what
# OpenAI frontends that read Hugging Face folders (Dynamo) need besides the tokenizer.
COPIED_SOURCE_FILES = (*TOKENIZER_FILES, GENERATION_CONFIG, HF_CONFIG)

EXECUTION_PROVIDERS = {Backend.ONNX_CPU: "cpu", Backend.ONNX_GPU: "cuda"}

# Builder --extra_options per precision.
PRECISION_OPTIONS: dict[str, dict[str, str]] = {
    "fp32": {},
    "int8": {"accuracy_level": "1"},
    "int4": {"accuracy_level": "1"},
}

_BUILDER_TOOLS = ("onnxruntime-genai", "onnx", "onnx-ir", "transformers", "torch", "numpy")


def export_onnx(
    model_dir: Path,
    out_dir: Path,
    precision: str,
    execution_provider: str = "cpu",
    extra_options: dict[str, str] | None = None,
    log_path: Path | None = None,
) -> dict[str, Any]:
    """Run the onnxruntime-genai builder in-process: model_dir (HF folder) → out_dir (model.onnx, .data, config).

    The builder's chatter (and tqdm bars) go to log_path; its scratch cache lives inside out_dir and is removed.
    """
    from onnxruntime_genai.models import builder  # heavy: imports torch and transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / ".builder-cache"
    separate_rope = needs_separate_rope(model_dir, execution_provider)
    extra_options = dict(extra_options or {})
    if separate_rope:
        extra_options["fuse_qkv"] = "false"  # the builder's separate-rope path mishandles packed QKV
    options = [f"{k}={v}" for k, v in sorted(extra_options.items())]
    try:
        with output_to(log_path or Path(os.devnull)), _fused_rope(builder, enabled=not separate_rope):
            kwargs = builder.parse_extra_options(
                None, str(model_dir), str(out_dir), precision, execution_provider, str(cache_dir), options
            )
            builder.create_model(
                None, str(model_dir), str(out_dir), precision, execution_provider, str(cache_dir), **kwargs
            )
    except Exception as exc:
        tail = log_path.read_text()[-2000:] if log_path and log_path.is_file() else ""
        raise BuildFailed(f"onnxruntime-genai builder failed on {model_dir}: {exc}\n{tail}") from exc
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    missing = [f for f in EXPORT_FILES if not (out_dir / f).is_file()]
    if missing:
        raise BuildFailed(f"onnxruntime-genai builder did not write {', '.join(missing)} into {out_dir}")
    if separate_rope:
        derive_position_ids(out_dir / "model.onnx", out_dir / "genai_config.json")
    return {"rope": "separate RotaryEmbedding (head_size % 16 != 0)" if separate_rope else "fused in GQA"}


@contextlib.contextmanager
def _fused_rope(builder: Any, enabled: bool) -> Iterator[None]:
    """Temporarily make the builder emit separate RotaryEmbedding ops (enabled=False)."""
    if enabled:
        yield
        return
    # NOTE: builder.py imports its package as top-level `builders`, so patch that module's class.
    base = sys.modules["builders.base"].Model
    original = base.is_fused_rope_supported
    base.is_fused_rope_supported = lambda self: False
    try:
        yield
    finally:
        base.is_fused_rope_supported = original


def graph_summary(model_path: Path) -> dict[str, Any]:
    """Op-type counts and I/O names of an exported graph (read without its external weights)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    ops = Counter(n.op_type for n in model.graph.node)
    return {
        "op_counts": dict(sorted(ops.items())),
        "inputs": [i.name for i in model.graph.input],
        "outputs": [o.name for o in model.graph.output],
    }


class OnnxExportStage:
    """Export the source checkpoint with the onnxruntime-genai builder (cached by source hashes + precision)."""

    name = "export"
    version = "2"
    cacheable = True

    def check(self, ctx: BuildContext) -> None:
        if ctx.recipe.precision not in PRECISION_OPTIONS:
            raise BadInput(
                f"{ctx.recipe_file}: field 'precision': {ctx.recipe.precision!r} is not available on backend "
                f"{ctx.recipe.backend!r}; allowed: {', '.join(PRECISION_OPTIONS)}"
            )
        check_model_fits(ctx)

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {
            "source": ctx.source_hashes,
            "precision": ctx.recipe.precision,
            "execution_provider": EXECUTION_PROVIDERS[ctx.recipe.backend],
            "extra_options": PRECISION_OPTIONS[ctx.recipe.precision],
            "tools": package_versions(_BUILDER_TOOLS),
        }

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        t0 = time.perf_counter()
        ep = EXECUTION_PROVIDERS[ctx.recipe.backend]
        extra = PRECISION_OPTIONS[ctx.recipe.precision]
        info = export_onnx(
            ctx.source.path, out_dir, ctx.recipe.precision, ep, extra, log_path=out_dir / "stage.log"
        )
        # The tokenizer stage owns the tokenizer files; drop the builder's rewritten copies.
        for name in COPIED_SOURCE_FILES:
            (out_dir / name).unlink(missing_ok=True)
        return {
            "tool": "onnxruntime-genai model builder",
            "execution_provider": ep,
            "precision": ctx.recipe.precision,
            "extra_options": extra,
            "export_seconds": round(time.perf_counter() - t0, 3),
            **info,
            **graph_summary(out_dir / "model.onnx"),
        }


class TokenizerStage:
    """Copy the source model's tokenizer files (its chat_template.jinja among them) and config.json into the
    engine folder, and write the effective chat template into its tokenizer_config.json and chat_template.jinja:
    the recipe's own `chat_template`, else the model's, else llmkiln's plain one (every backend: one stage)."""

    name = "tokenizer"
    version = "3"
    cacheable = False

    def cache_key(self, ctx: BuildContext) -> dict[str, Any]:
        return {f: h for f, h in ctx.source_hashes.items() if f in COPIED_SOURCE_FILES}

    def run(self, ctx: BuildContext, out_dir: Path) -> dict[str, Any]:
        copied = copy_tokenizer_files(ctx.source.path, out_dir, COPIED_SOURCE_FILES)
        if "tokenizer.json" not in copied:
            raise BuildFailed(
                f"{ctx.source.path} has no tokenizer.json; the CPU runtime reads the tokenizer with `tokenizers` "
                "and needs it"
            )
        template, origin = effective_chat_template(ctx.recipe.chat_template, ctx.source.path)
        EngineDir(out_dir).write_chat_template(template)
        return {
            "files": copied,
            "chat_template": origin,
            "stop_token_ids": list(EngineDir(out_dir).stop_token_ids())
            if (out_dir / GENAI_CONFIG).is_file()
            else None,
        }


def effective_chat_template(from_recipe: str | None, model_dir: Path) -> tuple[str, str]:
    """(template, origin): the recipe's own template, else the model folder's, else PLAIN_TEMPLATE."""
    if from_recipe:
        return from_recipe, "recipe"
    template, where = model_chat_template(model_dir)
    if template is not None:
        return template, f"model ({where})"
    return PLAIN_TEMPLATE, "plain (the model ships none)"
