"""``hf`` sources: a file (or the first match of a glob) of a Hugging Face repository.

Taken from the standard Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
else ``~/.cache/huggingface/hub``) when it is there, else downloaded into that cache
with ``huggingface_hub.hf_hub_download`` (which draws its own progress bar on stderr).
A split GGUF (``NAME-00001-of-0000N.gguf``) resolves to its first part, with all parts
fetched into the same snapshot directory (llama.cpp loads the rest from there). With
``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, a model that is not cached is
a :class:`ModelLoadError` naming the command that fetches it: the caller's (``fetch``:
``specllama pull NAME``), else the exact ``hf download`` command.

The cache is read directly (its layout, ``models--OWNER--REPO/refs/<rev>`` holding a
commit hash and ``snapshots/<commit>/<file>``, is huggingface_hub's documented format),
with the cache directory taken from the environment at call time: so a cached model
needs neither the network nor even ``huggingface_hub``, and the status of a pair never
touches the network. Only downloading imports ``huggingface_hub``, lazily.

This module is the entry point; the work is in three modules of one job each:

- :mod:`.hfcache`: what the cache already holds (disk only, no network, no import);
- :mod:`.hfdownload`: downloading what it lacks (network, huggingface_hub, progress);
- :mod:`.hferrors`: what a failure says, and the command it names to fix it.
"""

from __future__ import annotations

from .hfcache import HfCached, hf_cache_dir, hf_lookup
from .hfdownload import HF_OFFLINE_ENV_VARS, Progress, hf_offline, hub_installed, resolve_hf
from .hferrors import HUB_INSTALL_HINT, hf_cli

__all__ = [
    "HF_OFFLINE_ENV_VARS",
    "HUB_INSTALL_HINT",
    "HfCached",
    "Progress",
    "hf_cache_dir",
    "hf_cli",
    "hf_lookup",
    "hf_offline",
    "hub_installed",
    "resolve_hf",
]
