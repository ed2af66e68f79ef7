"""`specllama serve`: the speculative pair behind an OpenAI-compatible HTTP API.

schema (request bodies, OpenAI-shaped errors) -> prompts (request -> tokens and
settings) -> jobs (one request on the decoder) -> isolation (the decoder in an engine
process that may die) -> worker (one thread, a bounded FIFO queue, restarts) ->
responses (OpenAI's bodies plus the `speculative` figures) -> app (starlette routes,
SSE) -> runner (uvicorn, signals).
"""

from .app import ServeConfig
from .isolation import EngineLost, EngineProcess
from .jobs import Slot
from .prompts import Defaults
from .runner import ServeError, is_loopback, listen, serve
from .slots import Slots
from .worker import Totals

__all__ = ["Defaults", "Slot", "EngineLost", "EngineProcess", "ServeConfig", "ServeError",
           "Slots", "Totals", "is_loopback", "listen", "serve"]
