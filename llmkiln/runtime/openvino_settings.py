"""How the OpenVINO runner compiles its graph on this CPU: chosen from what the CPU has, recorded as in force.

OpenVINO's CPU plugin picks its own defaults by CPU, and they are not the engine's: on a CPU with AMX its
inference precision defaults to bf16 and its KV cache to u8 (seen on an Intel Xeon, openvino 2026.4.1), on an
AVX2-only one to f32. So the runner never leaves precision to it: the recipe's precision is the inference
precision and the KV pools' type (`properties`), and the thread count is the recipe's
`scheduler.intra_op_threads` (0: OpenVINO's, one per core it may use).

One choice avoids a crash: with AMX, bf16 and **one** thread, OpenVINO 2026.4.1's CPU plugin dies of SIGFPE
(an integer division by zero) inside `compile_model` — its fused LLM MLP kernel (the `MLPFusion` pass, registered
only for AMX with bf16 or f16, matching `down(swish(gate(x)) * up(x))`) splits its work by the thread count.
A worker given one core (`kiln serve --dynamo --workers 2` on 2 cores) hit it on every start. The fusion only
matches a one-input Swish (the form the PyTorch frontend emits), so the runner gives each Swish its explicit
beta of 1.0 (`unfuse_mlp`): the same function, the MLP then runs as plain bf16 FullyConnected layers (on 2
threads fused and unfused take the same time: a 64-token prefill of bench-ov-bf16 20.5 ms either way).
Reproducer outside llmkiln: experiments/openvino_mlp_sigfpe.py.

One choice is only advice: int8 weights (recipe `weights: int8`) pay on a CPU without AMX (AMD Zen 5: 1.07-1.12x
tok/s) and lose on one with AMX computing in bf16, whose bf16 products outrun the int8 weights' decompression
(Intel Xeon, SmolLM2: decode 1.2x, prefill 1.2-1.4x slower than bf16 weights; bench/results/openvino-int8-weights).
Such an engine still runs; `warnings` says so, the runner logs it and the report carries it (`weights_advice`).

`extra`: compile properties a caller adds on top of these choices (experiments and probes only: PERF_COUNT, a
dynamic-quantization group, a KV precision to try), named in `describe()` as `compile_extra`; a recipe never sets it.

`OpenVinoSettings.describe()` is what the engine reports (`LLMEngine.runtime_settings`, /metrics
`llmkiln_runtime_setting`): the choices made here and what the compiled model says is in force.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llmkiln.cpu_features import CpuFeatures

# the recipe's precision -> OpenVINO's element type name
ELEMENT_TYPES = {"fp32": "f32", "bf16": "bf16"}
# compiled-model properties worth reporting (the ones the CPU plugin chooses by CPU when not told)
REPORTED_PROPERTIES = (
    "INFERENCE_PRECISION_HINT",
    "KV_CACHE_PRECISION",
    "KEY_CACHE_PRECISION",
    "VALUE_CACHE_PRECISION",
    "INFERENCE_NUM_THREADS",
    "NUM_STREAMS",
    "PERFORMANCE_HINT",
    "ENABLE_CPU_PINNING",
    "ENABLE_HYPER_THREADING",
    "SCHEDULING_CORE_TYPE",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE",
    "RUNTIME_REQUIREMENTS",
)


@dataclass(frozen=True)
class OpenVinoSettings:
    precision: str  # the recipe's: fp32 | bf16
    threads: int  # INFERENCE_NUM_THREADS to set (0: leave it to OpenVINO)
    effective_threads: int  # the threads the plugin will use
    unfuse_mlp: bool  # give each Swish an explicit beta so the AMX MLP fusion does not match (see above)
    cpu: CpuFeatures
    weights: str = "checkpoint"  # what the IR holds: checkpoint (as exported) | int8 (recipe `weights: int8`)
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # a choice of the recipe that this CPU runs slower than another
    in_force: dict[str, str] = field(default_factory=dict)  # read back from the compiled model
    extra: dict[str, object] = field(default_factory=dict)  # a caller's compile properties, over the choices

    def properties(self) -> dict[str, object]:
        """compile_model's config: the choices, then `extra` over them."""
        t = ELEMENT_TYPES[self.precision]
        cfg: dict[str, object] = {"INFERENCE_PRECISION_HINT": t, "KV_CACHE_PRECISION": t}
        if self.threads:
            cfg["INFERENCE_NUM_THREADS"] = self.threads
        return {**cfg, **self.extra}

    def describe(self) -> dict[str, str]:
        """name -> value, everything in force (for the engine report and /metrics)."""
        out = self.cpu.settings()
        out["precision"] = self.precision
        out["weights"] = self.weights
        out["mlp_fusion"] = (
            "off (one thread with AMX bf16: OpenVINO 2026.4 SIGFPE)" if self.unfuse_mlp else "auto"
        )
        if self.warnings:
            out["weights_advice"] = "; ".join(self.warnings)
        if self.extra:
            out["compile_extra"] = ", ".join(f"{k}={v}" for k, v in sorted(self.extra.items()))
        out.update(self.in_force)
        return out


def choose(
    cpu: CpuFeatures,
    precision: str,
    threads: int,
    weights: str = "checkpoint",
    extra: Mapping[str, object] | None = None,
) -> OpenVinoSettings:
    """The settings for a `precision` engine on `cpu` with `threads` intra-op threads (0: one per usable core);
    `weights`: what its IR holds (the runner reads it off the graph: int8 when it has compressed weights);
    `extra`: compile properties put over the choices (probes only)."""
    if precision not in ELEMENT_TYPES:
        raise ValueError(f"precision {precision!r}: the OpenVINO runner runs {' or '.join(ELEMENT_TYPES)}")
    effective = threads or max(1, cpu.cores)
    reasons: list[str] = []
    unfuse = cpu.amx and precision == "bf16" and effective == 1
    if unfuse:
        reasons.append(
            "AMX + bf16 + one thread: OpenVINO's fused MLP kernel divides by zero at compile time (SIGFPE); "
            "the MLP runs unfused"
        )
    warnings: list[str] = []
    if weights == "int8" and cpu.amx and precision == "bf16":
        warnings.append(
            f"int8 weights run slower than bf16 weights on this CPU with AMX ({cpu.model}: decode 1.2x, prefill "
            "1.2-1.4x, measured on SmolLM2; they pay without AMX): build the recipe without `weights: int8` here"
        )
    return OpenVinoSettings(
        precision=precision,
        threads=threads,
        effective_threads=effective,
        unfuse_mlp=unfuse,
        cpu=cpu,
        weights=weights,
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        extra=dict(extra or {}),
    )
