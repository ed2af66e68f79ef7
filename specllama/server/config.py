"""What `specllama serve` was started with, as the routes read it."""

from __future__ import annotations

from dataclasses import dataclass

from .. import Drafters
from .prompts import Defaults

# Seconds a request in progress may take to finish once the server is told to stop.
GRACE_S = 30
# Seconds a client may take to send a request's body. Past it the request is answered
# 408 and its place freed: a few slow uploads must not hold every place of the limit.
BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeConfig:
    model_id: str  # the pair's name; what clients send as `model`
    defaults: Defaults
    draft_max: int | str
    drafters: Drafters
    n_ctx: int  # the context window the engine was loaded with
    api_key: str | None = None
    max_waiting: int = 8  # requests queued behind those being served; more get 503
    parallel: int = 1  # requests served at once
    target: str = ""  # file names, shown by /v1/models
    draft: str = ""
    host: str = "127.0.0.1"  # the address bound (--host): a Host header may name it
    allowed_origins: tuple[str, ...] = ()  # web origins besides this server's (guard.py)
    body_timeout_s: float = BODY_TIMEOUT_S

    @property
    def limit_concurrency(self) -> int:
        """Requests in progress at once (guard.Limit); more get a JSON 503 before any
        work. Room for those served and waiting, plus kept-alive and refused ones."""
        return self.parallel + self.max_waiting + 32
