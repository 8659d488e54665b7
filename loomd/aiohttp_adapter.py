"""The one place loomd relies on aiohttp beyond its documented API, and the aiohttp range it was tested on.

`loomd/framing.py` says *what* happens below the application (JSON error bodies, the connection
bound, the truncated-body answer); this module is how that gets into aiohttp's protocol layer.
On an aiohttp upgrade, check the names below against the new aiohttp source, run
`tests/unit/loomd/test_aiohttp_adapter.py` (one test per mechanism) and
`tests/conformance/test_framing.py`, then widen `AIOHTTP_SUPPORTED` and the `aiohttp` line of
pyproject.toml together (a test keeps them equal).

Private aiohttp names (underscored), each the only way found to keep a tested behaviour:

- `web.AppRunner._make_server()`, overridden (it calls the original): the abstract hook every
  `BaseRunner` implements to build its `web.Server`, and the only point where a runner can
  serve an Application through a `web.Server` subclass. AppRunner builds the Application's
  Server from the Application's private `_handle` and `_make_request`; we let it, then build
  our subclass from the public attributes of the result. (`web.ServerRunner` with our own
  Server would need `Application._handle`, `._make_request` and `._set_loop` instead; the
  former `server.__class__` swap is gone.)
- `web.Server._kwargs`, read once in `_make_server`: the protocol keyword arguments AppRunner
  and the Application put together (`access_log`, `debug`, `access_log_class`, the app's
  `handler_args`, ...), so our protocol is built with exactly what aiohttp's would have.
- `web.RequestHandler._messages`, read only, in `eof_received`: the `(message, payload)`
  pairs aiohttp parsed but has not started yet (pipelined requests). After a half-close, a
  queued request whose body was cut short must still get its 400, so its body decides whether
  the connection stays open. (The body of the request in progress is learned through the
  public request factory instead of the private `_current_request`.)

Un-underscored but undocumented aiohttp names this module relies on (aiohttp exports them):

- `web.RequestHandler(server, loop=..., **kwargs)`, subclassed as every connection's protocol
  and built the way `web.Server.__call__` builds it; it overrides
  - `handle_error(request, status, exc, message)`: the errors aiohttp's parser raises below
    the application (malformed request line, headers, chunk framing) are rendered there as
    text/plain or HTML; no middleware or signal sees those requests;
  - `finish_response(request, resp, start_time)`: after a response that ends the connection
    while the body is unread or broken (413, 417, a truncated body) it calls `force_close()`,
    so aiohttp does not linger reading the body for up to `lingering_time` (10 s, holding a
    `--connections` slot and logging a broken body as "Unhandled exception"). The documented
    `lingering_time=0` would also close after keep-alive answers to a body still in flight
    (a 404 to a large POST), turning their graceful end into a reset;
  - asyncio's `connection_made` (the `--connections` bound: over it, the connection gets the
    503 and is closed before aiohttp registers it), `connection_lost` and `eof_received` (a
    half-close with every body complete is a client that left: close, and the handler is
    cancelled; with a body cut short, fail that body and keep our side open to answer 400).
- `web.Server`'s `request_handler`, `request_factory`, `handler_cancellation` and
  `connections` attributes, and the request factory's call
  `(message, payload, protocol, writer, task)`.
- `StreamReader.set_exception()` (with the documented `is_eof()` and `exception()`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

#: The aiohttp releases loomd is tested with: at least the first (major, minor), below the
#: second. pyproject.toml pins the same range (`AIOHTTP_REQUIREMENT`); `loomd serve` and
#: `AdapterRunner` refuse any other version.
AIOHTTP_SUPPORTED: tuple[tuple[int, int], tuple[int, int]] = ((3, 14), (3, 15))

#: The same range as a PEP 508 requirement, as pyproject.toml writes it.
AIOHTTP_REQUIREMENT = "aiohttp>={}.{},<{}.{}".format(*AIOHTTP_SUPPORTED[0], *AIOHTTP_SUPPORTED[1])


def check_aiohttp_version(version: str | None = None) -> None:
    """Raise RuntimeError, naming both versions, unless `version` (default: the imported
    aiohttp's) is inside `AIOHTTP_SUPPORTED`."""
    installed = aiohttp.__version__ if version is None else version
    low, high = AIOHTTP_SUPPORTED
    match = re.match(r"(\d+)\.(\d+)", installed)
    if match is None or not low <= (int(match[1]), int(match[2])) < high:
        raise RuntimeError(
            f"aiohttp {installed} is installed, but loomd supports only {AIOHTTP_REQUIREMENT} "
            f"(its HTTP layer, loomd/aiohttp_adapter.py, relies on aiohttp internals tested on that range); "
            f"install a supported version: pip install '{AIOHTTP_REQUIREMENT}'")


#: Renders an error aiohttp detected below the application: (status, text) -> response.
ErrorRenderer = Callable[[int, str], web.StreamResponse]


class AdapterProtocol(web.RequestHandler):
    """The protocol of one connection (see the module docstring for what it overrides and why)."""

    def __init__(self, server: AdapterServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        # our own references: aiohttp's `_manager` is private and cleared on connection_lost
        self._loom_server = server
        self._loom_payload: aiohttp.StreamReader | None = None  # body of the latest request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._loom_server
        if len(server.connections) >= server.max_connections:
            transport.write(server.refusal)  # type: ignore[attr-defined]
            transport.close()
            return  # aiohttp never registers this connection
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._loom_payload = None

    def eof_received(self) -> bool | None:
        """The client closed its side. With every request body complete (or the connection
        idle) that means it left, as uvicorn and aiohttp's own handler take it: returning None
        closes the transport and the handler is cancelled, so a generation nobody waits for
        stops at its next step. A body cut short keeps our side open to answer it with a 400."""
        payloads = [payload for _, payload in self._messages]
        if self._loom_payload is not None:
            payloads.append(self._loom_payload)
        incomplete = [payload for payload in payloads if not payload.is_eof()]
        if not incomplete:
            return None
        for payload in incomplete:
            payload.set_exception(ConnectionResetError("the client ended the connection before the body was complete"))
        return True

    def request_created(self, payload: aiohttp.StreamReader) -> None:
        self._loom_payload = payload

    async def finish_response(self, request, resp, start_time):  # type: ignore[no-untyped-def]
        """Write the response; if it ends the connection while the request body is unread or
        broken, close as soon as it is written instead of lingering (module docstring)."""
        result = await super().finish_response(request, resp, start_time)
        body = request.content
        if not body.is_eof() and (not resp.keep_alive or body.exception() is not None):
            self.force_close()  # the transport flushes the written response, then closes
        return result

    def handle_error(self, request, status=500, exc=None, message=None):  # type: ignore[no-untyped-def]
        """The response to an error aiohttp caught below the application: the parser's (4xx,
        answered without logging a traceback) or an exception no middleware handled (5xx,
        logged by aiohttp as before). Rendered by the server's `render_error`; the
        connection closes after it, as aiohttp's own error pages do."""
        text = str(getattr(exc, "message", None) or message or exc or "bad request")
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs; raises if a response began
        response = self._loom_server.render_error(status, text)
        response.force_close()
        return response


class AdapterServer(web.Server):
    """`web.Server` whose connections use `AdapterProtocol`, bounded to `max_connections` open
    connections (one over it is sent the raw HTTP response `refusal` and closed)."""

    def __init__(self, handler: Any, *, max_connections: int, refusal: bytes, render_error: ErrorRenderer,
                 request_factory: Any = None, handler_cancellation: bool = False,
                 loop: asyncio.AbstractEventLoop | None = None, **protocol_kwargs: Any) -> None:
        super().__init__(handler, request_factory=request_factory, handler_cancellation=handler_cancellation,
                         loop=loop, **protocol_kwargs)
        self._loom_loop = loop or asyncio.get_running_loop()
        self._loom_protocol_kwargs = protocol_kwargs
        self.max_connections = max_connections
        self.refusal = refusal
        self.render_error = render_error
        make_request = self.request_factory

        def tracked_request_factory(message, payload, protocol, *args: Any, **kw: Any):  # type: ignore[no-untyped-def]
            request = make_request(message, payload, protocol, *args, **kw)
            if isinstance(protocol, AdapterProtocol):
                protocol.request_created(payload)
            return request

        self.request_factory = tracked_request_factory

    def __call__(self) -> AdapterProtocol:
        return AdapterProtocol(self, loop=self._loom_loop, **self._loom_protocol_kwargs)


class AdapterRunner(web.AppRunner):
    """`web.AppRunner` serving through `AdapterServer`. Refuses an aiohttp outside
    `AIOHTTP_SUPPORTED` when constructed."""

    def __init__(self, app: web.Application, *, max_connections: int, refusal: bytes, render_error: ErrorRenderer,
                 **kwargs: Any) -> None:
        check_aiohttp_version()
        super().__init__(app, **kwargs)
        self._loom_server_options = {"max_connections": max_connections, "refusal": refusal,
                                     "render_error": render_error}

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # the Application's own web.Server, never started
        return AdapterServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation, **self._loom_server_options,
                             **server._kwargs)


__all__ = ["AIOHTTP_REQUIREMENT", "AIOHTTP_SUPPORTED", "AdapterProtocol", "AdapterRunner", "AdapterServer",
           "ErrorRenderer", "check_aiohttp_version"]
