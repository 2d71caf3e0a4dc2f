"""The reaper's folders: removed when the launcher goes (closed stdin: a clean stop or a killed launcher), unless the
launcher withdrew one (a failed launch keeps its logs)."""

from __future__ import annotations

import os

from llmkiln.serve.reaper import Reaper


def test_a_tree_is_removed_unless_kept(tmp_path):
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    for d in (gone, kept):
        (d / "logs").mkdir(parents=True)
        (d / "logs" / "worker-0.log").write_text("x")
    reaper = Reaper("test")
    reaper.start()
    reaper.remove_tree(gone)
    reaper.remove_tree(kept)
    reaper.keep_tree(kept)
    reaper.close()
    assert not gone.exists() and (kept / "logs" / "worker-0.log").read_text() == "x"
    assert os.listdir(tmp_path) == ["kept"]
