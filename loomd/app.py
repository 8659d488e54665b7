"""The aiohttp application factory: typed app keys, one error middleware, every route.

`make_app(registry, settings)` is all a listener needs; tests build the same app. Routes
live in `loomd/routes/`, one module per spec section, each exposing `add_routes(add)`.
Every route is registered through `add`, which gives it the `Expect` rejection of
`framing.reject_expect`; a catch-all route answers unknown paths (404) and wrong methods
(405) in the same JSON shape, so no request ever reaches aiohttp's own error pages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from loomd.errors import error_response, loom_error_response, unexpected_error_response
from loomd.framing import Deadlines, reject_expect
from loomd.logz import RETAINED, Journal
from loomd.metrics import Metrics
from loomrt.errors import LoomError
from loomrt.registry import Registry

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_REQUEST_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_CONNECTIONS = 256
# Slow and stalled peers (docs/operations.md "Slow and stalled clients"; loomd/framing.py).
DEFAULT_HEADER_TIMEOUT_S = 15.0       # request line and headers, from open or a request's first byte
DEFAULT_BODY_TIMEOUT_S = 30.0         # a body with no new bytes for this long is cut
DEFAULT_KEEPALIVE_TIMEOUT_S = 30.0    # an idle kept-alive connection is closed
DEFAULT_WRITE_STALL_TIMEOUT_S = 60.0  # a response the peer does not read for this long is aborted
DEFAULT_READING_CONNECTIONS = 64      # connections still reading a request (header or body)


@dataclass
class Settings:
    request_body_bytes: int = DEFAULT_REQUEST_BODY_BYTES
    connections: int = DEFAULT_CONNECTIONS
    log_retention: int = RETAINED        # /logz journal entries kept
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT_S
    write_stall_timeout: float = DEFAULT_WRITE_STALL_TIMEOUT_S
    reading_connections: int = DEFAULT_READING_CONNECTIONS
    started: float = field(default_factory=time.time)
    stopping: bool = False

    def deadlines(self) -> Deadlines:
        """The connection deadlines and reading bound `JsonErrorRunner` enforces for these settings."""
        return Deadlines(header_timeout=self.header_timeout, body_timeout=self.body_timeout,
                         keepalive_timeout=self.keepalive_timeout, write_stall_timeout=self.write_stall_timeout,
                         max_reading=min(self.reading_connections, self.connections))


REGISTRY = web.AppKey("registry", Registry)
SETTINGS = web.AppKey("settings", Settings)
JOURNAL = web.AppKey("journal", Journal)
METRICS = web.AppKey("metrics", Metrics)


SENT_STATUS = web.RequestKey("sent_status", int)   # the status of a response already prepared
CLIENT_CLOSED = 499


async def _remember_status(request: web.Request, response: web.StreamResponse) -> None:
    request[SENT_STATUS] = response.status


def _route_name(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return canonical if canonical and not canonical.startswith("/{tail") else "unmatched"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place errors become responses; also counts every request by route and status."""
    try:
        response = await handler(request)
    except LoomError as exc:
        response = loom_error_response(exc)
        if exc.status in (413,):
            response.force_close()
    except web.HTTPException as exc:  # aiohttp raised one of its own (never ours): same JSON shape
        response = error_response(exc.status, exc.reason or "error")
    except asyncio.CancelledError:
        # The client left and its handler was cancelled: count the response it already had
        # (a stream's 200), or 499 (nginx's "client closed request") when none was sent.
        request.app[METRICS].request(_route_name(request), request.get(SENT_STATUS, CLIENT_CLOSED))
        raise
    except Exception as exc:
        response = unexpected_error_response(exc)
    request.app[METRICS].request(_route_name(request), response.status)
    return response


async def _counted_reject_expect(request: web.Request) -> web.StreamResponse | None:
    """`reject_expect`, counted: aiohttp runs expect handlers before any middleware."""
    response = await reject_expect(request)
    request.app[METRICS].request(_route_name(request), response.status)
    return response


async def _unmatched(request: web.Request) -> web.StreamResponse:
    allowed = [r.method for r in request.app.router.routes()
               if r.resource is not None and r.resource.canonical == request.path and r.method != "*"]
    if allowed:
        response = error_response(405, f"{request.method} is not allowed on {request.path} "
                                       f"(allowed: {', '.join(sorted(set(allowed)))})")
        response.headers["Allow"] = ", ".join(sorted(set(allowed)))
        return response
    return error_response(404, f"no route {request.method} {request.path}")


def route_modules() -> list:
    """Every module of `loomd.routes` (one per spec section), in name order."""
    import importlib
    import pkgutil

    import loomd.routes

    return [importlib.import_module(f"loomd.routes.{m.name}")
            for m in sorted(pkgutil.iter_modules(loomd.routes.__path__), key=lambda m: m.name)]


def make_app(registry: Registry, settings: Settings | None = None) -> web.Application:
    settings = settings or Settings()
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.request_body_bytes)
    app[REGISTRY] = registry
    app[SETTINGS] = settings
    app[JOURNAL] = Journal(settings.log_retention)
    app[METRICS] = Metrics(registry)
    app.on_response_prepare.append(_remember_status)
    registry.listeners.append(app[JOURNAL].publish_threadsafe)

    def add(method: str, path: str, handler: Handler) -> None:
        app.router.add_route(method, path, handler, expect_handler=_counted_reject_expect)

    for module in route_modules():
        module.add_routes(add)
    app.router.add_route("*", "/{tail:.*}", _unmatched, expect_handler=_counted_reject_expect)

    async def bind_loop(app: web.Application) -> None:
        app[JOURNAL].bind(asyncio.get_running_loop())

    app.on_startup.append(bind_loop)
    return app


async def start_listeners(app: web.Application, settings: Settings, listen: list[tuple[str, str | int]]):
    """Serve `app` on each (host, port) or ("unix", path) through loomd's HTTP adapter (its
    deadlines and connection bounds); returns the runner, whose `addresses` are the bound ones
    and whose `cleanup()` stops them. `loomd serve` and each scale-out replica start here."""
    from loomd.framing import JsonErrorRunner

    runner = JsonErrorRunner(app, handle_signals=False, access_log=None, max_connections=settings.connections,
                             deadlines=settings.deadlines(), handler_cancellation=True)
    await runner.setup()
    for host, port in listen:
        site = web.UnixSite(runner, port) if host == "unix" else web.TCPSite(runner, host, port)
        await site.start()
    return runner


__all__ = ["JOURNAL", "METRICS", "REGISTRY", "SETTINGS", "Settings", "make_app", "start_listeners"]
