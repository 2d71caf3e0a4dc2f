"""The lint report: hit rates, clusters and findings (JSON with `--json`, a text report otherwise)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Cause = Literal[
    "prefix-reuse-off",
    "dynamic-content",
    "whitespace-variants",
    "bos-variants",
    "duplicated-bos",
    "join-tokenization",
    "short-shared-part",
    "too-long",
]

ASSUMPTIONS = (
    "requests served one after another in file order (each prefill done before the next lookup); "
    "an unbounded prefix store (no LRU eviction); whole blocks of kv_cache.tokens_per_block, chained keys and "
    "at most prompt_len - 1 tokens looked up, as the runtime's BlockStore does"
)


class HitRates(BaseModel):
    """Token and request hit rates of one request sequence (the runtime's two prefix-cache rates)."""

    model_config = ConfigDict(extra="forbid")

    token_hit_rate: float  # cached prompt tokens / prompt tokens (prefix_cache_token_hit_rate)
    request_hit_rate: float  # requests with >= 1 cached block / requests (prefix_cache_hit_rate)
    hit_tokens: int
    prompt_tokens: int
    tokens_per_block: int


class Finding(BaseModel):
    """One cause that breaks sharing: what, which requests, the fix and the hit rate after it."""

    model_config = ConfigDict(extra="forbid")

    cause: Cause
    severity: Literal["breaks-sharing", "warning"]
    title: str
    detail: str
    requests: list[int]  # line numbers in the file
    examples: list[str] = Field(default_factory=list)
    fix: str
    recipe_field: str | None = None  # the recipe field the fix changes (None: the requests change)
    in_fix_output: bool  # `--fix OUT` applies it
    after: HitRates  # hit rates with this fix alone


class ClusterInfo(BaseModel):
    """A family of requests sharing a token prefix."""

    model_config = ConfigDict(extra="forbid")

    size: int
    common_tokens: int
    reusable_tokens: int
    median_best_tokens: int
    first_lines: list[int]


class LintReport(BaseModel):
    """Everything `kiln lint-prompts` found."""

    model_config = ConfigDict(extra="forbid")

    file: str
    engine: str
    num_requests: int
    num_chat: int
    tokens_per_block: int
    prefix_reuse: bool
    assumptions: str = ASSUMPTIONS
    baseline: HitRates
    clusters: list[ClusterInfo]
    findings: list[Finding]
    after_request_fixes: HitRates  # every fix `--fix` writes, together
    after_all_fixes: HitRates  # plus the recipe changes
    recipe_changes: dict[str, str] = Field(default_factory=dict)  # field -> new value
    fixed_file: str | None = None
    seconds: float = 0.0
