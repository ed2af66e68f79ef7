"""Who may ask and for what: the API key, and the one model this server serves."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .apierror import APIError


def authorize(request: Request, key: str | None) -> None:
    """An APIError 401 unless the request carries `key` (none: anyone may ask)."""
    if key is None:
        return
    # OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`.
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    sent = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
    # compare_digest: the time taken says nothing of how much of the key was right
    if not sent or not hmac.compare_digest(sent.encode(), key.encode()):
        raise APIError(
            401,
            "missing or wrong API key: send the header 'Authorization: Bearer KEY' "
            "(or 'x-api-key: KEY') with the key the server was started with (--api-key)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def check_model(model: str, served: str) -> None:
    """An APIError 404 unless `model` names the pair served (its name in models.toml)."""
    if model != served:
        raise APIError(404, f"the model {model!r} does not exist here; this server serves "
                       f"{served!r}", param="model", code="model_not_found")
