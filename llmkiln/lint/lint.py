"""`lint_prompts`: the achievable prefix-cache hit rate of a request file on an engine, and what breaks it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from llmkiln.engine_dir import EngineDir
from llmkiln.lint import causes
from llmkiln.lint.causes import Proposal
from llmkiln.lint.clusters import cluster_by_prefix
from llmkiln.lint.encoder import PromptEncoder
from llmkiln.lint.findings import ClusterInfo, Finding, HitRates, LintReport
from llmkiln.lint.prefix_sim import HitResult
from llmkiln.lint.requests import PromptRequest, read_requests, write_requests
from llmkiln.lint.scorer import Scorer, rates
from llmkiln.lint.view import build_view

MAX_CLUSTERS = 5
MAX_LINES = 50


def _zero(result: HitResult) -> HitRates:
    """What the runtime reaches with prefix_reuse off: nothing."""
    return HitRates(
        token_hit_rate=0.0,
        request_hit_rate=0.0,
        hit_tokens=0,
        prompt_tokens=result.looked_up_tokens,
        tokens_per_block=result.tokens_per_block,
    )


def _finding(p: Proposal, requests: Sequence[PromptRequest], after: HitResult, in_output: bool) -> Finding:
    return Finding(
        cause=p.cause,
        severity="warning" if p.severity == "warning" else "breaks-sharing",
        title=p.title,
        detail=p.detail,
        requests=[requests[i].lineno for i in p.indices],
        examples=p.examples,
        fix=p.fix,
        recipe_field=p.recipe_field,
        in_fix_output=in_output,
        after=rates(after),
    )


def lint_prompts(
    path: Path, engine: EngineDir, fix_out: Path | None = None
) -> tuple[LintReport, list[PromptRequest]]:
    """The report (and the fixed requests, written to `fix_out` when given)."""
    started = time.perf_counter()
    requests = read_requests(path)
    encoder = PromptEncoder.from_engine(engine)
    recipe = engine.recipe()
    bs = recipe.kv_cache.tokens_per_block
    scorer = Scorer(encoder, bs, recipe.limits.max_input_len)
    ids = scorer.ids(requests)
    base = scorer.score(requests)

    findings: list[Finding] = []
    if not recipe.kv_cache.prefix_reuse:
        findings.append(
            Finding(
                cause="prefix-reuse-off",
                severity="breaks-sharing",
                title="the engine's recipe turns the prefix cache off (kv_cache.prefix_reuse: false)",
                detail="no prompt block is ever reused, whatever the prompts",
                requests=[],
                fix="set kv_cache.prefix_reuse: true",
                recipe_field="kv_cache.prefix_reuse",
                in_fix_output=False,
                after=rates(base),
            )
        )
    if base.num_rejected:
        too_long = [i for i, c in enumerate(base.cached) if c is None]
        findings.append(
            Finding(
                cause="too-long",
                severity="warning",
                title=f"{len(too_long)} prompt(s) exceed limits.max_input_len ({recipe.limits.max_input_len} "
                "tokens): the server rejects them",
                detail=f"longest prompt: {max(base.prompt_tokens)} tokens",
                requests=[requests[i].lineno for i in too_long],
                fix="raise limits.max_input_len (and limits.max_seq_len) or shorten these prompts",
                recipe_field="limits.max_input_len",
                in_fix_output=False,
                after=rates(scorer.score(requests, unlimited=True)),
            )
        )

    # Request-side fixes in turn, each found on the output of the ones before and kept when it raises the
    # hit rate: a finding's `after` is the rate with it and the findings listed before it.
    current, best = list(requests), base
    views, viewed = build_view(current, encoder.bos_text), current
    for step in ("dynamic", "whitespace", "bos", "join"):
        if viewed is not current:  # the step before changed the requests
            views, viewed = build_view(current, encoder.bos_text), current
        texts = [scorer.text(r) for r in current]
        found: list[Proposal | None]
        if step == "dynamic":
            found = [causes.dynamic_content(current, views)]
        elif step == "whitespace":
            found = [causes.whitespace_variants(current, views, encoder.bos_text)]
        elif step == "bos":
            found = [x for x in causes.bos_causes(current, texts, scorer.ids(current), encoder) if x.fixed]
        else:
            found = [causes.join_tokenization(current, views, texts, scorer.ids(current), encoder)]
        for p in found:
            if p is None or p.fixed is None:
                continue
            after = scorer.score(p.fixed)
            if p.severity == "warning" or after.hit_tokens > best.hit_tokens:
                findings.append(_finding(p, requests, after, in_output=True))
                current, best = p.fixed, after
    after_requests = best

    # Recipe-side fixes, on top of the request fixes.
    recipe_changes: dict[str, str] = {}
    new_bs: int | None = None
    short = causes.short_shared_part(scorer.ids(current), bs)
    if short is not None and short.tokens_per_block is not None:
        after = scorer.score(current, tokens_per_block=short.tokens_per_block)
        if after.token_hit_rate > best.token_hit_rate:
            new_bs = short.tokens_per_block
            findings.append(_finding(short, requests, after, in_output=False))
            recipe_changes["kv_cache.tokens_per_block"] = str(new_bs)
    if not recipe.kv_cache.prefix_reuse:
        recipe_changes["kv_cache.prefix_reuse"] = "true"
    after_all = scorer.score(current, tokens_per_block=new_bs)
    fixed = current

    if fix_out is not None:
        write_requests(fix_out, fixed)
    clusters = cluster_by_prefix(ids, max(2, min(8, bs // 2)))
    report = LintReport(
        file=str(path),
        engine=str(engine.path),
        num_requests=len(requests),
        num_chat=sum(1 for r in requests if r.is_chat),
        tokens_per_block=bs,
        prefix_reuse=recipe.kv_cache.prefix_reuse,
        baseline=rates(base) if recipe.kv_cache.prefix_reuse else _zero(base),
        clusters=[
            ClusterInfo(
                size=len(c.members),
                common_tokens=c.common_tokens,
                reusable_tokens=c.reusable_tokens(bs),
                median_best_tokens=c.median_best_tokens,
                first_lines=[requests[i].lineno for i in c.members[:MAX_LINES]],
            )
            for c in clusters[:MAX_CLUSTERS]
        ],
        findings=findings,
        after_request_fixes=rates(after_requests) if recipe.kv_cache.prefix_reuse else _zero(after_requests),
        after_all_fixes=rates(after_all),
        recipe_changes=recipe_changes,
        fixed_file=str(fix_out) if fix_out is not None else None,
        seconds=round(time.perf_counter() - started, 3),
    )
    return report, fixed
