"""`specllama serve`: the speculative pair behind OpenAI's and Anthropic's HTTP APIs.

One path per request: app (the route table) -> guard (the browser boundary, the limit
on requests in progress) -> serving (the one route body every API shares: the key, the
body, the API's parse from apis/, the model, a place in the queue, prompts, the job) ->
worker (a thread per slot, a bounded FIFO queue, restarts) -> jobs (an Order on a Slot,
in an engine process that may die: isolation) -> the API's answer (apis/, answer.py),
streamed as server-sent events or whole. errors.py answers every failure on the way,
in the asking API's shape; runner.py runs it all under uvicorn, with signals.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ServeConfig
    from .isolation import EngineLost, EngineProcess
    from .jobs import Slot
    from .prompts import Defaults
    from .runner import ServeError, is_loopback, listen, serve
    from .slots import Slots
    from .state import Totals

# Each name loads its module when first read: the engine process (server.child) and the
# chat REPL (server.isolation) import this package without its HTTP layers (uvicorn,
# starlette, every API's models: ~0.3 s a process start on a 2-core AMD EPYC).
_HOME = {"ServeConfig": "config", "EngineLost": "isolation", "EngineProcess": "isolation",
         "Slot": "jobs", "Defaults": "prompts", "ServeError": "runner",
         "is_loopback": "runner", "listen": "runner", "serve": "runner", "Slots": "slots",
         "Totals": "state"}

__all__ = ["Defaults", "Slot", "EngineLost", "EngineProcess", "ServeConfig", "ServeError",
           "Slots", "Totals", "is_loopback", "listen", "serve"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
