"""The project's experiments: the measurements behind bench/results/, with their recipe choices and targets.

They drive the reusable bench tool of the package (llmkiln.bench: workloads, clients, runner, stats, reports,
compare, peers, the suffix-only floor) and are not part of it: this folder is not in the wheel. Run them from the
repository root, as the Makefile does:

    python -m experiments.ttft --out bench/results              # make bench-ttft
    python -m experiments.ttft --resummarize --out bench/results
    python -m experiments.scaleout --out bench/results/scaleout  # make bench-scaleout
    python -m experiments.scaleout --resummarize --out bench/results/scaleout
"""
