"""Integrity: engine files are checked against the manifest before anything is loaded; the build cache and the
source-hash cache never trust changed bytes."""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_build import write_variant

from llmkiln.backends import build as build_engine
from llmkiln.engine_dir import EngineDir
from llmkiln.errors import IntegrityError
from llmkiln.hashing import sha256_file

pytestmark = pytest.mark.slow


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmkiln.cli.main", *args], capture_output=True, text=True, timeout=300
    )


def flip_byte(path: Path, keep_mtime: bool = False) -> None:
    """Flip one byte in the middle of `path` in place (same size, same inode); optionally restore the mtime."""
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(st.st_size // 2)
        b = fh.read(1)
        fh.seek(st.st_size // 2)
        fh.write(bytes([b[0] ^ 0x01]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def engine_copy(engine_factory, tmp_path: Path) -> Path:
    dst = tmp_path / "stories-fp32"
    shutil.copytree(engine_factory("stories-fp32"), dst)
    return dst


def test_flipped_byte_is_refused_by_generate_and_verify(engine_copy: Path) -> None:
    ok = kiln("verify", str(engine_copy))
    assert ok.returncode == 0 and "files match the manifest" in ok.stdout, ok.stderr
    flip_byte(engine_copy / "model.onnx.data", keep_mtime=True)  # same size and mtime: ctime still changes
    gen = kiln("generate", str(engine_copy), "Once upon a time", "--max-tokens", "4")
    assert gen.returncode == 1 and gen.stdout == "", gen.stdout
    assert "model.onnx.data" in gen.stderr and "does not match its manifest" in gen.stderr
    bad = kiln("verify", str(engine_copy))
    assert bad.returncode == 1 and "model.onnx.data" in bad.stderr
    missing = kiln("verify", str(engine_copy / "nope"))
    assert missing.returncode == 2


def test_verify_rehashes_every_file_every_time(engine_copy: Path) -> None:
    folder = EngineDir(engine_copy)
    first = folder.verify()
    total = sum((engine_copy / rel).stat().st_size for rel in folder.require_manifest().engine_files)
    assert first.bytes == total and folder.verify().bytes == total  # no stamp shortcut on the second check
    (engine_copy / "tokenizer.json").unlink()
    with pytest.raises(IntegrityError, match="tokenizer.json: missing"):
        folder.verify()


class MappedWriter:
    """A writer holding a shared writable mmap of `path` whose pages it has already dirtied (each rewritten with
    its own bytes, which is when Linux updates the mtime): its later writes change the file's bytes while its
    size, mtime, ctime and inode stay as they were (issue 21, finding 6; no root, no clock change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR)
        self.map = mmap.mmap(self.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.map[:] = self.map[:]  # no msync: writeback would write-protect the pages again

    def stamp(self) -> tuple[int, int, int, int]:
        st = self.path.stat()
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def flip_byte(self) -> None:
        before = self.stamp()
        mid = len(self.map) // 2
        self.map[mid] = self.map[mid] ^ 0x01
        assert self.stamp() == before  # the premise: nothing stat() shows has changed

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def test_mmap_rewrite_is_refused_by_generate_serve_and_dynamo(engine_copy: Path, tmp_path: Path) -> None:
    from llmkiln.dynamo.launcher import serve_dynamo
    from llmkiln.dynamo.options import DynamoOptions
    from llmkiln.serve.launch import ServeOptions, serve_engine

    writer = MappedWriter(engine_copy / "model.onnx.data")
    try:
        EngineDir(engine_copy).verify()  # checked once with the pages already dirty (and the bytes intact)
        writer.flip_byte()
        gen = kiln("generate", str(engine_copy), "Once upon a time", "--max-tokens", "4")
        assert gen.returncode == 1 and gen.stdout == "", gen.stdout
        assert "model.onnx.data" in gen.stderr and "does not match its manifest" in gen.stderr
        with pytest.raises(IntegrityError, match="model.onnx.data"):
            serve_engine(engine_copy, ServeOptions())  # before anything is started
        with pytest.raises(IntegrityError, match="model.onnx.data"):
            serve_dynamo(engine_copy, DynamoOptions(state_dir=tmp_path / "state"))  # before anything starts
        assert not (tmp_path / "state").exists()
    finally:
        writer.close()


def test_mmap_rewritten_source_is_not_up_to_date(tmp_path: Path, stories_dir: Path) -> None:
    src = tmp_path / "model"
    shutil.copytree(stories_dir, src)
    recipe = write_variant(tmp_path, "mmap", src)
    engines = tmp_path / "engines"
    build_engine(recipe, engines)
    writer = MappedWriter(src / "model.safetensors")
    try:
        assert build_engine(recipe, engines).cached  # checked once with the pages already dirty
        writer.flip_byte()
        again = build_engine(recipe, engines)
        assert not again.cached  # different weights are never "up to date"
        recorded = json.loads((again.engine_dir / "manifest.json").read_text())["source"]["weights"]
        assert recorded["model.safetensors"] == sha256_file(src / "model.safetensors")  # not a stale sha256
    finally:
        writer.close()


def test_mmap_rewritten_engine_is_rebuilt(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(tmp_path, "mmap-engine", stories_dir)
    engines = tmp_path / "engines"
    first = build_engine(recipe, engines)
    writer = MappedWriter(first.engine_dir / "model.onnx.data")
    try:
        assert build_engine(recipe, engines).cached
        writer.flip_byte()
    finally:
        writer.close()
    rebuilt = build_engine(recipe, engines)
    assert not rebuilt.cached
    EngineDir(rebuilt.engine_dir).verify()


def test_build_is_not_up_to_date_with_a_corrupted_engine(tmp_path: Path, stories_dir: Path) -> None:
    recipe = write_variant(tmp_path, "integ", stories_dir)
    engines = tmp_path / "engines"
    first = build_engine(recipe, engines)
    assert build_engine(recipe, engines).cached
    flip_byte(first.engine_dir / "model.onnx.data")
    rebuilt = build_engine(recipe, engines)
    assert not rebuilt.cached
    EngineDir(rebuilt.engine_dir).verify()


def test_corrupted_stage_cache_is_rebuilt_not_copied(tmp_path: Path, stories_dir: Path) -> None:
    engines = tmp_path / "engines"
    a = build_engine(write_variant(tmp_path, "cache-a", stories_dir), engines)
    good = json.loads((a.engine_dir / "manifest.json").read_text())["engine_files"]["model.onnx.data"]
    [cached] = list((engines / ".stages" / "export").glob("*/model.onnx.data"))
    flip_byte(cached)
    # a killed build's temp folder (its pid is gone) is removed by the next build
    dead = engines / ".stages" / "export" / ".tmp-0123456789ab@999999999-x"
    dead.mkdir()
    # same export key, different runtime settings: the export stage's cache is looked up
    b = build_engine(
        write_variant(tmp_path, "cache-b", stories_dir, scheduler={"max_batch_size": 4}), engines
    )
    manifest = json.loads((b.engine_dir / "manifest.json").read_text())
    assert manifest["engine_files"]["model.onnx.data"] == good
    assert next(s for s in manifest["stages"] if s["name"] == "export")["cached"] is False
    EngineDir(b.engine_dir).verify()
    assert not dead.exists()


def test_changed_source_with_restored_mtime_is_rehashed(tmp_path: Path, stories_dir: Path) -> None:
    src = tmp_path / "model"
    shutil.copytree(stories_dir, src)
    recipe = write_variant(tmp_path, "mtime", src)
    engines = tmp_path / "engines"
    build_engine(recipe, engines)
    flip_byte(src / "model.safetensors", keep_mtime=True)
    again = build_engine(recipe, engines)
    assert not again.cached  # different weights are never "up to date"


def test_serve_refuses_a_corrupted_engine_before_starting_anything(engine_copy: Path) -> None:
    flip_byte(engine_copy / "model.onnx")
    r = kiln("serve", str(engine_copy), "--http-port", "1", "--grpc-port", "2", "--metrics-port", "3")
    assert r.returncode == 1 and "model.onnx" in r.stderr and "does not match its manifest" in r.stderr
    assert "ready" not in r.stderr
