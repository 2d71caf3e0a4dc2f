"""Serve-room fixtures: a minimal engine folder for repository tests, repositories that run the stand-in engine."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from llmkiln.engine_dir import EngineDir
from llmkiln.recipe import Warmup, load_recipe
from llmkiln.serve.repository import VERSION, RepoSpec, write_repository
from llmkiln.serve.server import ServerConfig, TritonServer, free_ports

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
FAKE_MODEL = Path(__file__).with_name("fake_model.py")


def make_recipe_engine_dir(folder: Path) -> Path:
    """A folder that looks like an engine to the repository code (recipe.resolved.yaml only)."""
    recipe, _ = load_recipe("stories-fp32")
    folder.mkdir(parents=True)
    EngineDir(folder).write_recipe(recipe)
    return folder


@pytest.fixture
def recipe_engine_dir(tmp_path: Path) -> Path:
    return make_recipe_engine_dir(tmp_path / "engine")


def fake_repository(
    tmp: Path,
    name: str = "fake",
    warmup: Warmup | None = None,
    model_py: str | None = None,
    drain_file: Path | None = None,
) -> Path:
    """tmp/repo with one model `name` whose model.py runs the stand-in engine (or the given model.py text)."""
    spec = RepoSpec(
        name, make_recipe_engine_dir(tmp / "engine"), warmup=warmup or Warmup(), drain_file=drain_file
    )
    write_repository(spec, tmp / "repo")
    version = tmp / "repo" / name / VERSION
    if model_py is not None:
        (version / "model.py").write_text(model_py)
    else:
        shutil.copyfile(FAKE_MODEL, version / "model.py")
        shutil.copyfile(FAKE_ENGINE, version / "fake_engine.py")
    return tmp / "repo"


def engine_server(spec: RepoSpec, tmp: Path, **config: Any) -> TritonServer:
    """A tritonserver (not started) on `spec`'s repository, written to tmp/repo, with free ports and tmp/work as
    its workdir; `config`: other ServerConfig fields (exit_timeout_s, http_front, drain_file, ...). The model name
    is `server.model`."""
    write_repository(spec, tmp / "repo")
    http, grpc, metrics = free_ports(3)
    fields = {"exit_timeout_s": 20, "workdir": tmp / "work", **config}
    server = TritonServer(
        ServerConfig(tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics, **fields)
    )
    server.model = spec.model_name  # type: ignore[attr-defined]  # the tests read the model name off the server
    return server
