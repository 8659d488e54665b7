"""The status page: `GET /ui` and its static files (docs/operations.md "Status page").

Plain HTML, CSS and JavaScript shipped in `loomd/ui/` (package data): no build step and nothing
fetched from outside. The page reads the same JSON endpoints any client can (`/v1/status`,
`/v1/models`, `/v1/requests`, `/logz/stream`), so it needs no route of its own beyond these files.
`/` stays 404: the catalog of paths is the spec's, and this page is an extra.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

#: name -> content type; the only files served (no directory walk, no user-chosen path).
FILES = {"index.html": "text/html", "status.js": "text/javascript", "status.css": "text/css"}


def _asset(name: str) -> bytes:
    return resources.files("loomd").joinpath("ui", name).read_bytes()


def _serve(name: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        # Read per request: a few KB, and an edited page shows on reload without a restart.
        return web.Response(body=_asset(name), content_type=FILES[name], charset="utf-8",
                            headers={"Cache-Control": "no-cache",
                                     "Content-Security-Policy": "default-src 'self'; connect-src 'self'"})
    return handler


def add_routes(add) -> None:
    add("GET", "/ui", _serve("index.html"))
    add("GET", "/ui/status.js", _serve("status.js"))
    add("GET", "/ui/status.css", _serve("status.css"))
