"""One launch model (llmkiln.dynamo.options, llmkiln.dynamo.worker_options): every refused combination is refused
in one place, with the same message from `kiln serve --dynamo` and `kiln deploy dynamo`; a worker's command line
is written from its WorkerOptions and parsed back into the same object. No process is started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmkiln.cli.main import main
from llmkiln.dynamo.cluster import ClusterSpec
from llmkiln.dynamo.deploy import DeployOptions
from llmkiln.dynamo.options import DynamoOptions, LaunchOptions
from llmkiln.dynamo.worker_options import WorkerOptions
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole

PD = ["--prefill-workers", "1", "--decode-workers", "1"]
TIERS_ONLY = (
    "flag(s) of prefill/decode separation: add --prefill-workers P --decode-workers D, or remove them"
)

# (flags on both commands, the whole message)
SHARED_REFUSALS = [
    (["--max-local-prefill-tokens", "64"], f"--max-local-prefill-tokens: {TIERS_ONLY}"),
    (
        ["--max-local-prefill-tokens", "128"],
        f"--max-local-prefill-tokens: {TIERS_ONLY}",
    ),  # the default, typed
    (["--kv-export-timeout", "5"], f"--kv-export-timeout: {TIERS_ONLY}"),
    (
        ["--kv-export-timeout", "5", "--max-local-prefill-tokens", "0"],
        f"--kv-export-timeout, --max-local-prefill-tokens: {TIERS_ONLY}",
    ),
    (["--prefill-workers", "1"], "--prefill-workers and --decode-workers go together (at least 1 each)"),
    (["--decode-workers", "2"], "--prefill-workers and --decode-workers go together (at least 1 each)"),
    (
        ["--workers", "3", *PD],
        "--workers is the aggregated mode: give --prefill-workers and --decode-workers instead",
    ),
    (
        ["--workers", "2", *PD],  # the default value, typed
        "--workers is the aggregated mode: give --prefill-workers and --decode-workers instead",
    ),
    (["--workers", "0"], "--workers must be at least 1, got 0"),
    (["--migration-limit", "-1"], "--migration-limit must be >= 0, got -1"),
    ([*PD, "--max-local-prefill-tokens", "-1"], "--max-local-prefill-tokens must be >= 0 (0: off), got -1"),
    (
        [*PD, "--kv-export-timeout", "0"],
        "--kv-export-timeout must be > 0 (seconds a prompt's exported KV stays pinned for a decode worker), got 0",
    ),
]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run kiln in-process: it must exit 2; the message it printed."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("error: ")


@pytest.mark.parametrize(("flags", "message"), SHARED_REFUSALS, ids=[" ".join(f) for f, _ in SHARED_REFUSALS])
def test_serve_and_deploy_refuse_the_same_combinations_with_the_same_message(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    served = _error(capsys, ["serve", str(tmp_path / "no-engine"), "--dynamo", *flags])
    deployed = _error(capsys, ["deploy", "dynamo", "stories-fp32", "-o", str(tmp_path / "out"), *flags])
    assert served == deployed == message
    assert not (tmp_path / "out").exists()  # refused before anything is read or written


def test_the_options_made_in_code_are_refused_alike():
    """Options made in code count a field as given when it differs from its default."""
    for cls in (DynamoOptions, DeployOptions):
        with pytest.raises(BadInput, match=r"^--max-local-prefill-tokens: flag\(s\) of prefill/decode"):
            cls(kv=KvTransferOptions(max_local_prefill_tokens=64))
        with pytest.raises(BadInput, match="--workers is the aggregated mode"):
            cls(workers=3, prefill_workers=1, decode_workers=1)
        with pytest.raises(BadInput, match="--router-mode 'fastest': choose one of kv, round-robin, random"):
            cls(router_mode="fastest")  # type: ignore[arg-type]
        cls(prefill_workers=1, decode_workers=2, kv=KvTransferOptions(max_local_prefill_tokens=0))  # fine
    ok = DynamoOptions(prefill_workers=1, decode_workers=1)
    assert ok.num_workers == 2 and ok.disaggregated
    with pytest.raises(BadInput, match="--decode-workers"):  # dataclasses.replace checks again
        from dataclasses import replace

        replace(ok, decode_workers=0)


SERVE_ONLY_REFUSALS = [
    (["--prefill-set", "scheduler.max_prefill_tokens=64"], f"--prefill-set: {TIERS_ONLY}"),
    (["--decode-first"], f"--decode-first: {TIERS_ONLY}"),
    (
        [*PD, "--decode-first", "--threads-per-worker", "1"],
        "--decode-first sets each tier's threads: drop --threads-per-worker",
    ),
    (["--threads-per-worker", "-1"], "--threads-per-worker must be >= 0 (0: cores // workers), got -1"),
]


@pytest.mark.parametrize(
    ("flags", "message"), SERVE_ONLY_REFUSALS, ids=[" ".join(f) for f, _ in SERVE_ONLY_REFUSALS]
)
def test_serve_refuses_its_own_flags_where_they_do_not_apply(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert _error(capsys, ["serve", str(tmp_path / "no-engine"), "--dynamo", *flags]) == message


def test_deploy_refuses_its_own_flags_where_they_do_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    out = str(tmp_path / "out")
    assert _error(capsys, ["deploy", "dynamo", "stories-fp32", "-o", out, "--threads-per-worker", "0"]) == (
        "--threads-per-worker must be >= 1 (each worker pod's CPUs), got 0"
    )
    # dynamo.trtllm moves its KV itself: llmkiln's KV transfer flags do not apply
    message = _error(
        capsys, ["deploy", "dynamo", "tiny-trtllm-llmapi", "-o", out, *PD, "--max-local-prefill-tokens", "64"]
    )
    assert message.startswith("--max-local-prefill-tokens: flag(s) of llmkiln's CPU workers")
    # serve's own flags are not deploy's
    with pytest.raises(SystemExit) as done:
        main(["deploy", "dynamo", "stories-fp32", "-o", out, *PD, "--decode-first"])
    assert done.value.code == 2
    assert not (tmp_path / "out").exists()


def test_every_default_is_declared_once():
    """The CLI's defaults are the options' own (read from them, not repeated)."""
    import click

    from llmkiln.cli.deploy_cmd import dynamo as deploy_dynamo
    from llmkiln.cli.serve_cmd import serve

    kv, launch = KvTransferOptions(), LaunchOptions()
    expected = {
        "workers": launch.workers,
        "prefill_workers": launch.prefill_workers,
        "decode_workers": launch.decode_workers,
        "kv_export_timeout": kv.export_timeout_s,
        "max_local_prefill_tokens": kv.max_local_prefill_tokens,
        "router_mode": launch.router_mode,
        "migration_limit": launch.migration_limit,
    }
    for cmd in (serve, deploy_dynamo):
        params = {p.name: p for p in cmd.params if isinstance(p, click.Option)}
        assert {name: params[name].default for name in expected} == expected, cmd.name
    assert {p.name: p for p in deploy_dynamo.params}[
        "threads_per_worker"
    ].default == DeployOptions().threads_per_worker
    assert {p.name: p for p in serve.params}["grace_period"].default == DynamoOptions().grace_period_s


# -- the worker's command line, both ways -------------------------------------------------------------------------
WORKERS = [
    WorkerOptions(engine=Path("/e")),
    WorkerOptions(
        engine=Path("/e"), threads=2, overrides={"kv_cache": {"max_bytes": 1024}}, served_model_name="m"
    ),
    WorkerOptions(
        engine=Path("/engines/x"),
        served_model_name="llmkiln",
        namespace="ns",
        component="c",
        endpoint="ep",
        threads=3,
        overrides={"scheduler": {"max_prefill_tokens": 128, "ttft_first": True}},
        kv_events=False,
        warmup=False,
        drain_timeout_s=0.1 + 0.2,  # not what %g writes: written exactly
        role=WorkerRole.PREFILL,
        kv=KvTransferOptions(export_timeout_s=2.5, max_local_prefill_tokens=0),
        compute_priority="idle",
    ),
    WorkerOptions(engine=Path("/e"), role=WorkerRole.DECODE, spinning=False, drain_timeout_s=120.0),
]


@pytest.mark.parametrize("options", WORKERS, ids=range(len(WORKERS)))
def test_worker_argv_round_trip(options: WorkerOptions):
    argv = options.to_argv()
    assert all(isinstance(a, str) for a in argv)
    assert WorkerOptions.from_argv(argv) == options
    assert WorkerOptions.from_argv(WorkerOptions.from_argv(argv).to_argv()).to_argv() == argv


def test_a_worker_command_line_holds_only_what_differs_from_the_defaults():
    assert WorkerOptions(engine=Path("/e")).to_argv() == ["--engine", "/e"]
    decode = WorkerOptions(engine=Path("/e"), role=WorkerRole.DECODE).to_argv()
    assert decode == [
        "--engine",
        "/e",
        "--role",
        "decode",
        "--kv-export-timeout",
        "30",
        "--max-local-prefill-tokens",
        "128",
    ]
    assert WorkerOptions(engine=Path("/e"), role=WorkerRole.PREFILL).component_name == "prefill"
    assert WorkerOptions(engine=Path("/e"), role=WorkerRole.DECODE).component_name == "backend"


@pytest.mark.parametrize(
    "argv",
    [
        ["--role", "aggregated", "--kv-export-timeout", "5"],  # an aggregated host moves no KV
        ["--role", "encode"],
        ["--threads", "-1"],
        ["--overrides", "[1]"],
        ["--overrides", "{not json"],
        ["--drain-timeout", "-1"],
        ["--role", "prefill", "--kv-export-timeout", "0"],
    ],
)
def test_a_bad_worker_command_line_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as done:
        WorkerOptions.from_argv(["--engine", "/e", *argv])
    assert done.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_launcher_starts_each_worker_with_its_options():
    """A launch's worker command lines parse back into the WorkerOptions the layout derived (roles, threads,
    KV options, decode_first's priority and spinning)."""
    options = DynamoOptions(
        prefill_workers=1,
        decode_workers=2,
        http_port=8000,
        decode_first=True,
        kv=KvTransferOptions(export_timeout_s=3.0, max_local_prefill_tokens=64),
        prefill_overrides={"scheduler": {"max_prefill_tokens": 128}},
        drain_timeout_s=7.5,
    )
    spec = ClusterSpec(engine=Path("/e"), state_dir=Path("/s"), options=options, status_ports=(1, 2, 3))
    spec.check()
    parsed = [WorkerOptions.from_argv(spec.worker_args(i)) for i in range(3)]
    assert parsed == [spec.worker_options(i) for i in range(3)]
    assert [w.role for w in parsed] == [WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.DECODE]
    assert {w.kv for w in parsed} == {options.kv}
    assert [w.compute_priority for w in parsed] == ["idle", "normal", "normal"]
    assert [w.spinning for w in parsed] == [True, False, False]
    assert parsed[0].overrides == {"scheduler": {"max_prefill_tokens": 128}} and parsed[1].overrides == {}
    assert {w.drain_timeout_s for w in parsed} == {7.5}
