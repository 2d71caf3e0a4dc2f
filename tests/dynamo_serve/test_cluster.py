"""The launch layout: every address on the host given, file discovery, the core share, the commands."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmkiln.dynamo.cluster import ClusterSpec, available_cores, decode_first_choice
from llmkiln.dynamo.launcher import make_spec, status_ports
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.errors import BadInput
from llmkiln.host.kv_transfer_options import KvTransferOptions
from llmkiln.host.roles import WorkerRole

MAX_LOCAL_PREFILL_TOKENS = KvTransferOptions().max_local_prefill_tokens


def spec(status_ports: tuple[int, ...] | None = None, **kw) -> ClusterSpec:
    """A launch of DynamoOptions(**kw) (http_port 8000 unless given), a status port per worker."""
    kw.setdefault("http_port", 8000)
    options = DynamoOptions(**kw)
    ports = status_ports if status_ports is not None else tuple(range(20001, 20001 + options.num_workers))
    return ClusterSpec(engine=Path("/e"), state_dir=Path("/s"), options=options, status_ports=ports)


def test_every_process_gets_file_discovery_and_loopback_addresses():
    s = spec()
    s.check()
    env = s.worker_env(1)
    assert env["DYN_DISCOVERY_BACKEND"] == "file" and env["DYN_FILE_KV"] == "/s/discovery"
    for key in (
        "DYN_TCP_RPC_HOST",
        "DYN_TCP_RESPONSE_STREAM_HOST",
        "DYN_EVENT_PLANE_HOST",
        "DYN_SYSTEM_HOST",
    ):
        assert env[key] == "127.0.0.1"
    assert env["DYN_SYSTEM_PORT"] == "20002"
    fe = s.frontend_command()
    assert (
        fe[fe.index("--http-host") + 1] == "127.0.0.1" and fe[fe.index("--discovery-backend") + 1] == "file"
    )
    assert fe[fe.index("--router-mode") + 1] == "kv" and fe[fe.index("--migration-limit") + 1] == "3"
    assert "--no-router-track-active-blocks" in fe  # CPU workers: resident KV blocks are not load
    assert "--no-router-track-active-blocks" not in spec(router_mode="round-robin").frontend_command()
    assert spec(frontend_args=("--router-temperature", "0.5")).frontend_command()[-2:] == [
        "--router-temperature",
        "0.5",
    ]
    assert spec(host="::1").url.startswith("http://[::1]:")


def test_workers_share_the_cores():
    assert spec().threads == max(1, available_cores() // 2)
    assert spec(threads_per_worker=3).threads == 3
    cmd = spec(workers=1, overrides={"kv_cache": {"max_bytes": 1024}}).worker_commandline()
    assert cmd[cmd.index("--threads") + 1] == str(available_cores())
    assert cmd[cmd.index("--overrides") + 1] == '{"kv_cache": {"max_bytes": 1024}}'


def test_bad_settings_are_bad_input():
    with pytest.raises(BadInput, match="--workers"):
        DynamoOptions(workers=0)
    with pytest.raises(BadInput, match="--router-mode"):
        DynamoOptions(router_mode="fastest")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="--migration-limit"):
        DynamoOptions(migration_limit=-1)
    with pytest.raises(ValueError, match="status ports"):
        spec(status_ports=(20001,)).check()


def test_status_ports_fit_dynamo_i16():
    ports = status_ports(3)
    assert len(set(ports)) == 3 and all(20000 <= p < 32768 for p in ports)


def test_an_engine_without_config_json_is_refused(tmp_path, stories_engine):
    import shutil

    old = tmp_path / "old-engine"
    shutil.copytree(stories_engine, old)
    (old / "config.json").unlink()
    with pytest.raises(BadInput, match="rebuild it"):
        make_spec(old, DynamoOptions(), tmp_path / "state")


def pd_spec(**kw):
    """One prefill and one decode worker (ports below Dynamo's i16 limit), with `kw` on top."""
    return spec(prefill_workers=1, decode_workers=1, **kw)


def test_prefill_and_decode_workers_get_their_roles_and_core_shares():
    s = spec(prefill_workers=1, decode_workers=2)
    s.check()
    assert s.disaggregated and s.workers == 3 and s.threads == max(1, available_cores() // 3)
    assert [s.worker_role(i) for i in range(3)] == [WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.DECODE]
    roles = []
    for i in range(3):
        cmd = s.worker_commandline(i)
        roles.append(cmd[cmd.index("--role") + 1])
        assert cmd[cmd.index("--kv-export-timeout") + 1] == "30"
    assert roles == ["prefill", "decode", "decode"]
    for cmd in (s.worker_commandline(i) for i in range(3)):  # prefill: the threshold; decode: its run cap
        assert cmd[cmd.index("--max-local-prefill-tokens") + 1] == str(MAX_LOCAL_PREFILL_TOKENS)
    off = pd_spec(kv=KvTransferOptions(max_local_prefill_tokens=0)).worker_commandline(0)
    assert off[off.index("--max-local-prefill-tokens") + 1] == "0"
    with pytest.raises(BadInput, match="--max-local-prefill-tokens"):
        KvTransferOptions(max_local_prefill_tokens=-1)
    assert "--role" not in spec().worker_commandline(0)  # aggregated: the worker's default role
    tuned = spec(
        prefill_workers=1,
        decode_workers=1,
        overrides={"scheduler": {"max_batch_size": 4}},
        prefill_overrides={"scheduler": {"max_prefill_tokens": 128}},
    )
    assert tuned.worker_overrides(0) == {"scheduler": {"max_batch_size": 4, "max_prefill_tokens": 128}}
    assert tuned.worker_overrides(1) == {"scheduler": {"max_batch_size": 4}}
    profiled = spec(profile_dir=Path("/p"))
    assert profiled.worker_env(1)["LLMKILN_PROFILE"] == "/p/worker-1.jsonl"
    assert spec().worker_env(1).get("LLMKILN_PROFILE") != "/p/worker-1.jsonl"  # off unless asked for
    with pytest.raises(BadInput, match="go together"):
        DynamoOptions(prefill_workers=1)


def test_decode_first_gives_the_decode_tier_every_core_and_the_prefill_compute_idle_priority():
    s = spec(prefill_workers=1, decode_workers=2, decode_first=True)
    s.check()
    prefill, *decode = (s.worker_commandline(i) for i in range(3))
    assert prefill[prefill.index("--threads") + 1] == str(s.threads)
    assert prefill[prefill.index("--compute-priority") + 1] == "idle" and "--no-spin" not in prefill
    for cmd in decode:
        assert cmd[cmd.index("--threads") + 1] == str(available_cores())
        assert "--no-spin" in cmd and "--compute-priority" not in cmd
    plain = pd_spec(decode_first=False)
    assert all("--compute-priority" not in plain.worker_commandline(i) for i in range(2))
    with pytest.raises(BadInput, match="--decode-first: flag.s. of prefill/decode separation"):
        DynamoOptions(decode_first=True)
    with pytest.raises(BadInput, match="--threads-per-worker"):
        DynamoOptions(prefill_workers=1, decode_workers=1, decode_first=True, threads_per_worker=1)


def test_the_decode_tier_goes_first_by_default_where_each_worker_has_at_most_two_cores(monkeypatch):
    """The issue's 2-core launch (1 prefill + 1 decode worker) gets the decode tier first unless told otherwise;
    bigger core shares, --threads-per-worker and aggregated workers keep equal shares; the flags win."""
    pd = DynamoOptions(prefill_workers=1, decode_workers=1)
    assert decode_first_choice(pd, 2) == (True, decode_first_choice(pd, 2)[1])
    assert "2 core(s) for 2 workers" in decode_first_choice(pd, 2)[1]
    assert decode_first_choice(pd, 4)[0] and not decode_first_choice(pd, 6)[0]  # shares of 2 and 3 cores
    assert decode_first_choice(DynamoOptions(prefill_workers=2, decode_workers=2), 8)[0]
    assert decode_first_choice(DynamoOptions(prefill_workers=1, decode_workers=1, decode_first=False), 2) == (
        False,
        "--no-decode-first",
    )
    assert decode_first_choice(DynamoOptions(prefill_workers=1, decode_workers=1, decode_first=True), 64)[0]
    threads = DynamoOptions(prefill_workers=1, decode_workers=1, threads_per_worker=1)
    assert decode_first_choice(threads, 2) == (False, "--threads-per-worker sets every worker's threads")
    assert decode_first_choice(DynamoOptions(workers=2), 2) == (False, "aggregated workers")
    monkeypatch.setattr("sys.platform", "darwin")
    assert not decode_first_choice(pd, 2)[0]
    monkeypatch.undo()
    # the layout follows the choice: on 2 cores the default launch is --decode-first's
    monkeypatch.setattr("llmkiln.dynamo.cluster.available_cores", lambda: 2)
    auto = pd_spec()
    assert auto.decode_first and auto.worker_options(0).compute_priority == "idle"
    assert auto.worker_threads(1) == 2 and not auto.worker_options(1).spinning
    monkeypatch.setattr("llmkiln.dynamo.cluster.available_cores", lambda: 16)
    big = pd_spec()
    assert not big.decode_first and big.worker_options(0).compute_priority == "normal" and big.threads == 8
    with pytest.raises(BadInput, match="--decode-first: flag.s. of prefill/decode separation"):
        DynamoOptions(decode_first=False)


def test_worker_no_spin_and_compute_priority(stories_engine):
    """--no-spin becomes scheduler.intra_op_spinning false on an onnxruntime engine only (other backends refuse
    the field); --compute-priority reaches the engine host; bad values exit 2."""
    from llmkiln.capabilities import Backend
    from llmkiln.dynamo.worker import KilnWorker
    from llmkiln.dynamo.worker_options import WorkerOptions

    args = WorkerOptions.from_argv(
        ["--engine", str(stories_engine), "--no-spin", "--compute-priority", "idle"]
    )
    assert args.compute_priority == "idle" and not args.spinning
    assert KilnWorker(args).engine_overrides() == {"scheduler": {"intra_op_spinning": False}}
    assert args.engine_overrides(Backend.OPENVINO_CPU) == {}
    assert WorkerOptions.from_argv(["--engine", str(stories_engine)]).engine_overrides(Backend.ONNX_CPU) == {}
    with pytest.raises(SystemExit):
        WorkerOptions.from_argv(["--engine", str(stories_engine), "--compute-priority", "high"])


def test_make_spec_counts_prefill_and_decode_workers(tmp_path, engine_factory):
    engine = engine_factory("stories-fp32")
    s = make_spec(engine, DynamoOptions(prefill_workers=1, decode_workers=1, http_port=0), tmp_path)
    assert (s.workers, len(s.status_ports), s.worker_role(0), s.worker_role(1)) == (2, 2, "prefill", "decode")
    s.check()
    # the prefill stand-in: a port of its own, the first prefill worker's arguments, its own trigger per generation
    assert s.standin_status_port and s.standin_status_port not in s.status_ports
    assert s.standin_commandline()[1:3] == ["-m", "llmkiln.dynamo.prefill_standin"]
    assert s.standin_commandline()[3:] == s.worker_args(0)
    env = s.standin_env(2)
    assert env["DYN_SYSTEM_PORT"] == str(s.standin_status_port)
    assert env["LLMKILN_STANDIN_TRIGGER"] == str(s.standin_trigger(2)) != str(s.standin_trigger(1))
    assert env["LLMKILN_INSTANCE_FILE"] == str(s.standin_instance_file())
    agg = make_spec(engine, DynamoOptions(workers=2, http_port=0), tmp_path)
    assert agg.standin_status_port == 0 and len(agg.status_ports) == 2  # aggregated: no stand-in
    with pytest.raises(BadInput, match="prefix_reuse"):
        make_spec(
            engine,
            DynamoOptions(
                prefill_workers=1,
                decode_workers=1,
                http_port=0,
                overrides={"kv_cache": {"prefix_reuse": False}},
            ),
            tmp_path,
        )
    with pytest.raises(
        BadInput, match="max_prefill_tokens"
    ):  # a bad prefill-only field: exit 2, before any start
        make_spec(
            engine,
            DynamoOptions(
                prefill_workers=1,
                decode_workers=1,
                http_port=0,
                prefill_overrides={"scheduler": {"max_prefill_tokens": "many"}},
            ),
            tmp_path,
        )
    with pytest.raises(BadInput, match="--prefill-set"):  # refused by the options, before the engine is read
        DynamoOptions(http_port=0, prefill_overrides={"scheduler": {"max_prefill_tokens": 128}})
    pd = {"prefill_workers": 1, "decode_workers": 1, "http_port": 0}
    with pytest.raises(BadInput, match="override of 'model': fixed when the engine was built"):
        make_spec(engine, DynamoOptions(**pd, prefill_overrides={"model": {"path": "/etc"}}), tmp_path)
    with pytest.raises(BadInput, match="tokens_per_block 32 differs from the decode tier's 16"):
        make_spec(
            engine, DynamoOptions(**pd, prefill_overrides={"kv_cache": {"tokens_per_block": 32}}), tmp_path
        )
    with pytest.raises(BadInput, match="kv_cache.dtype 'fp16' differs"):
        make_spec(engine, DynamoOptions(**pd, prefill_overrides={"kv_cache": {"dtype": "fp16"}}), tmp_path)
    both = {"kv_cache": {"tokens_per_block": 32}}  # the same layout on both tiers: fine
    make_spec(engine, DynamoOptions(**pd, overrides=both, prefill_overrides=both), tmp_path)


def test_a_decode_worker_caps_its_prefill_runs_to_the_local_limit(stories_engine):
    """Short prompts handed to the decode worker arrive together: its TTFT-first scheduler would batch them into
    one run of up to the recipe's chunk; with local prefills on, a decode worker caps its runs to the limit while
    sequences decode (unless the overrides set the chunk); the prefill tier and an aggregated worker keep the
    recipe's chunk."""
    from llmkiln.dynamo.worker import KilnWorker
    from llmkiln.dynamo.worker_options import WorkerOptions

    def overrides(*argv: str) -> dict:
        return KilnWorker(
            WorkerOptions.from_argv(["--engine", str(stories_engine), *argv])
        ).engine_overrides()

    assert overrides("--role", "decode") == {
        "scheduler": {"max_prefill_tokens_decoding": MAX_LOCAL_PREFILL_TOKENS}
    }
    assert overrides("--role", "decode", "--max-local-prefill-tokens", "64") == {
        "scheduler": {"max_prefill_tokens_decoding": 64}
    }
    assert overrides("--role", "decode", "--max-local-prefill-tokens", "0") == {}
    mine = '{"scheduler": {"max_prefill_tokens": 256}}'
    assert overrides("--role", "decode", "--overrides", mine) == {"scheduler": {"max_prefill_tokens": 256}}
    assert overrides("--role", "prefill") == {} and overrides() == {}
    with pytest.raises(SystemExit):
        WorkerOptions.from_argv(["--engine", str(stories_engine), "--max-local-prefill-tokens", "-1"])
