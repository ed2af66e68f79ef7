"""models.toml as frozen dataclasses: model sources, pairs, their defaults."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from ..engine.settings import Overrides
from ..errors import ConfigError
from .derive import first_layers_tag
from .synthetic import (
    DEFAULT_EARLY,
    DEFAULT_LATE,
    DEFAULT_QUANT,
    DEFAULT_SEED,
    SHAPES,
    approx_size,
    synthetic_path,
)
from .synthetic_eagle3 import DRAFT_TAG as EAGLE3_DRAFT_TAG
from .synthetic_eagle3 import target_path as eagle3_target_path

CONFIG_FILENAME = "models.toml"
CONFIG_ENV_VAR = "SPECLLAMA_CONFIG"

#: Quantization types a model may be derived with (llama.cpp ftype names). F32 serves as a
#: target: dequantized, a small model becomes bound by memory bandwidth like a laptop's 7B.
DERIVE_QUANTS: tuple[str, ...] = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K_M", "Q6_K", "F16", "F32",
)
#: The draft source string meaning "no draft model: prompt-lookup drafting".
LOOKUP = "lookup"

#: The prefix of a Hugging Face model source string: ``hf://OWNER/REPO/FILE.gguf``.
HF_SCHEME = "hf://"
#: The revision (branch, tag or commit) of an ``hf`` source that names none.
HF_DEFAULT_REVISION = "main"

SourceKind = Literal["path", "package", "derive", "lookup", "hf", "synthetic"]
_SOURCE_KINDS = ("path", "package", "derive", "lookup", "hf", "synthetic")
#: The widest weight scale of a synthetic model's later layers (models.toml's `late`).
MAX_LATE = 1.0

# One half of a Hugging Face repo id (as huggingface_hub's validate_repo_id allows).
_HF_NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?$")
_GLOB_CHARS = frozenset("*?[")


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


def split_hf_url(url: str) -> tuple[str, str] | None:
    """``hf://OWNER/REPO/FILE`` -> (``OWNER/REPO``, ``FILE``); None when malformed.
    FILE may be a glob or contain '/'."""
    parts = url[len(HF_SCHEME) :].split("/", 2)
    if not url.startswith(HF_SCHEME) or len(parts) < 3 or not all(parts):
        return None
    return f"{parts[0]}/{parts[1]}", parts[2]


# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic model (:mod:`.synthetic`): random weights in the shape ``shape`` (a
    key of :data:`SHAPES`), quantized to ``quant``, its first ``early`` layers at full
    scale and the later ones scaled by ``late``, drawn from ``seed``; with ``eagle3``, made
    for an EAGLE3 head to draft for it (:mod:`.synthetic_eagle3`: a llama shape only)."""

    shape: str
    quant: str = DEFAULT_QUANT
    early: int = DEFAULT_EARLY
    late: float = DEFAULT_LATE
    seed: int = DEFAULT_SEED
    eagle3: bool = False

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; expected one of {tuple(SHAPES)}")
        if self.quant not in DERIVE_QUANTS:
            raise ValueError(f"unknown quant {self.quant!r}; expected one of {DERIVE_QUANTS}")
        if not 0 <= self.early <= SHAPES[self.shape].layers:
            raise ValueError(f"early must be 0..{SHAPES[self.shape].layers}, got {self.early}")
        if not 0.0 <= self.late <= MAX_LATE:
            raise ValueError(f"late must be in [0, {MAX_LATE:g}], got {self.late}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.eagle3 and SHAPES[self.shape].arch != "llama":
            raise ValueError(f"eagle3 needs a llama shape, {self.shape!r} is "
                             f"{SHAPES[self.shape].arch}")

    @property
    def path(self) -> Path:
        """Where it is made once (made or not)."""
        if self.eagle3:
            return eagle3_target_path(self.shape, self.quant, self.early, self.late, self.seed)
        return synthetic_path(self.shape, self.quant, self.early, self.late, self.seed)

    @property
    def title(self) -> str:
        return SHAPES[self.shape].title

    def describe(self) -> str:
        size = approx_size(SHAPES[self.shape], self.quant)
        made_for = ", made for an EAGLE3 head" if self.eagle3 else ""
        return (f"synthetic {self.title} shape: random weights, {self.quant} ({size}), layers "
                f"after the first {self.early} scaled by {self.late:g}{made_for}, made once "
                "in the user cache")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from. Exactly the fields of its ``kind`` are set.

    - ``path``: ``path`` (absolute, ``~`` expanded, relative paths already joined
      to the config file's directory)
    - ``package``: ``package`` (importable name) and ``file`` (relative to its directory)
    - ``derive``: ``quant`` (one of :data:`DERIVE_QUANTS`): requantized from the target;
      or ``layers``: the target's first ``layers`` layers; or ``eagle3`` (True): an EAGLE3
      head made for a synthetic target made for one (:mod:`.synthetic_eagle3`)
    - ``lookup``: nothing (prompt-lookup drafting, no draft model)
    - ``hf``: ``repo`` (``OWNER/REPO`` on Hugging Face), ``file`` (a ``.gguf`` name in
      it, or a glob such as ``*q4_k_m*.gguf``) and ``revision`` (default ``"main"``)
    - ``synthetic``: ``synthetic``, a random-weight model of a real shape (a target)
    """

    kind: SourceKind
    path: Path | None = None
    package: str | None = None
    file: str | None = None
    quant: str | None = None
    repo: str | None = None
    revision: str | None = None
    layers: int | None = None
    synthetic: SyntheticSpec | None = None
    eagle3: bool = False

    def __post_init__(self) -> None:
        if self.kind == "hf" and self.revision is None:
            object.__setattr__(self, "revision", HF_DEFAULT_REVISION)
        expected = {
            "path": {"path"},
            "package": {"package", "file"},
            "derive": {"eagle3"} if self.eagle3 else {"quant"} if self.layers is None
            else {"layers"},
            "lookup": set(),
            "hf": {"repo", "file", "revision"},
            "synthetic": {"synthetic"},
        }.get(self.kind)
        if expected is None:
            raise ValueError(f"unknown source kind {self.kind!r}; expected one of {_SOURCE_KINDS}")
        given = {f.name for f in fields(self) if f.name != "kind" and getattr(self, f.name)}
        if given != expected:
            raise ValueError(
                f"a {self.kind!r} source takes {sorted(expected)}, got {sorted(given)}"
            )
        if self.kind == "derive" and self.layers is not None:
            if self.layers < 1:
                raise ValueError(f"layers must be >= 1, got {self.layers}")
        elif self.kind == "derive" and not self.eagle3 and self.quant not in DERIVE_QUANTS:
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
    def first_layers(cls, layers: int) -> ModelSource:
        """A draft made of the target's first ``layers`` layers."""
        return cls(kind="derive", layers=layers)

    @classmethod
    def eagle3_head(cls) -> ModelSource:
        """A draft that is an EAGLE3 head made for the (synthetic) target."""
        return cls(kind="derive", eagle3=True)

    @classmethod
    def from_synthetic(cls, shape: str, **spec: Any) -> ModelSource:
        """A synthetic model of ``shape`` (``spec``: :class:`SyntheticSpec`'s other fields)."""
        return cls(kind="synthetic", synthetic=SyntheticSpec(shape, **spec))

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
        split = split_hf_url(url)
        if split is None:
            raise ValueError(
                f'must look like "{HF_SCHEME}OWNER/REPO/FILE.gguf" (or a glob: '
                f'"{HF_SCHEME}OWNER/REPO/*q4_k_m*.gguf"), got {url!r}'
            )
        return cls.from_hf(*split)

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
        if self.kind == "derive" and self.layers is not None:
            return (f"the target's first {self.layers} layers, with its embeddings and "
                    "output head")
        if self.kind == "derive" and self.eagle3:
            return "an EAGLE3 head made for the synthetic target (F16), made once"
        if self.kind == "derive":
            return f"{self.quant} requantization of the target"
        if self.kind == "synthetic":
            assert self.synthetic is not None
            return self.synthetic.describe()
        return "prompt lookup (no draft model), and the target's MTP layers if it has them"

    @property
    def derive_tag(self) -> str:
        """What a ``derive`` source makes of the target, as its file names say it: the
        quant (``Q4_0``), or ``first2`` for the first two layers."""
        if self.kind != "derive":
            raise ValueError(f"a {self.kind!r} source is not derived")
        if self.eagle3:
            return EAGLE3_DRAFT_TAG
        return first_layers_tag(self.layers) if self.layers is not None else str(self.quant)


#: A pair's default settings (models.toml `[defaults]`): the settings it gives, each
#: checked by the table; flags override them.
PairDefaults = Overrides


@dataclass(frozen=True)
class Pair:
    """A named target/draft pair from models.toml."""

    name: str
    target: ModelSource
    draft: ModelSource
    description: str = ""
    defaults: PairDefaults = field(default_factory=PairDefaults)
    #: HOST:PORT of llama.cpp RPC servers that hold the target (``target = { ..., rpc = [...] }``).
    target_rpc: tuple[str, ...] = ()
    #: The target file requantized once to this type (``target = { ..., quant = "F32" }``).
    target_quant: str | None = None
    #: The draft file requantized once to this type (``draft = { ..., quant = "Q4_0" }``;
    #: not for ``{ derive = "target", quant = ... }``, whose quant is its own).
    draft_quant: str | None = None
    #: The models.toml this pair came from (None for pairs built in code).
    config_path: Path | None = None

    def __post_init__(self) -> None:
        if self.draft.eagle3 and (self.target.synthetic is None
                                  or not self.target.synthetic.eagle3):
            where = f"{self.config_path}: " if self.config_path is not None else ""
            raise ConfigError(
                f"{where}pairs.{self.name}.draft: an EAGLE3 head ({{ eagle3 = \"target\" }}) "
                "drafts for a synthetic target made for one: target = { synthetic = "
                "\"llama3.1-8b\", early = 0, eagle3 = true }")


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
