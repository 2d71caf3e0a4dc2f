"""OpenVINO CPU plugin: SIGFPE (integer division by zero) in compile_model, outside llmkiln.

A Llama MLP block, down(swish(gate(x)) * up(x)), with Swish as the PyTorch frontend emits it (one input, no
beta), compiled with INFERENCE_PRECISION_HINT=bf16 and INFERENCE_NUM_THREADS=1, on a CPU with AMX. The CPU
plugin's MLPFusion pass (registered only for AMX with bf16/f16) turns the block into its fused LLM MLP kernel,
which divides its work by the thread count at compile time and dies with one thread. An explicit beta input
(`--beta`, the same function) keeps the pass from matching; so does a second thread.

    python experiments/openvino_mlp_sigfpe.py --threads 1          # AMX: exit -8 (SIGFPE); else: ok
    python experiments/openvino_mlp_sigfpe.py --threads 1 --beta   # ok everywhere
    python experiments/openvino_mlp_sigfpe.py --threads 2          # ok everywhere

Seen with openvino 2026.4.1 on an Intel Xeon (family 6 model 207, AMX bf16/int8, 2 cores under KVM), for
hidden/intermediate 768/2048 (bench-ov-bf16's shape). llmkiln avoids it (llmkiln.runtime.openvino_settings).
"""

from __future__ import annotations

import argparse

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.utils.node_factory import NodeFactory


def build_model(hidden: int = 768, intermediate: int = 2048, beta: bool = False) -> ov.Model:
    rng = np.random.default_rng(0)

    def weight(rows: int, cols: int) -> ov.Node:
        return ops.constant((rng.standard_normal((rows, cols)) * 0.02).astype(np.float32))

    x = ops.parameter([-1, -1, hidden], ov.Type.f32, name="x")
    gate = ops.matmul(x, weight(intermediate, hidden), False, True)
    if beta:
        swish = ops.swish(gate, np.float32(1.0))
    else:  # one input, as the PyTorch frontend converts torch's silu
        swish = NodeFactory("opset4").create("Swish", [gate.output(0)], {})
    up = ops.matmul(x, weight(intermediate, hidden), False, True)
    y = ops.matmul(ops.multiply(swish, up), weight(hidden, intermediate), False, True)
    return ov.Model([y], [x], "llama-mlp")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--beta", action="store_true", help="give Swish an explicit beta of 1.0 (no fusion)")
    a = p.parse_args()
    model = build_model(a.hidden, a.intermediate, a.beta)
    print(f"openvino {ov.__version__}; threads {a.threads}; beta {a.beta}", flush=True)
    cfg = {"INFERENCE_PRECISION_HINT": ov.Type.bf16, "INFERENCE_NUM_THREADS": a.threads}
    compiled = ov.Core().compile_model(model, "CPU", cfg)
    out = compiled.create_infer_request().infer({"x": np.ones((1, 5, a.hidden), np.float32)})
    print("ok", next(iter(out.values())).shape)


if __name__ == "__main__":
    main()
