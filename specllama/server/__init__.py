"""`specllama serve`: the speculative pair behind an OpenAI-compatible HTTP API.

schema (request bodies, OpenAI-shaped errors) -> prompts (request -> tokens and
settings) -> worker (one thread, a bounded FIFO queue, the decoder) -> responses
(OpenAI's bodies plus the `speculative` figures) -> app (starlette routes, SSE) ->
runner (uvicorn, signals).
"""

from .app import ServeConfig
from .prompts import Defaults
from .runner import ServeError, is_loopback, listen, serve
from .worker import Totals

__all__ = ["Defaults", "ServeConfig", "ServeError", "Totals", "is_loopback", "listen", "serve"]
