"""The TTFT experiment's two recipes: same engine, different runtime settings only; its sizes."""

from __future__ import annotations

from experiments.ttft import ExperimentConfig
from llmkiln.recipe import load_recipe

RUNTIME_FIELDS = {
    ("kv_cache", "prefix_reuse"),
    ("scheduler", "chunked_prefill"),
    ("scheduler", "batching"),
    ("scheduler", "max_num_tokens"),
    ("scheduler", "ttft_first"),
    ("scheduler", "tpot_slo_ms"),
}


def _flat(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, (*prefix, k))
        else:
            yield (*prefix, k), v


def test_bench_recipes_differ_only_in_runtime_settings():
    a, _ = load_recipe("bench-baseline")
    b, _ = load_recipe("bench-optimized")
    fa = dict(_flat(a.model_dump(mode="json", exclude={"name", "description"})))
    fb = dict(_flat(b.model_dump(mode="json", exclude={"name", "description"})))
    differ = {k for k in fa if fa[k] != fb[k]}
    assert differ <= RUNTIME_FIELDS, differ - RUNTIME_FIELDS
    assert {("kv_cache", "prefix_reuse"), ("scheduler", "batching"), ("scheduler", "ttft_first")} <= differ
    assert (
        a.kv_cache.prefix_reuse is False
        and a.scheduler.chunked_prefill is False
        and a.scheduler.batching == "static"
    )
    assert (
        b.kv_cache.prefix_reuse is True
        and b.scheduler.chunked_prefill is True
        and b.scheduler.batching == "inflight"
        and b.scheduler.ttft_first is True
    )
    assert a.model.generated == "bench-llama-125m" and a.precision == "fp32" and a.limits.max_seq_len == 4096


def test_experiment_sizes():
    full = ExperimentConfig.make()
    assert full.levels == (1, 4, 8, 16) and full.system_tokens == 1500 and full.output_tokens == 32
    assert full.requests >= 32 and full.floor and full.tradeoff_levels == (4, 8, 16)
    assert None in full.tradeoff_slos and ExperimentConfig.make(tradeoff=False).tradeoff_slos == ()
    quick = ExperimentConfig.make(quick=True)
    assert quick.quick and str(quick.out_dir).startswith("bench/results/raw")
    spec, levels, per = full.spec("shared-prefix")
    assert spec.num_requests == full.warmup + sum(max(per, c) for c in levels)
    assert ExperimentConfig.make(requests=3, peers=False, only=("unique",)).workloads == ("unique",)
