"""int8 weights for backend openvino-cpu (recipe field `weights: int8`): NNCF's weight compression of the exported
IR, the library OpenVINO ships for it (optimum-intel and openvino-genai's exports use the same call).

`nncf.compress_weights(mode=INT8_ASYM)`: every linear layer's weight becomes uint8 with a zero point and one f16
scale per output channel, in the graph as Constant(u8) → Convert → Subtract → Multiply, the decompression pattern
the CPU plugin fuses into its FullyConnected kernel (weights read as int8, computed in the inference precision).
The checkpoint is not touched: the export stage checked the fp32 IR bit for bit against it first, and this
stage rewrites only the engine's copy.

Kept as exported (fp32), because compressing them moved the logits most (SmolLM2-135M, first 8 english-eval
texts, bf16 compute with OpenVINO's default dynamic quantization; `python -m experiments.openvino_int8_weights`,
docs/cpu-engine.md "int8 weights"):

- the token embedding: on a model with tied embeddings (SmolLM2) it is also the LM head (mean KL to fp32 8.45e-3
  with it compressed, 6.15e-3 kept);
- every MLP down projection: its input is the SwiGLU product swish(gate) * up, whose outliers the CPU plugin's
  dynamic int8 quantization of activations (groups of 32) rounds worst (6.15e-3 → 4.33e-3, top-1 0.960 → 0.963;
  and no slower: the steps were 15% faster than the bf16 checkpoint's either way).

Every other linear weight (q, k, v, o, gate, up) is compressed.

The quality gate (calibration stage) then scores the compressed engine against the fp32 checkpoint, like every
quantized recipe.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from llmkiln.engine_dir import OPENVINO_BIN, OPENVINO_XML
from llmkiln.errors import BuildFailed

log = logging.getLogger(__name__)

_NNCF_MODE = {"int8": "INT8_ASYM"}
# what this module does to an IR, in the export stage's cache key: change it when the compression changes, so an
# engine built by an older rule is not reused
METHOD = (
    "nncf INT8_ASYM per output channel; kept fp32: token embedding (+ tied LM head), MLP down projections "
    "(the weights fed by act(gate) * up)"
)


def _embedding_nodes(model: Any) -> list[str]:
    """Names of the Gathers that read a constant [vocab, hidden] table (the token embedding), and of the
    MatMuls that share that table (a tied LM head)."""
    out: list[str] = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Gather":
            continue
        table = op.input_value(0).get_node()
        if table.get_type_name() != "Constant" or len(table.shape) != 2:
            continue
        out.append(op.get_friendly_name())
        for target in table.output(0).get_target_inputs():
            node = target.get_node()
            if node.get_type_name() == "MatMul":
                out.append(node.get_friendly_name())
    return out


# the gated MLP's activation as the PyTorch frontend exports it (SiLU → Swish; GELU-gated models → Gelu)
_MLP_ACTIVATIONS = {"Swish", "Gelu"}


def _is_mlp_product(node: Any) -> bool:
    """act(gate) * up: a Multiply of the activation's output and a computed value. Not any Multiply of two
    computed values: an RMSNorm whose gamma is all ones (a generated model's) is exported without its
    multiply-by-gamma, so its last Multiply is x * rsqrt(...) and would pass for the MLP's (the bench model's q, k,
    v, gate and up were all kept: 73 of 85 weights)."""
    if node.get_type_name() != "Multiply":
        return False
    kinds = {node.input_value(i).get_node().get_type_name() for i in range(2)}
    return bool(kinds & _MLP_ACTIVATIONS) and not kinds & {"Constant", "Convert"}


def _weight_matmuls(model: Any) -> list[Any]:
    """The MatMuls with a constant weight, in graph order (every linear layer: the PyTorch frontend names them all
    `aten::linear/MatMul_N`, so layers are found by structure)."""
    return [
        op
        for op in model.get_ordered_ops()
        if op.get_type_name() == "MatMul"
        and op.input_value(1).get_node().get_type_name() in ("Constant", "Convert")
    ]


def _down_projections(model: Any) -> list[str]:
    """Names of the weight MatMuls fed by the MLP's product: every layer's down_proj."""
    return [
        op.get_friendly_name()
        for op in _weight_matmuls(model)
        if _is_mlp_product(op.input_value(0).get_node())
    ]


def compressed_tensors(model: Any) -> int:
    """How many weights NNCF compressed in `model` (a weight and its zero point are u8 constants each)."""
    import openvino as ov

    u8 = sum(
        1
        for op in model.get_ordered_ops()
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.u8
    )
    return u8 // 2


def compress_weights(ir_dir: Path, mode: str) -> dict[str, Any]:
    """Rewrite ir_dir's openvino_model.xml/.bin with `mode` weights (int8); returns what the manifest records.
    BuildFailed when NNCF compresses nothing (an IR this stage does not understand)."""
    if mode not in _NNCF_MODE:
        raise ValueError(f"weights {mode!r}: compress_weights takes {', '.join(_NNCF_MODE)}")
    import nncf
    import openvino as ov

    t0 = time.perf_counter()
    xml = ir_dir / OPENVINO_XML
    before = (ir_dir / OPENVINO_BIN).stat().st_size
    model = ov.Core().read_model(str(xml))
    embedding, down = _embedding_nodes(model), _down_projections(model)
    keep = embedding + down
    compressed = nncf.compress_weights(
        model,
        mode=getattr(nncf.CompressWeightsMode, _NNCF_MODE[mode]),
        ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
    )
    n = compressed_tensors(compressed)
    if n == 0:
        raise BuildFailed(f"{xml}: NNCF compressed no weight to {mode}; the IR is not an exported Llama")
    tmp = ir_dir / f".{OPENVINO_XML}.int8"
    tmp.mkdir(exist_ok=True)
    ov.save_model(compressed, str(tmp / OPENVINO_XML), compress_to_fp16=False)
    del model, compressed  # they map the old .bin: let go of it before it is replaced
    for name in (OPENVINO_XML, OPENVINO_BIN):
        (tmp / name).replace(ir_dir / name)
    tmp.rmdir()
    after = (ir_dir / OPENVINO_BIN).stat().st_size
    log.info("weights %s: %d tensors, IR %.0f -> %.0f MB", mode, n, before / 1e6, after / 1e6)
    return {
        "weights": mode,
        "method": METHOD,
        "compressed_tensors": n,
        "kept_as_exported": {"embedding": embedding, "mlp_down_projections": len(down)},
        "ir_bytes_before": before,
        "ir_bytes": after,
        "seconds": round(time.perf_counter() - t0, 3),
    }
