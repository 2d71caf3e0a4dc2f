"""YAML loading with limits: a recipe may use aliases only a few times, expand to a bounded number of values and
nest a bounded number of levels, so a few hundred bytes of nested aliases (a "billion laughs" file) or 5,000 `[`
is a short yaml.YAMLError naming the line, not a huge value, a hang or a RecursionError traceback. (JSON:
llmkiln.jsonl.loads_json.)"""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_ALIASES = 64
MAX_DEPTH = 64  # mappings/sequences inside each other; a recipe needs 4


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses more than MAX_YAML_ALIASES alias uses: a few hundred bytes of nested aliases
    (a "billion laughs" file) would otherwise expand into a huge value, error message or merge."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(
                    f"more than {MAX_YAML_ALIASES} YAML aliases (*name) at line {mark.line + 1}: "
                    "recipes may reuse a value only a few times"
                )
        # the composer (and the constructor after it) recurse once per level: bound it before Python does
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep at line {mark.line + 1}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


MAX_YAML_VALUES = 100_000


def _expanded_size(value: Any, memo: dict[int, int]) -> int:
    """Values in `value` counting every alias use in full (memoized per object, so a DAG is cheap to size)."""
    key = id(value)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a cycle (not possible with safe_load) would count once
    if isinstance(value, dict):
        n = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in value.items())
    elif isinstance(value, list):
        n = 1 + sum(_expanded_size(v, memo) for v in value)
    else:
        n = 1
    memo[key] = min(n, MAX_YAML_VALUES + 1)
    return memo[key]


def safe_load_yaml(text: str) -> Any:
    """yaml.safe_load with the alias limit (MAX_YAML_ALIASES) and a bound on the expanded size
    (MAX_YAML_VALUES), so nested aliases cannot make a small file into a huge value."""
    loader = _LimitedLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    if _expanded_size(data, {}) > MAX_YAML_VALUES:
        raise yaml.YAMLError(
            f"the document expands to more than {MAX_YAML_VALUES} values (nested aliases?); write it out plainly"
        )
    return data
