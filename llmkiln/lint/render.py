"""The lint report as text for people (`--json` prints the LintReport itself)."""

from __future__ import annotations

from llmkiln.lint.findings import HitRates, LintReport

MAX_LINES_SHOWN = 12


def pct(rates: HitRates) -> str:
    return (
        f"{rates.token_hit_rate:.1%} of prompt tokens ({rates.hit_tokens}/{rates.prompt_tokens}), "
        f"{rates.request_hit_rate:.0%} of requests"
    )


def _lines(lines: list[int]) -> str:
    shown = ", ".join(str(n) for n in lines[:MAX_LINES_SHOWN])
    more = f" and {len(lines) - MAX_LINES_SHOWN} more" if len(lines) > MAX_LINES_SHOWN else ""
    return f"lines {shown}{more}" if lines else "all requests"


def render_report(report: LintReport, min_hit_rate: float | None = None) -> str:
    r = report
    out = [
        f"{r.file}: {r.num_requests} requests ({r.num_chat} chat) on {r.engine}",
        f"achievable prefix-cache hit rate: {pct(r.baseline)}   [blocks of {r.tokens_per_block} tokens]",
        f"  assumes {r.assumptions}",
    ]
    if r.clusters:
        out.append("clusters by longest common token prefix (largest first):")
        for c in r.clusters:
            out.append(
                f"  {c.size:5d} requests share {c.common_tokens} tokens ({c.reusable_tokens} reusable in whole "
                f"blocks); median shared with the closest other request: {c.median_best_tokens}"
            )
    if not r.findings:
        out.append("no causes found: the requests share what they can share")
    for k, f in enumerate(r.findings, 1):
        out += [
            "",
            f"{k}. [{f.cause}] {f.title}",
            f"   {f.detail}",
            f"   requests: {_lines(f.requests)}",
            *(f"   e.g. {e}" for e in f.examples),
            f"   fix: {f.fix}" + (f"   (recipe field: {f.recipe_field})" if f.recipe_field else ""),
            f"   hit rate after this fix{' and the ones above' if k > 1 else ''}: {pct(f.after)}",
        ]
    out += [
        "",
        f"after the request fixes (--fix): {pct(r.after_request_fixes)}",
        f"after the recipe changes too:    {pct(r.after_all_fixes)}"
        + (
            f"   ({', '.join(f'{k} = {v}' for k, v in r.recipe_changes.items())})" if r.recipe_changes else ""
        ),
    ]
    if r.fixed_file:
        out.append(f"fixed requests written to {r.fixed_file}")
    if min_hit_rate is not None:
        verdict = "below" if r.baseline.token_hit_rate < min_hit_rate else "meets"
        out.append(f"{verdict} --min-hit-rate {min_hit_rate:.1%}")
    out.append(f"({r.seconds:.2f} s)")
    return "\n".join(out)
