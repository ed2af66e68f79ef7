"""The one table of settings: name, type, range, default, help.

It drives the command-line flags, models.toml `[defaults]`, `/set` in chat, the
validation messages and the defaults of the Python API, so a setting has one
default and one rule everywhere. It lives in the engine (the lowest layer) because
the engine's own defaults come from it; the layers above only read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidParameterError
from .rpc import endpoint_problem

Check = Callable[[Any], "tuple[Any, str | None]"]

#: Largest allowed draft_max (tokens drafted per round).
DRAFT_MAX_LIMIT = 64
DRAFT_MAX_WORDS = ("auto", "heuristic")
DRAFT_MODES = ("model", "lookup", "hybrid")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for t, name in ((int, "integer"), (float, "float"), (str, "string"), (dict, "table"),
                    (list, "array")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def show(value: Any) -> str:
    """A value as it would appear in TOML (short)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, list):
        return "[...]"
    return str(value)


def got(value: Any) -> str:
    """'got <kind> <value>' for type errors."""
    if isinstance(value, dict):
        return "got a table"
    if isinstance(value, list):
        return "got an array"
    return f"got {_kind(value)} {show(value)}"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(minimum: int) -> Check:
    def check(value: Any) -> tuple[Any, str | None]:
        if not is_int(value):
            return value, f"must be an integer, {got(value)}"
        if value < minimum:
            return value, f"must be >= {minimum}, got {value}"
        return value, None

    return check


def _float_in(lo: float, hi: float | None, *, lo_open: bool = False) -> Check:
    rule = f"must be >= {lo:g}" if hi is None else \
        f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def check(value: Any) -> tuple[Any, str | None]:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return value, f"must be a number, {got(value)}"
        number = float(value)
        if not math.isfinite(number):
            return value, f"must be a finite number, got {show(value)}"
        too_low = number <= lo if lo_open else number < lo
        if too_low or (hi is not None and number > hi):
            return value, f"{rule}, got {show(value)}"
        return number, None

    return check


def _check_draft_max(value: Any) -> tuple[Any, str | None]:
    words = '"auto" or "heuristic"'
    if value in DRAFT_MAX_WORDS:
        return value, None
    if not is_int(value):
        return value, f"must be an integer, {words}, {got(value)}"
    if not 0 <= value <= DRAFT_MAX_LIMIT:
        return value, f"must be in [0, {DRAFT_MAX_LIMIT}], {words}, got {value}"
    return value, None


def _check_rpc(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return value, f"must be HOST:PORT strings, {got(value)}"
    for endpoint in value:
        problem = endpoint_problem(endpoint)
        if problem is not None:
            return value, problem
    return tuple(v.strip() for v in value), None


def _check_draft_mode(value: Any) -> tuple[Any, str | None]:
    if value in DRAFT_MODES:
        return value, None
    return value, f"must be one of {', '.join(DRAFT_MODES)}, got {show(value)}"


@dataclass(frozen=True)
class Setting:
    name: str
    type: type  # what a typed value is (a flag's text is converted to it)
    default: Any
    help: str
    check: Check
    in_file: bool = True  # may be set in models.toml [defaults]
    at_load: bool = False  # fixed once the models are loaded (so not /set)
    words: tuple[str, ...] = ()  # values allowed besides numbers, or the only ones
    aliases: tuple[str, ...] = ()  # other spellings of the flag (llama.cpp's, Ollama's)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def validate(self, value: Any, label: str | None = None) -> Any:
        """The normalized value (ints become floats for float settings), or
        InvalidParameterError '<label>: must be in (0, 1], got 1.5'."""
        normalized, problem = self.check(value)
        if problem is not None:
            raise InvalidParameterError(f"{label or self.name}: {problem}")
        return normalized

    def parse(self, text: str) -> Any:
        """A value typed as text (a flag, /set), validated."""
        text = text.strip()
        if text in self.words or (self.name == "seed" and text.lower() in ("none", "random")):
            return self.validate(None if self.name == "seed" else text)
        value: Any = text
        for convert in (int, float):
            try:
                value = convert(text)
                break
            except ValueError:
                continue
        return self.validate(value)


def _seed_check(value: Any) -> tuple[Any, str | None]:
    return (None, None) if value is None else _int_at_least(0)(value)


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("n_ctx", int, 2048, "Context window in tokens.", _int_at_least(16), at_load=True),
    Setting("threads", int, None, "CPU threads (default: the cores other processes leave free).",
            _int_at_least(1),
            at_load=True),
    # A tuple setting is a repeatable flag; models.toml gives it per target (rpc = [...]).
    Setting("rpc", tuple, (), "Run the target on this llama.cpp RPC server (HOST:PORT; "
            "repeat to split it over several); the draft stays local.", _check_rpc,
            in_file=False, at_load=True),
    Setting("draft_max", int, "auto",
            "Draft length: N (0 = target alone), 'auto' (cost-aware) or 'heuristic'.",
            _check_draft_max, words=DRAFT_MAX_WORDS),
    Setting("draft_mode", str, None,
            "Who drafts: the draft model, prompt lookup, or both (default: hybrid, "
            "lookup where the text repeats itself and the draft model elsewhere; lookup "
            "when there is no draft model).", _check_draft_mode, in_file=False,
            words=DRAFT_MODES),
    Setting("temperature", float, 0.8, "0 = greedy.", _float_in(0.0, None),
            aliases=("--temp",)),
    Setting("top_k", int, 0, "Keep the k most likely tokens (0 = off).", _int_at_least(0)),
    Setting("top_p", float, 1.0, "Nucleus sampling mass in (0, 1].",
            _float_in(0.0, 1.0, lo_open=True)),
    Setting("min_p", float, 0.0, "Drop tokens below min_p × the top probability.",
            _float_in(0.0, 1.0)),
    Setting("max_tokens", int, 256, "Tokens to generate at most.", _int_at_least(1)),
    Setting("seed", int, None, "Random seed (same seed, same output).", _seed_check),
    # 0.2 gains 1-5% where verifying is dear and is neutral where drafting pays
    # (docs/architecture.md, "The draft confidence cutoff").
    Setting("p_min", float, 0.2, "Stop a draft when the draft model's top token has less "
            "probability (0 = never; exact either way).", _float_in(0.0, 1.0)),
)}

#: The settings models.toml [defaults] accepts, in the order messages list them.
FILE_SETTINGS: tuple[str, ...] = tuple(n for n, s in SETTINGS.items() if s.in_file)
#: The settings `/set` can change while the models stay loaded.
LIVE_SETTINGS: tuple[str, ...] = tuple(n for n, s in SETTINGS.items() if not s.at_load)


def default(name: str) -> Any:
    return SETTINGS[name].default


def validate_setting(name: str, value: Any, *, label: str | None = None) -> Any:
    """Check one setting by the table's rule; see Setting.validate."""
    if name not in SETTINGS:
        raise ValueError(f"unknown setting {name!r}; expected one of {tuple(SETTINGS)}")
    return SETTINGS[name].validate(value, label)
