"""The one table of settings: name, type, range, default, help (the `Settings` dataclass).

It drives the command-line flags, models.toml `[defaults]`, `/set` in chat, the
validation messages and the defaults of the Python API, so a setting has one
default and one rule everywhere. It lives in the engine (the lowest layer) because
the engine's own defaults come from it; the layers above only read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from ..errors import ConstraintError, InvalidParameterError
from .constraint import ConstraintSpec
from .drafting.chain import Drafters
from .llama.rpc import endpoint_problem
from .penalties import OPENAI_RANGE, Penalties
from .sampling import SamplingParams

Check = Callable[[Any], "tuple[Any, str | None]"]

#: Largest allowed draft_max (tokens drafted per round).
DRAFT_MAX_LIMIT = 64
DRAFT_MAX_WORDS = ("auto", "heuristic")


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
    rule = f"must be {'>' if lo_open else '>='} {lo:g}" if hi is None else \
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


def _check_draft_threads(value: Any) -> tuple[Any, str | None]:
    if value == "auto" or (is_int(value) and value >= 0):
        return value, None
    return value, f"must be 'auto' or an integer >= 0, {got(value)}"


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


def _check_paths(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v.strip() for v in value):
        return value, f"must be file or folder names, {got(value)}"
    return tuple(v.strip() for v in value), None


def _text(value: Any) -> tuple[Any, str | None]:
    if value is None:
        return None, None
    if not isinstance(value, str) or not value.strip():
        return value, f"must be a non-empty string, {got(value)}"
    return value, None


def _check_drafters(value: Any) -> tuple[Any, str | None]:
    if value is None:
        return None, None
    try:
        return Drafters.parse(value), None
    except InvalidParameterError as exc:
        return value, str(exc).removeprefix("drafters ")


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
    metavar: str = ""  # what a text setting's flag takes

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
        if self.type is str and not self.words:  # free text; "off" clears it (/set)
            return self.validate(None if text.lower() in ("off", "none") else text)
        value: Any = text
        for convert in (int, float):
            try:
                value = convert(text)
                break
            except ValueError:
                continue
        return self.validate(value)


def _check_bool(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return value, None
    return value, f"must be true or false, {got(value)}"


def _seed_check(value: Any) -> tuple[Any, str | None]:
    return (None, None) if value is None else _int_at_least(0)(value)


def _row(default: Any, kind: type, help: str, check: Check, **extra: Any) -> Any:
    """A field of Settings: its default, and the rest of its row of the table."""
    return field(default=default, metadata={"row": dict(type=kind, help=help, check=check,
                                                        **extra)})


@dataclass(frozen=True)
class Settings:
    """The table itself: one field per setting, in the order flags and messages list them.
    Adding a field here adds its flag, its `[defaults]` key, `/set` and its place in
    --json's settings."""

    n_ctx: int = _row(2048, int, "Context window in tokens.", _int_at_least(16), at_load=True)
    threads: int | None = _row(None, int, "CPU threads (default: the cores other processes "
                               "leave free).", _int_at_least(1), at_load=True)
    # A tuple setting is a repeatable flag; models.toml gives it per target (rpc = [...]).
    rpc: tuple[str, ...] = _row((), tuple, "Run the target on this llama.cpp RPC server "
                                "(HOST:PORT; repeat to split it over several); the draft "
                                "stays local.", _check_rpc, in_file=False, at_load=True)
    corpus: tuple[str, ...] = _row((), tuple, "Files or folders of UTF-8 text that lookup "
                                   "drafts may copy from (repeat for more; tokenized once "
                                   "and cached).", _check_paths, at_load=True, metavar="PATH")
    draft_cache: str | None = _row(
        None, str, "Keep what is generated in this file and draft from it in later runs "
        "(opt-in: it holds your text; 'off': none).", _text, at_load=True, metavar="FILE|off")
    cross_vocab: bool = _row(False, bool, "Let a draft model with another tokenizer draft, "
                             "through the tokens both vocabularies spell alike (exact).",
                             _check_bool, at_load=True)
    draft_threads: int | str = _row(
        "auto", int, "Threads the draft model drafts ahead on while the target verifies on "
        "the others (0: the models take turns, each on every thread; 'auto': measured, 0 "
        "where drafting ahead would not pay, as on 2 cores).", _check_draft_threads,
        at_load=True, words=("auto",))
    draft_max: int | str = _row("auto", int, "Draft length: N (0 = target alone), 'auto' "
                                "(cost-aware) or 'heuristic'.", _check_draft_max,
                                words=DRAFT_MAX_WORDS)
    # None: chosen by the pair once it is loaded (chain.who_drafts); "none": nobody.
    drafters: Drafters | None = _row(
        None, str, "Who drafts, in order: lookup, model, lookup>model (the draft model "
        "checking lookups' guesses), mtp (the target's own MTP layers), comma-separated "
        "(default: lookup,model, lookup where the text repeats itself and the draft model "
        "elsewhere; lookup,mtp for a target with MTP layers and no draft model; lookup "
        "otherwise; 'hybrid' is lookup,model; 'none': nobody, the target alone).",
        _check_drafters, aliases=("--draft-mode",), metavar="NAMES", words=("none",))
    temperature: float = _row(0.8, float, "0 = greedy.", _float_in(0.0, None),
                              aliases=("--temp",))
    top_k: int = _row(0, int, "Keep the k most likely tokens (0 = off).", _int_at_least(0))
    top_p: float = _row(1.0, float, "Nucleus sampling mass in (0, 1].",
                        _float_in(0.0, 1.0, lo_open=True))
    min_p: float = _row(0.0, float, "Drop tokens below min_p × the top probability.",
                        _float_in(0.0, 1.0))
    # Repetition penalties (engine/penalties.py), llama.cpp's and OpenAI's; exact under
    # speculation: docs/architecture.md, "Repetition penalties".
    repeat_penalty: float = _row(
        1.0, float, "Divide the logit of each token seen in the last --repeat-last-n tokens "
        "by this (multiply a negative one), as llama.cpp does (1 = off).",
        _float_in(0.0, None, lo_open=True))
    repeat_last_n: int = _row(64, int, "Tokens of the text, prompt included, the penalties "
                              "look back on (-1 = all of it, 0 = penalties off).",
                              _int_at_least(-1))
    presence_penalty: float = _row(0.0, float, "Subtract this from the logit of each token "
                                   "seen in that window (OpenAI's; 0 = off).",
                                   _float_in(*OPENAI_RANGE))
    frequency_penalty: float = _row(0.0, float, "Subtract this times the token's count in "
                                    "that window (OpenAI's; 0 = off).",
                                    _float_in(*OPENAI_RANGE))
    max_tokens: int = _row(256, int, "Tokens to generate at most.", _int_at_least(1))
    seed: int | None = _row(None, int, "Random seed: with a fixed --draft-max, same seed, same "
                            "output; under auto, drafts follow measured timings, so outputs may "
                            "differ (each exact).", _seed_check)
    # Why 0.2, and what it gains where verifying is dear: docs/architecture.md,
    # "The draft confidence cutoff".
    p_min: float = _row(0.2, float, "Stop a fixed-length draft when the draft model's top "
                        "token has less probability (0 = never; auto's stop rule learns its "
                        "own; exact either way).", _float_in(0.0, 1.0))

    # The output's constraint: one of these three at most (see `constraint`).
    json_schema: str | None = _row(
        None, str, "Constrain the output to this JSON schema: a file, or the schema "
        "itself as JSON.", _text, in_file=False, metavar="FILE|JSON")
    grammar: str | None = _row(
        None, str, "Constrain the output to this grammar file (llama.cpp's GBNF, or "
        "Lark).", _text, in_file=False, metavar="FILE")
    regex: str | None = _row(None, str, "Constrain the output to match this regular "
                             "expression.", _text, in_file=False, metavar="PATTERN")

    @property
    def constraint(self) -> ConstraintSpec | None:
        """What --json-schema, --grammar or --regex ask for (a file read now);
        ConstraintError for a bad one or more than one."""
        given = [(n, v) for n, v in (("json_schema", self.json_schema),
                                     ("grammar", self.grammar), ("regex", self.regex)) if v]
        if not given:
            return None
        if len(given) > 1:
            flags = " and ".join(SETTINGS[n].flag for n, _ in given)
            raise ConstraintError(f"give one constraint at most, not {flags}")
        name, value = given[0]
        if name == "json_schema":
            return ConstraintSpec.json_schema(value)
        if name == "grammar":
            return ConstraintSpec.grammar_file(value)
        return ConstraintSpec("regex", value)

    @property
    def sampling(self) -> SamplingParams:
        penalties = Penalties(self.repeat_penalty, self.repeat_last_n,
                              self.presence_penalty, self.frequency_penalty)
        return SamplingParams(temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, min_p=self.min_p, seed=self.seed,
                              penalties=penalties)


SETTINGS: dict[str, Setting] = {
    f.name: Setting(f.name, default=f.default, **f.metadata["row"]) for f in fields(Settings)
}

S = TypeVar("S", bound=Settings)


@dataclass(frozen=True)
class Overrides:
    """Some settings, each already checked by the table: a pair's models.toml `[defaults]`,
    or the flags given. `values` holds them; the others keep the table's defaults there."""

    values: Settings = field(default_factory=Settings)
    given: frozenset[str] = frozenset()

    @classmethod
    def of(cls, **values: Any) -> Overrides:
        return cls(Settings(**values), frozenset(values))

    def over(self, below: S) -> S:
        """`below` with these settings in place of its own."""
        return replace(below, **{n: getattr(self.values, n) for n in self.given})

    def as_dict(self) -> dict[str, object]:
        """Only the settings given, in the table's order."""
        return {n: getattr(self.values, n) for n in SETTINGS if n in self.given}


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
