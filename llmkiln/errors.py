"""Exceptions that cross room boundaries, each with the exit code the CLI maps it to.

The CLI keeps one table (cli/main.py) from these classes to exit codes; library code raises them with a
message that names the file/field, the bad value and what to do.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class: a failure with a user-facing message."""

    exit_code = 1


class BadInput(KilnError):
    """Bad recipe, bad file, bad argument: the user must change something. Exit code 2."""

    exit_code = 2


class RecipeError(BadInput):
    """A recipe file does not validate."""


class CpuLacksFeature(BadInput):
    """The recipe asks for something this machine's CPU cannot run (bf16 without AVX512-BF16/AMX): pick the
    recipe's fp32 sibling or another machine. Exit code 2."""


class NeedsGpuHost(KilnError):
    """The stage needs CUDA and TensorRT-LLM; a plan file was written to finish on a GPU host. Exit code 3."""

    exit_code = 3


class QualityBudgetExceeded(KilnError):
    """A quantized candidate is outside the recipe's quality budget. Exit code 1."""

    exit_code = 1


class BuildFailed(KilnError):
    """A build stage failed for a reason other than bad input."""

    exit_code = 1


class IntegrityError(KilnError):
    """An engine or cached build file does not match the sha256 its manifest records. Exit code 1: the bytes on
    disk changed after the build (corruption, an edit); rebuild with `kiln build RECIPE --force`."""

    exit_code = 1
