"""Write a QualityResult as quality_report.json, quality_report.md and kl_by_position.png (matplotlib, Agg)."""

from __future__ import annotations

import json
from pathlib import Path

from llmkiln.atomic import atomic_file, write_bytes_atomic
from llmkiln.calibration.quality_diff import QualityResult

JSON_NAME = "quality_report.json"
MD_NAME = "quality_report.md"
PNG_NAME = "kl_by_position.png"


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e-3 and v != 0 else f"{v:.4f}"


def markdown(res: QualityResult) -> str:
    s = res.summary
    verdict = "PASS (within budget)" if res.passed else "FAIL (outside budget)"
    lines = [
        "# Quality diff",
        "",
        f"- candidate: `{res.candidate}` ({res.candidate_kind})",
        f"- reference: `{res.reference}` ({res.reference_kind})",
        f"- dataset: `{res.dataset}` — {s['examples']} texts, {s['tokens']} scored positions",
        f"- verdict: **{verdict}**",
        "",
        "| metric | value | budget |",
        "|---|---|---|",
        f"| mean KL(ref‖cand) per token | {_fmt(s['mean_kl'])} | "
        f"{'≤ ' + str(res.budget.max_mean_kl) if res.budget.max_mean_kl is not None else '—'} |",
        f"| max KL per token | {_fmt(s['max_kl'])} | — |",
        f"| top-1 agreement | {s['top1_agreement']:.4f} | "
        f"{'≥ ' + str(res.budget.min_top1_agreement) if res.budget.min_top1_agreement is not None else '—'} |",
        f"| perplexity ref / cand | {s['ref_ppl']:.4f} / {s['cand_ppl']:.4f} | — |",
        f"| perplexity delta | {s['ppl_delta_pct']:+.3f}% | "
        f"{'≤ ' + str(res.budget.max_ppl_delta_pct) + '%' if res.budget.max_ppl_delta_pct is not None else '—'} |",
        f"| greedy exact match ({s['continuation_tokens']} tokens) | {s['greedy_exact_match']:.3f} | — |",
        f"| mean first-divergence position | {s['mean_first_divergence']:.2f} | — |",
        "",
    ]
    if res.violations:
        lines += ["## Budget violations", "", *[f"- {v}" for v in res.violations], ""]
    lines += [
        "## Worst examples (by mean KL)",
        "",
        "| id | tokens | mean KL | max KL @pos | top-1 | first divergence | text up to the peak | next: ref / cand |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in res.worst:
        ctx = e.context.replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {e.id} | {e.tokens} | {_fmt(e.mean_kl)} | {_fmt(e.max_kl)} @{e.max_kl_position} | "
            f"{e.top1_agreement:.3f} | {e.first_divergence} | …{ctx} | "
            f"`{e.ref_top_at_peak.strip() or repr(e.ref_top_at_peak)}` / "
            f"`{e.cand_top_at_peak.strip() or repr(e.cand_top_at_peak)}` |"
        )
    lines += ["", f"![KL by position]({PNG_NAME})", ""]
    return "\n".join(lines)


def plot(res: QualityResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    pos = range(len(res.kl_by_position_mean))
    floor = 1e-12
    ax.plot(pos, [max(v, floor) for v in res.kl_by_position_mean], label="mean over texts")
    ax.plot(pos, [max(v, floor) for v in res.kl_by_position_max], label="max over texts", alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("token position")
    ax.set_ylabel("KL(ref‖cand), nats")
    ax.set_title(f"{Path(res.candidate).name} vs {Path(res.reference).name}")
    ax.legend()
    fig.tight_layout()
    with atomic_file(path, mode=0o644, suffix=".png") as tmp:
        fig.savefig(tmp)
        plt.close(fig)


def write_report(res: QualityResult, out_dir: str | Path) -> dict[str, Path]:
    """Write the three report files into out_dir; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / JSON_NAME, "markdown": out / MD_NAME, "png": out / PNG_NAME}
    write_bytes_atomic(paths["json"], (json.dumps(res.to_json(), indent=1) + "\n").encode(), mode=0o644)
    write_bytes_atomic(paths["markdown"], markdown(res).encode(), mode=0o644)
    plot(res, paths["png"])
    return paths
