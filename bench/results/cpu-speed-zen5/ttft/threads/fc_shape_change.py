"""A plain stack of SmolLM2-shaped projections and MLPs (30 layers, bf16, no attention): M=7 rows back to back
against M=7 after M=6 — OpenVINO's CPU plugin pays for a change of the token count per node, whatever the graph
(threads/runs.txt). `python fc_shape_change.py`."""

import statistics
import time

import numpy as np
import openvino as ov
import openvino.opset13 as ops

H, KV, INTER, L = 576, 192, 1536, 30
rng = np.random.default_rng(0)


def w(n, k):
    return ops.constant(rng.standard_normal((n, k)).astype(np.float32) * 0.02)


x = ops.parameter([-1, H], np.float32, name="x")
h = x
for _ in range(L):
    q = ops.matmul(h, w(H, H), False, True)
    k = ops.matmul(h, w(KV, H), False, True)
    v = ops.matmul(h, w(KV, H), False, True)
    a = ops.add(q, ops.concat([k, v, ops.slice(q, [0], [H - 2 * KV], [1], [1])], -1))
    a = ops.matmul(a, w(H, H), False, True)
    g = ops.matmul(a, w(INTER, H), False, True)
    u = ops.matmul(a, w(INTER, H), False, True)
    h = ops.add(h, ops.matmul(ops.multiply(ops.swish(g), u), w(H, INTER), False, True))
core = ov.Core()
cm = core.compile_model(ov.Model([h], [x]), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
req = cm.create_infer_request()
x7 = np.ones((7, H), np.float32)
x6 = np.ones((6, H), np.float32)


def run(xx):
    t = time.perf_counter()
    req.infer({"x": xx})
    return (time.perf_counter() - t) * 1e3


for _ in range(5):
    run(x7)
    run(x6)
for _r in range(3):
    same = [run(x7) for _ in range(20)]
    alt = []
    for _ in range(20):
        run(x6)
        alt.append(run(x7))
    print(
        f"FC graph ({len(cm.get_runtime_model().get_ops())} runtime ops): M=7 same {statistics.median(same):.2f} ms, after M=6 {statistics.median(alt):.2f} ms"
    )
