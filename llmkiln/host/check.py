"""check_engine: the one way from what a user typed to an engine folder that may be served.

Resolve the folder, refuse TensorRT-LLM folders (their DEPLOY.md says where they run), verify every byte of every
file against the manifest (no fast path: engine_dir.EngineDir.verify). The launchers (`kiln serve`, `kiln
serve --dynamo`) call it before they start anything, so a bad engine is a clear error and exit 1; the engine
host in the serving process calls it again right before it loads the files (a file changed in between is
caught there). Light on purpose: no onnxruntime import (the launchers never load the model themselves).
"""

from __future__ import annotations

import os
from pathlib import Path

from llmkiln.engine_dir import EngineDir, resolve_engine


def check_engine(engine: str | os.PathLike[str] | EngineDir, engines_root: Path | None = None) -> EngineDir:
    """The engine folder to serve: resolved, one llmkiln's runtime runs, every file matching its manifest.

    BadInput (exit 2) for a missing folder or a TensorRT-LLM engine; IntegrityError (exit 1) for a file that
    does not match (nothing is loaded)."""
    folder = engine if isinstance(engine, EngineDir) else resolve_engine(engine, engines_root)
    folder.require().runtime_recipe()
    folder.verify()
    return folder
