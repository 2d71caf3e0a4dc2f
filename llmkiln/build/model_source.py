"""Resolve where a recipe's weights come from: a local HF folder, a registry package's GGUF imported into llmkiln's
model cache (llmkiln.build.model_import), or a generated Llama cached under engines/.models/.

A missing local folder is bad input (exit 2) naming `model.path`; nothing is written. A generated model is made
once per (kind, seed) by llmkiln.build.generate.generate_model into a temp folder and renamed into place; a
package is imported once (content-addressed by the GGUF's sha256) and found there by every later build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmkiln.atomic import atomic_dir, keep_existing
from llmkiln.build.generate import ModelKind, generate_model
from llmkiln.build.model_import import expected_dir, find_import, import_package
from llmkiln.errors import BadInput
from llmkiln.recipe import Recipe, resolve_model_path


@dataclass(frozen=True)
class ModelLocation:
    """Where the weights are, and what the recipe said (for the manifest and error messages)."""

    path: Path
    generated: str | None = None
    seed: int | None = None
    package: dict[str, object] | None = None  # an imported package's provenance (ImportedModel.provenance)

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {"path": str(self.path)}
        if self.generated is not None:
            out.update(generated=self.generated, seed=self.seed)
        if self.package is not None:
            out["package"] = self.package
        return out


def check_hf_folder(path: Path, field: str, recipe_file: Path | None) -> None:
    """Raise BadInput unless `path` looks like a Hugging Face model folder (config.json + weights)."""
    where = f"{recipe_file}: field '{field}'" if recipe_file else f"--model {path}"
    if not path.exists():
        hint = (
            f" (model.path is relative to the recipe file), or pass one: "
            f"`kiln build {recipe_file.stem} --model /path/to/hf-folder` "
            f"(`make engine RECIPE={recipe_file.stem} MODEL=/path/to/hf-folder`)"
            if recipe_file
            else ""
        )
        raise BadInput(
            f"{where}: model folder {path} does not exist. Point it at a local Hugging Face folder "
            f"(config.json + *.safetensors){hint}"
        )
    if not path.is_dir():
        raise BadInput(f"{where}: {path} is not a folder; expected a local Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise BadInput(f"{where}: {path} has no config.json; expected a local Hugging Face model folder")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise BadInput(f"{where}: {path} holds no *.safetensors or *.bin weights")


def generated_model_dir(engines_root: Path, kind: str, seed: int) -> Path:
    return engines_root / ".models" / f"{kind}-seed{seed}"


def ensure_generated(kind: ModelKind, seed: int, engines_root: Path) -> Path:
    """The cached generated model folder, generating it (temp folder + rename) when absent."""
    target = generated_model_dir(engines_root, kind, seed)
    if (target / "config.json").is_file():
        return target
    # keep_existing: another build may have finished it meanwhile
    with atomic_dir(target, prefix=f".tmp-{kind}-seed{seed}-", publish=keep_existing) as tmp:
        generate_model(kind, tmp, seed)
    return target


def resolve_source(
    recipe: Recipe,
    recipe_file: Path,
    engines_root: Path,
    model_override: Path | None = None,
    create: bool = True,
    log: Callable[[str], None] | None = None,
) -> ModelLocation:
    """The model folder for a build. `model_override` (kiln build --model) replaces the recipe's model.

    With create=False a generated model or package import that does not exist yet is reported at its future
    path (dry runs). `log` gets a package import's progress lines.
    """
    if model_override is not None:
        path = Path(model_override).expanduser().resolve()
        check_hf_folder(path, "model", None)
        return ModelLocation(path)
    if recipe.model.package is not None:
        pkg = recipe.model.package
        found = find_import(pkg)
        if found is None and create:
            found = import_package(pkg, log=log, where=f"{recipe_file}: field 'model.package'")
        if found is None:
            return ModelLocation(expected_dir(pkg))
        return ModelLocation(found.hf_dir, package=found.provenance())
    if recipe.model.generated is not None:
        kind, seed = recipe.model.generated, recipe.model.seed
        if not create:
            return ModelLocation(generated_model_dir(engines_root, kind, seed), kind, seed)
        return ModelLocation(ensure_generated(kind, seed, engines_root), kind, seed)
    model_path = resolve_model_path(recipe, recipe_file)
    if model_path is None:  # unreachable: the schema requires path or generated
        raise BadInput(f"{recipe_file}: field 'model': give model.path or model.generated")
    check_hf_folder(model_path, "model.path", recipe_file)
    return ModelLocation(model_path)
