"""`python fc_fuse_micro.py HIDDEN KV_OUT INTERMEDIATE LAYERS` (runs.txt). Separate q/k/v (and gate/up) MatMuls vs one fused MatMul + VariadicSplit: OpenVINO CPU, bf16, 2 threads."""

import statistics
import sys
import time

import numpy as np
import openvino as ov
import openvino.opset13 as ops

H, KV, INTER, L = [int(x) for x in sys.argv[1:5]]  # hidden, kv out, intermediate, layers
rng = np.random.default_rng(0)


def w(n, k):
    return ops.constant(rng.standard_normal((n, k)).astype(np.float32) * 0.02)


def build(fused):
    x = ops.parameter([-1, H], np.float32, name="x")
    h = x
    for _ in range(L):
        if fused:
            wq = np.concatenate([rng.standard_normal((n, H)).astype(np.float32) * 0.02 for n in (H, KV, KV)])
            qkv = ops.matmul(h, ops.constant(wq), False, True)
            q, k, v = ops.variadic_split(qkv, -1, [H, KV, KV]).outputs()
        else:
            q = ops.matmul(h, w(H, H), False, True)
            k = ops.matmul(h, w(KV, H), False, True)
            v = ops.matmul(h, w(KV, H), False, True)
        # stand-in for attention: k and v consumed (q's first H - 2 KV columns fill the width), then o_proj
        a = ops.add(q, ops.concat([k, v, ops.slice(q, [0], [H - 2 * KV], [1], [1])], -1))
        a = ops.matmul(a, w(H, H), False, True)
        if fused:
            wgu = np.concatenate(
                [rng.standard_normal((INTER, H)).astype(np.float32) * 0.02 for _ in range(2)]
            )
            gu = ops.matmul(a, ops.constant(wgu), False, True)
            g, u = ops.variadic_split(gu, -1, [INTER, INTER]).outputs()
        else:
            g = ops.matmul(a, w(INTER, H), False, True)
            u = ops.matmul(a, w(INTER, H), False, True)
        m = ops.multiply(ops.swish(g), u)
        h = ops.add(h, ops.matmul(m, w(H, INTER), False, True))
    return ov.Model([h], [x])


core = ov.Core()
res = {}
cms = {f: core.compile_model(build(f), "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}) for f in (False, True)}
reqs = {f: cm.create_infer_request() for f, cm in cms.items()}
for M in (8, 107):
    xs = np.random.default_rng(1).standard_normal((M, H)).astype(np.float32)
    for f in (False, True):
        for _ in range(5):
            reqs[f].infer({"x": xs})
    t = {False: [], True: []}
    for _ in range(30):
        for f in (False, True):
            s = time.perf_counter()
            reqs[f].infer({"x": xs})
            t[f].append((time.perf_counter() - s) * 1e3)
    a, b = statistics.median(t[False]), statistics.median(t[True])
    print(
        f"H={H} KV={KV} I={INTER} L={L} M={M}: separate {a:.3f} ms  fused {b:.3f} ms  saved {a - b:.3f} ms ({(a - b) / a * 100:.1f}%), {(a - b) / L * 1000:.1f} us/layer"
    )
