"""Where specllama keeps files of its own: the user cache (derived drafts, decode costs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "specllama"
CACHE_ENV_VAR = "SPECLLAMA_CACHE_DIR"


def cache_dir() -> Path:
    """Cache root: ``$SPECLLAMA_CACHE_DIR`` if set, else the platform user cache dir."""
    override = os.environ.get(CACHE_ENV_VAR, "")
    if override:
        return Path(os.path.abspath(os.path.expanduser(override)))
    return Path(platformdirs.user_cache_dir(APP_NAME))
