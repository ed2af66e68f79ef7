"""The live chat page, GET /: plain files shipped in the package (page/), no build step,
nothing fetched from elsewhere (its Content-Security-Policy allows this server alone).

It chats through the round-event stream (POST /v1/rounds, apis/roundstream.py) and shows each
round as the seed article's picture does. The files need no key (they hold nothing of
the server's); the page asks for one when /v1/models answers 401, and keeps it in
sessionStorage only.
"""

from __future__ import annotations

from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: The page's files, and what each is served as.
FILES = {"index.html": "text/html; charset=utf-8", "page.css": "text/css; charset=utf-8",
         "page.js": "text/javascript; charset=utf-8"}

# This server alone, for everything: a page that cannot reach elsewhere leaks nothing,
# and an inline script someone slipped into a reply's text would not run.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def page_routes() -> list[Route]:
    """GET / and its files (the turns go to POST /v1/rounds, served as every API is)."""
    return [
        Route("/", _file, methods=["GET"]),
        Route("/page/{name}", _file, methods=["GET"]),
    ]


async def _file(request: Request) -> Response:
    name = request.path_params.get("name", "index.html")
    if name not in FILES:
        raise HTTPException(404)  # app.py's JSON answer
    body = resources.files("specllama.server").joinpath(f"page/{name}").read_bytes()
    return Response(body, media_type=FILES[name], headers=_HEADERS)
