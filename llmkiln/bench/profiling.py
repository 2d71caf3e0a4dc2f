"""`kiln profile`: serve an engine with the runtime's step profile on, drive it with a workload, aggregate.

The server runs with $LLMKILN_PROFILE pointing at a file in a temp folder (or `keep`); after the run the server
is stopped (the engine writes its last records on shutdown) and each concurrency level's steps and requests
are aggregated (llmkiln.bench.profile) into the report's `profile` field.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmkiln.bench.profile import profile_levels
from llmkiln.bench.report import BenchReport
from llmkiln.bench.runner import BenchConfig, run_bench
from llmkiln.bench.serving import serve_engine
from llmkiln.bench.stats import RequestRecord
from llmkiln.bench.workloads import Workload
from llmkiln.runtime.profile import PROFILE_ENV


def run_profile(
    engine_dir: Path,
    workload: Workload,
    levels: Sequence[int],
    requests_per_level: int,
    warmup_requests: int,
    overrides: dict[str, Any] | None = None,
    label: str = "llmkiln",
    keep: Path | None = None,
    progress: bool = True,
    timeout_s: float = 900.0,
) -> tuple[BenchReport, dict[int, list[RequestRecord]]]:
    """Benchmark `engine_dir` served by tritonserver with the step profile on; the report carries the
    per-level profiles. `keep`: copy the raw profile file there."""
    with tempfile.TemporaryDirectory(prefix="llmkiln-profile-") as tmp:
        path = Path(tmp) / "profile.jsonl"
        with serve_engine(engine_dir, overrides=overrides, env={PROFILE_ENV: str(path)}) as served:
            cfg = BenchConfig(
                url=served.url,
                model=served.model,
                workload=workload,
                concurrency=levels,
                requests_per_level=requests_per_level,
                warmup_requests=warmup_requests,
                label=label,
                timeout_s=timeout_s,
                progress=progress,
                extra={
                    "engine_dir": str(engine_dir),
                    "overrides": overrides or {},
                    "server_ready_s": served.ready_s,
                },
            )
            report, records = run_bench(cfg)
        report.profile = profile_levels(records, path)
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, keep)
    return report, records
