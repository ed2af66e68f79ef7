"""Which models.toml to read: --config, $SPECLLAMA_CONFIG, ./models.toml, the
user config directory, then the copy shipped with the package."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from ..errors import ConfigError
from ..paths import APP_NAME
from .schema import CONFIG_ENV_VAR, CONFIG_FILENAME


def packaged_config_path() -> Path:
    """The models.toml shipped inside the package (the last resort of the search)."""
    return Path(__file__).parent.parent / CONFIG_FILENAME  # package data


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

