"""Load-time graph rewrite: compute logits only at the positions the runtime samples from.

The builder's graph runs the LM head over every position; a prefill needs one row per sequence (and a chunk
that does not end its prompt needs none), so on a long prompt that head is a sizable share of prefill time. The
rewrite adds an input `logits_positions` (int64 [batch]) of flat indices b * sequence_length + position and
gathers those rows of the final hidden states before the LM head, so `logits` becomes [batch, 1, vocab].

The engine folder is left untouched: the rewritten graph is handed to onnxruntime as bytes, with the engine
folder named as the place of its external weights (session.model_external_initializers_file_folder_path).
"""

from __future__ import annotations

from pathlib import Path

POSITIONS_INPUT = "logits_positions"
_P = "/llmkiln/last_logits"
_HEAD_OPS = {"MatMul", "MatMulNBits"}


EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


def rewrite(model_path: Path, logits_name: str = "logits") -> bytes | None:
    """The rewritten graph, serialized (weights stay external); None when the graph's LM head is not a
    MatMul/MatMulNBits on [batch, sequence, hidden] (then the original graph is used)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    head = next((n for n in graph.node if logits_name in n.output), None)
    if head is None or head.op_type not in _HEAD_OPS:
        return None
    hidden = head.input[0]
    h = helper.make_node
    nodes = [
        h("Shape", [hidden], [f"{_P}/shape"], name=f"{_P}/Shape"),
        h("Slice", [f"{_P}/shape", f"{_P}/two", f"{_P}/three"], [f"{_P}/hidden_dim"], name=f"{_P}/Slice"),
        h(
            "Concat",
            [f"{_P}/minus_one", f"{_P}/hidden_dim"],
            [f"{_P}/flat_shape"],
            axis=0,
            name=f"{_P}/Concat",
        ),
        h("Reshape", [hidden, f"{_P}/flat_shape"], [f"{_P}/flat"], name=f"{_P}/Reshape"),
        h("Gather", [f"{_P}/flat", POSITIONS_INPUT], [f"{_P}/rows"], axis=0, name=f"{_P}/Gather"),
        h("Unsqueeze", [f"{_P}/rows", f"{_P}/one"], [f"{_P}/picked"], name=f"{_P}/Unsqueeze"),
    ]
    consts = [
        helper.make_tensor(f"{_P}/two", TensorProto.INT64, [1], [2]),
        helper.make_tensor(f"{_P}/three", TensorProto.INT64, [1], [3]),
        helper.make_tensor(f"{_P}/minus_one", TensorProto.INT64, [1], [-1]),
        helper.make_tensor(f"{_P}/one", TensorProto.INT64, [1], [1]),
    ]
    head.input[0] = f"{_P}/picked"
    index = list(graph.node).index(head)
    for offset, node in enumerate(nodes):
        graph.node.insert(index + offset, node)
    graph.initializer.extend(consts)
    graph.input.append(helper.make_tensor_value_info(POSITIONS_INPUT, TensorProto.INT64, ["batch_size"]))
    out = next(o for o in graph.output if o.name == logits_name)
    dims = out.type.tensor_type.shape.dim
    if len(dims) == 3:
        dims[1].ClearField("dim_param")
        dims[1].dim_value = 1
    return model.SerializeToString()
