"""An on/off switch read from the environment: one spelling for every $LLMKILN_* switch.

`env_switch(NAME, default)`: unset or empty gives `default`; 1/true/on/yes turn it on and 0/false/off/no off, in
any case and with spaces around; anything else is a BadInput naming the variable and what it takes (a typo must
not silently keep the default: `LLMKILN_CASCADE=of` is an error, not "on").
"""

from __future__ import annotations

import os

from llmkiln.errors import BadInput

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


def env_switch(name: str, default: bool) -> bool:
    """$name as on/off (unset or empty: `default`); BadInput for any other value."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ON:
        return True
    if raw in OFF:
        return False
    raise BadInput(
        f"${name}={os.environ[name]!r}: give one of {'/'.join(ON)} (on) or {'/'.join(OFF)} (off), or unset it"
    )
