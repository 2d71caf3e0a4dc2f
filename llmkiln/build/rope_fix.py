"""Small-head-size workaround: derive position_ids inside the graph so every engine has the same inputs.

onnxruntime's GroupQueryAttention with fused rotary (do_rotary=1) requires head_size % 16 == 0 on CPU
(stories260K has head_size 8). For such models we export with a separate RotaryEmbedding op and unpacked
q/k/v MatMuls (the builder's separate-rope path is wrong with packed QKV), which adds a `position_ids` input.
This module replaces that input with nodes computing exactly what fused GQA derives internally:
    first prompt (sequence_length == attention_mask width): position = s
    otherwise: position = (row sum of attention_mask) - sequence_length + s        (clamped at 0)
so runtimes keep feeding only input_ids, attention_mask and the KV (right-padded KV, positions from the mask).
"""

from __future__ import annotations

import json
from pathlib import Path

_P = "/model/derived_position_ids"


def needs_separate_rope(model_dir: Path, execution_provider: str) -> bool:
    """True when fused rotary in GQA cannot run: CPU and head_size not a multiple of 16."""
    config = json.loads((model_dir / "config.json").read_text())
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return execution_provider == "cpu" and int(head) % 16 != 0


def derive_position_ids(model_path: Path, genai_config_path: Path) -> None:
    """Rewrite model.onnx (weights file untouched) so position_ids is computed from attention_mask."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    inputs = [i for i in graph.input if i.name != "position_ids"]
    if len(inputs) == len(graph.input):
        return
    consts = [
        helper.make_tensor(f"{_P}/zero", TensorProto.INT64, [], [0]),
        helper.make_tensor(f"{_P}/one", TensorProto.INT64, [], [1]),
        helper.make_tensor(f"{_P}/axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor(f"{_P}/axis0", TensorProto.INT64, [1], [0]),
    ]
    n = helper.make_node
    nodes = [
        n(
            "ReduceSum",
            ["attention_mask", f"{_P}/axis1"],
            [f"{_P}/total"],
            keepdims=1,
            name=f"{_P}/ReduceSum",
        ),
        n("Shape", ["input_ids"], [f"{_P}/ids_shape"], name=f"{_P}/ShapeIds"),
        n("Gather", [f"{_P}/ids_shape", f"{_P}/one"], [f"{_P}/seq"], axis=0, name=f"{_P}/GatherSeq"),
        n("Shape", ["attention_mask"], [f"{_P}/mask_shape"], name=f"{_P}/ShapeMask"),
        n("Gather", [f"{_P}/mask_shape", f"{_P}/one"], [f"{_P}/width"], axis=0, name=f"{_P}/GatherWidth"),
        n("Range", [f"{_P}/zero", f"{_P}/seq", f"{_P}/one"], [f"{_P}/range"], name=f"{_P}/Range"),
        n("Unsqueeze", [f"{_P}/range", f"{_P}/axis0"], [f"{_P}/range2d"], name=f"{_P}/Unsqueeze"),
        n("Sub", [f"{_P}/total", f"{_P}/seq"], [f"{_P}/start"], name=f"{_P}/Sub"),
        n("Equal", [f"{_P}/width", f"{_P}/seq"], [f"{_P}/first"], name=f"{_P}/Equal"),
        n("Where", [f"{_P}/first", f"{_P}/zero", f"{_P}/start"], [f"{_P}/start2"], name=f"{_P}/Where"),
        n("Add", [f"{_P}/start2", f"{_P}/range2d"], [f"{_P}/pos"], name=f"{_P}/Add"),
        n("Max", [f"{_P}/pos", f"{_P}/zero"], ["position_ids"], name=f"{_P}/Max"),
    ]
    del graph.input[:]
    graph.input.extend(inputs)
    old_nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + old_nodes)
    graph.initializer.extend(consts)
    onnx.save(model, str(model_path))

    config = json.loads(genai_config_path.read_text())
    config["model"]["decoder"]["inputs"].pop("position_ids", None)
    genai_config_path.write_text(json.dumps(config, indent=4) + "\n")
