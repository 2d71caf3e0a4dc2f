"""Data that ships with llmkiln: the bundled recipes and the calibration/evaluation text sets.

In an installed wheel they live inside the package, under `llmkiln/_data/` (pyproject.toml copies the
repository's `recipes/` and `calibration/` there when the wheel is built); in a source checkout (an editable
install) they are those repository folders themselves. `bundled(name)` finds either, so nothing else needs to
know where llmkiln was installed from.
"""

from __future__ import annotations

from pathlib import Path

from llmkiln.errors import BadInput

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIRS = ("recipes", "calibration")


def bundled(name: str) -> Path:
    """The bundled data folder `name` ("recipes" or "calibration")."""
    if name not in DATA_DIRS:
        raise ValueError(f"no bundled data folder {name!r}; known: {', '.join(DATA_DIRS)}")
    for candidate in (PACKAGE_DIR / "_data" / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise BadInput(
        f"llmkiln's bundled {name}/ folder is missing from this installation ({PACKAGE_DIR}); reinstall llmkiln"
    )
