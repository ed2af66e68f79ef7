"""Where a request body holds a lone UTF-16 surrogate (an escape \\ud800-\\udfff without its
pair: JSON allows it, text does not), found without a Python loop over a million items:
schema.py's `parse` names the field, or the path to the string, in its 400."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable
from typing import Any

# A JSON escape of a UTF-16 surrogate: the only way a lone one gets into a decoded body.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Nodes the search for a lone surrogate's path may visit before it names only the field.
_WALK_BUDGET = 10_000


class NestedTooDeep(ValueError):
    """A field (None: the body) nested deeper than json.dumps can write it back."""

    def __init__(self, name: str | None) -> None:
        super().__init__(name)
        self.name = name


def lone_surrogate(data: Any, fields: Iterable[str]) -> list[str] | None:
    """The path to the first string (or key) holding an unpaired surrogate, or None.

    Only the `fields` the request reads (the rest are dropped unread), each searched whole
    in C (json.dumps, a regex) and walked only if one is there; a walk that has not found
    it within _WALK_BUDGET nodes names the field alone. So no Python loop runs over a
    million items."""
    if not isinstance(data, dict):
        return [] if _holds_surrogate(data, None) else None
    for name in fields:
        if name in data and _holds_surrogate(data[name], name):
            return [name, *(_walk(data[name]) or [])]
    return None


def _holds_surrogate(value: Any, name: str | None) -> bool:
    try:
        return _SURROGATE.search(json.dumps(value, ensure_ascii=False)) is not None
    except RecursionError:  # json.loads read it a few frames shallower than this
        raise NestedTooDeep(name) from None


def _walk(value: Any) -> list[str] | None:
    """The path within `value` to its first string or key with a lone surrogate; None
    when the budget runs out first. A loop, not recursion: it may be nested deep."""
    todo: list[tuple[list[str], Any]] = [([], value)]
    budget = _WALK_BUDGET
    while todo and budget > 0:
        path, value = todo.pop()
        budget -= 1
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            pairs = list(itertools.islice(value.items(), budget))
            for key, _ in pairs:
                if _SURROGATE.search(key):
                    return path
            todo += [([*path, key], item) for key, item in reversed(pairs)]
        elif isinstance(value, list):  # only as many items as the budget could visit
            todo += [([*path, str(i)], value[i]) for i in reversed(range(min(len(value),
                                                                             budget)))]
    return None
