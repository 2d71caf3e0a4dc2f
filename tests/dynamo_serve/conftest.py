"""Fixtures for the Dynamo tests (folder not named `dynamo`: that would shadow the dynamo package on sys.path): real `dynamo.frontend` and llmkiln worker processes on 127.0.0.1, the real
openai client, the small trained stories260K engine (fast to load, real tokenizer and chat template).

`launch(...)` starts a launch (llmkiln.dynamo.launcher) in a temp state folder and stops it at teardown,
checking that nothing is left behind: no process of the launch, no discovery file. Tests share one launch per
module where they can (starting one costs a few seconds).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest

from llmkiln.dynamo.launcher import DynamoLauncher, make_spec
from llmkiln.dynamo.options import DynamoOptions
from llmkiln.serve.server import free_ports

FAULTY_WORKER = Path(__file__).with_name("faulty_worker.py")
MODEL = "llmkiln"


def launch_processes_alive(discovery_dir: Path) -> list[int]:
    """Pids of processes whose environment names this launch's discovery folder (ours, of any launch)."""
    needle = f"DYN_FILE_KV={discovery_dir}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def assert_nothing_left(launcher: DynamoLauncher) -> None:
    spec = launcher.spec
    assert [p.pid for p in launcher.procs if p.alive()] == []
    assert launch_processes_alive(spec.discovery_dir) == []
    assert not spec.discovery_dir.exists() or not any(spec.discovery_dir.rglob("*"))


def client(launcher: DynamoLauncher, timeout_s: float = 120.0) -> openai.OpenAI:
    """The real openai client on the launch's frontend; no retries (a test must see every failure)."""
    return openai.OpenAI(base_url=launcher.url, api_key="unused", max_retries=0, timeout=timeout_s)


@pytest.fixture(scope="session")
def stories_engine(engine_factory) -> Path:
    return engine_factory("stories-fp32")


Launch = Callable[..., DynamoLauncher]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    """launch(engine, workers=2, faulty=False, state_dir=None, step_delay_s=None, **DynamoOptions fields) -> a
    ready launcher. `faulty` runs tests/dynamo_serve/faulty_worker.py, whose steps each sleep `step_delay_s`."""
    started: list[DynamoLauncher] = []

    def start(
        engine: Path,
        workers: int = 2,
        faulty: bool = False,
        state_dir: Path | None = None,
        step_delay_s: float | None = None,
        **opts: Any,
    ) -> DynamoLauncher:
        state = state_dir or tmp_path_factory.mktemp("dynamo")
        options = DynamoOptions(
            workers=workers,
            http_port=free_ports(1)[0],
            grace_period_s=opts.pop("grace_period_s", 1.0),
            drain_timeout_s=opts.pop("drain_timeout_s", 30.0),
            **opts,
        )
        spec = make_spec(engine, options, state)
        if faulty:
            env = {"LLMKILN_TEST_FAULT_DIR": str(state)}
            if step_delay_s is not None:
                env["LLMKILN_TEST_STEP_DELAY_S"] = str(step_delay_s)
            spec = replace(
                spec,
                worker_command=(sys.executable, str(FAULTY_WORKER)),
                options=replace(spec.options, extra_env=env),
            )
        launcher = DynamoLauncher(spec)
        started.append(launcher)
        launcher.start()
        launcher.wait_ready(timeout_s=180)
        return launcher

    try:
        yield start
    finally:
        for launcher in started:
            launcher.stop()
    for launcher in started:  # after every stop: launches may share a state folder
        assert_nothing_left(launcher)
