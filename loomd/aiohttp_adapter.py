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
  the connection stays open, and a queued parser error (aiohttp queues it as a message that
  is not a `RawRequestMessage`) must still get its 400 before the connection closes. (The
  body of the request in progress is learned through the public request factory instead of
  the private `_current_request`.)

Un-underscored but undocumented aiohttp names this module relies on (aiohttp exports them):

- `web.RequestHandler(server, loop=..., **kwargs)`, subclassed as every connection's protocol
  and built the way `web.Server.__call__` builds it; it overrides
  - `handle_error(request, status, exc, message)`: the errors aiohttp's parser raises below
    the application (malformed request line, headers, chunk framing) are rendered there as
    text/plain or HTML; no middleware or signal sees those requests;
  - `finish_response(request, resp, start_time)` (also where a connection's handler is known
    to be done, for the deadlines' phases): after a response that ends the connection
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
  `connections` attributes (the registered connections, scanned for the bounds), and the
  request factory's call `(message, payload, protocol, writer, task)` (where a handler starts).
- `web.Server`'s request handler (the Application's `_handle`), wrapped: a request whose
  target is not a path (CONNECT's authority form `host:port`, the asterisk form `OPTIONS *`)
  matches no route, so aiohttp's router gives it its own 404 route, whose expect handler sends
  `100 Continue` before the 404. The wrapper answers such a request that carries `Expect` with
  `reject_expect` below the application instead (counted like the other answers made below
  it); every other request reaches the Application untouched.
- asyncio's `Transport.is_reading()` (public asyncio API, on aiohttp's transport): a body
  deadline does not count time during which aiohttp paused reading.
- `StreamReader.set_exception()` (with the documented `is_eof()` and `exception()`).
- `aiohttp.web_protocol.ERROR`, the request message aiohttp's parser errors are handled
  under (an HTTP/1.0 `RawRequestMessage`, so their responses would say `HTTP/1.0`): the
  request factory gives those requests the same message as HTTP/1.1 (`NamedTuple._replace`).
- `RequestHandler.data_received`, overridden (it calls the original) to follow each
  connection's phase for the deadlines (`Deadlines`): a request message is complete when
  aiohttp appends it to `_messages` (read only: its length and its last payload), its body
  when that payload `is_eof()`.
- asyncio's `pause_writing`/`resume_writing` (aiohttp's `BaseProtocol` implements them; we
  call the originals): the write-stall deadline runs while the transport's buffer is over
  its high-water mark.

Deadlines and the connection bound (`Deadlines`, `AdapterServer`). Each connection is in one
phase: `new` (open, nothing received yet) and then `header` (until its request line and
headers are complete; `header_timeout` from the open, or from the first byte of a later
request on a kept-alive connection, absolute), `body` (a declared body not yet complete:
`body_timeout` since the last bytes arrived, not counted while the transport is paused
because the server is not reading), `busy` (a handler runs or a request waits for one: no
read deadline) or `idle` (kept alive between requests: `keepalive_timeout`). A deadline that
passes closes the connection without a response (the peer stopped sending, and a handler may
already have started one). While the transport cannot take more output,
`write_stall_timeout` runs; when it passes the connection is aborted (a reader that stopped
reading gets no graceful close, which would wait for it).
Connections in the `header`/`body` phases (they sent part of a request) are bounded by
`max_reading`; over it the one whose last progress is oldest is closed. A `new` connection is
not counted there: a burst of connections whose requests have not been read yet is not a
stall. A new connection over `max_connections` closes the reading connection with the oldest
progress, else the longest-idle kept-alive one, else one that has sent nothing for
`SILENT_AFTER_S`; only when every connection has a handler running (or has just opened) does
it get the `refusal` (503).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.web_protocol import ERROR as PARSER_ERROR_MESSAGE

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
ExpectRefusal = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

READING = ("header", "body")
#: A connection that has sent nothing may be closed to make room once it has been open this long
#: (a client sends its request as soon as it connects; a burst of new connections is not stalled).
SILENT_AFTER_S = 1.0


@dataclass(frozen=True)
class Deadlines:
    """Seconds each phase of a connection may last without progress (module docstring); 0 turns
    one off. `max_reading` bounds the connections in the header/body phases; a connection that
    has sent nothing may make room for a new one after `silent_after`."""
    header_timeout: float = 0.0
    body_timeout: float = 0.0
    keepalive_timeout: float = 0.0
    write_stall_timeout: float = 0.0
    max_reading: int = 1 << 30
    silent_after: float = SILENT_AFTER_S


class AdapterProtocol(web.RequestHandler):
    """The protocol of one connection (see the module docstring for what it overrides and why)."""

    def __init__(self, server: AdapterServer, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        # our own references: aiohttp's `_manager` is private and cleared on connection_lost
        self._loom_server = server
        self._loom_payload: aiohttp.StreamReader | None = None  # body of the latest request
        self._loom_phase = "new"          # new, header, body, busy, idle, closed (module docstring)
        self._loom_progress = 0.0         # loop time of the phase's start or the body's last bytes
        self._loom_timer: asyncio.TimerHandle | None = None
        self._loom_write_timer: asyncio.TimerHandle | None = None
        self._loom_handling = False       # a request handler runs for this connection
        self._loom_refusing = False       # ... and it answers the parser's error (refused request)
        self._loom_body: aiohttp.StreamReader | None = None  # the body the body phase waits for

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._loom_server
        if server.open_count() >= server.max_connections and not server.make_room(self):
            transport.write(server.refusal)  # type: ignore[attr-defined]
            transport.close()
            self._loom_phase = "closed"
            return  # aiohttp never registers this connection
        super().connection_made(transport)
        self._loom_enter("new", server.deadlines.header_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._loom_phase = "closed"
        self._loom_cancel_timers()
        super().connection_lost(exc)
        self._loom_payload = None
        self._loom_body = None

    # ---- phases and deadlines

    def _loom_cancel_timers(self) -> None:
        for timer in (self._loom_timer, self._loom_write_timer):
            if timer is not None:
                timer.cancel()
        self._loom_timer = self._loom_write_timer = None

    def _loom_enter(self, phase: str, timeout: float, *, keep_deadline: bool = False) -> None:
        """Start `phase` now, with a deadline `timeout` seconds away (none if 0), or under the
        deadline already running (`keep_deadline`). Entering a phase always ends the previous
        phase's deadline otherwise, so a deadline that fires is the current phase's."""
        was_reading = self._loom_phase in READING
        self._loom_phase = phase
        self._loom_progress = self._loop.time()
        if not keep_deadline:
            if self._loom_timer is not None:
                self._loom_timer.cancel()
                self._loom_timer = None
            if timeout > 0:
                self._loom_timer = self._loop.call_later(timeout, self._loom_expired)
        if phase in READING and not was_reading:
            self._loom_server.bound_reading(self)

    def _loom_expired(self) -> None:
        self._loom_timer = None
        phase = self._loom_phase
        if phase == "closed" or self.transport is None:
            return
        if phase == "body":
            idle_for = self._loop.time() - self._loom_progress
            timeout = self._loom_server.deadlines.body_timeout
            reading = getattr(self.transport, "is_reading", lambda: True)()
            if not reading or idle_for < timeout:  # the server paused reading, or progress since
                self._loom_timer = self._loop.call_later(max(timeout - idle_for, 0.0) if reading else timeout,
                                                         self._loom_expired)
                if not reading:
                    self._loom_progress = self._loop.time()
                return
        self.loom_close()

    def loom_close(self) -> None:
        """Close this connection now, without a response (a deadline passed, or room was made)."""
        self._loom_phase = "closed"
        self._loom_cancel_timers()
        self.force_close()

    def _loom_settled(self) -> None:
        """Nothing left to read for now: `busy` while a handler runs or a request waits, else `idle`."""
        if self._loom_handling or self._messages:
            self._loom_enter("busy", 0.0)
        else:
            self._loom_enter("idle", self._loom_server.deadlines.keepalive_timeout)

    def data_received(self, data: bytes) -> None:
        if data and self._loom_phase == "new":  # its header deadline runs from the open
            self._loom_enter("header", 0.0, keep_deadline=True)
        elif data and (self._loom_phase == "idle"
                       or (self._loom_phase == "busy" and not self._loom_handling and not self._messages)):
            self._loom_enter("header", self._loom_server.deadlines.header_timeout)
        queued = len(self._messages)
        super().data_received(data)
        if self._loom_phase == "closed" or self.transport is None:
            return
        body = self._loom_payload
        if len(self._messages) > queued and self._loom_error_queued() and body is not None and not body.is_eof():
            # the framing broke inside the body a handler is reading: that request is the 400
            body.set_exception(ConnectionResetError("the request body's chunk framing is malformed"))
        if len(self._messages) > queued:  # a request message is complete: its body decides
            payload = self._messages[-1][1]
            if payload.is_eof():
                self._loom_body = None
                self._loom_settled()
            else:
                self._loom_body = payload
                self._loom_enter("body", self._loom_server.deadlines.body_timeout)
        elif self._loom_phase == "body" and data:
            if self._loom_body is None or self._loom_body.is_eof():
                self._loom_body = None
                self._loom_settled()
            else:
                self._loom_progress = self._loop.time()  # the timer re-arms itself from here

    def pause_writing(self) -> None:
        super().pause_writing()
        timeout = self._loom_server.deadlines.write_stall_timeout
        if timeout > 0 and self._loom_write_timer is None:
            self._loom_write_timer = self._loop.call_later(timeout, self._loom_write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._loom_write_timer is not None:
            self._loom_write_timer.cancel()
            self._loom_write_timer = None

    def _loom_write_stalled(self) -> None:
        """The peer took none of our output for `write_stall_timeout`: abort (a graceful close
        would wait for the buffered output it does not read)."""
        self._loom_write_timer = None
        transport = self.transport
        if transport is not None:
            self._loom_phase = "closed"
            self._loom_cancel_timers()
            transport.abort()

    def eof_received(self) -> bool | None:
        """The client closed its side. With every request body complete (or the connection
        idle) that means it left, as uvicorn and aiohttp's own handler take it: returning None
        closes the transport and the handler is cancelled, so a generation nobody waits for
        stops at its next step. A body cut short, or a request the parser refused and that is
        not answered yet, keeps our side open to answer it with a 400."""
        payloads = [payload for _, payload in self._messages]
        if self._loom_payload is not None:
            payloads.append(self._loom_payload)
        incomplete = [payload for payload in payloads if not payload.is_eof()]
        for payload in incomplete:  # a handler waiting for the rest of its body gets its 400 now
            payload.set_exception(ConnectionResetError("the client ended the connection before the body was complete"))
        if incomplete or self._loom_refusing or self._loom_error_queued():
            return True  # answer them; the parser's error closes the connection after it (handle_error)
        return None

    def _loom_error_queued(self) -> bool:
        """The parser refused something it has not answered yet (queued as a message that is
        not a `RawRequestMessage`)."""
        return any(not isinstance(message, RawRequestMessage) for message, _ in self._messages)

    def request_created(self, payload: aiohttp.StreamReader, *, refused: bool = False) -> None:
        """A request starts; `refused` when it is the parser's error, answered below the app."""
        self._loom_payload = payload
        self._loom_refusing = refused
        self._loom_handling = True
        if self._loom_phase == "idle":
            self._loom_enter("busy", 0.0)

    async def finish_response(self, request, resp, start_time):  # type: ignore[no-untyped-def]
        """Write the response; if it ends the connection while the request body is unread or
        broken, close as soon as it is written instead of lingering (module docstring)."""
        try:
            result = await super().finish_response(request, resp, start_time)
        finally:
            self._loom_handling = self._loom_refusing = False
        body = request.content
        if not body.is_eof() and (not resp.keep_alive or body.exception() is not None):
            self.force_close()  # the transport flushes the written response, then closes
        elif self._loom_phase == "busy":
            self._loom_settled()
        return result

    def handle_error(self, request, status=500, exc=None, message=None):  # type: ignore[no-untyped-def]
        """The response to an error aiohttp caught below the application: the parser's (4xx,
        answered without logging a traceback) or an exception no middleware handled (5xx,
        logged by aiohttp as before). Rendered by the server's `render_error`; the
        connection closes after it, as aiohttp's own error pages do."""
        text = str(getattr(exc, "message", None) or message or exc or "bad request")
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs; raises if a response began
        self._loom_server.count(status)
        response = self._loom_server.render_error(status, text)
        response.force_close()
        return response


#: Counts a response made below the application (a parser error, a refusal) by its status.
BelowAppCounter = Callable[[int], None]


def _no_count(status: int) -> None:
    pass


class AdapterServer(web.Server):
    """`web.Server` whose connections use `AdapterProtocol`, bounded to `max_connections` open
    connections and `deadlines.max_reading` connections still reading a request (module
    docstring); a connection that finds no room is sent the raw HTTP response `refusal` and
    closed. `count` is told the status of every response made below the application.
    `reject_expect` answers a request with `Expect` whose target is not a path (module docstring)."""

    def __init__(self, handler: Any, *, max_connections: int, refusal: bytes, render_error: ErrorRenderer,
                 reject_expect: ExpectRefusal, deadlines: Deadlines | None = None,
                 count: BelowAppCounter = _no_count, request_factory: Any = None, handler_cancellation: bool = False,
                 loop: asyncio.AbstractEventLoop | None = None, **protocol_kwargs: Any) -> None:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            if "Expect" in request.headers and not request.rel_url.path.startswith("/"):
                response = await reject_expect(request)
                self.count(response.status)
                return response
            return await handler(request)

        super().__init__(handle, request_factory=request_factory, handler_cancellation=handler_cancellation,
                         loop=loop, **protocol_kwargs)
        self._loom_loop = loop or asyncio.get_running_loop()
        self._loom_protocol_kwargs = protocol_kwargs
        self.max_connections = max_connections
        self.refusal = refusal
        self.render_error = render_error
        self.deadlines = deadlines or Deadlines()
        self.count = count
        make_request = self.request_factory

        def tracked_request_factory(message, payload, protocol, *args: Any, **kw: Any):  # type: ignore[no-untyped-def]
            refused = message is PARSER_ERROR_MESSAGE
            if refused:  # answer parser errors as HTTP/1.1, like everything else
                message = message._replace(version=aiohttp.HttpVersion11)
            request = make_request(message, payload, protocol, *args, **kw)
            if isinstance(protocol, AdapterProtocol):
                protocol.request_created(payload, refused=refused)
            return request

        self.request_factory = tracked_request_factory

    def __call__(self) -> AdapterProtocol:
        return AdapterProtocol(self, loop=self._loom_loop, **self._loom_protocol_kwargs)

    def _open(self) -> list[AdapterProtocol]:
        return [c for c in self.connections if isinstance(c, AdapterProtocol) and c._loom_phase != "closed"]

    def open_count(self) -> int:
        """Registered connections not already being closed."""
        return len(self._open())

    def _oldest(self, phases: tuple[str, ...], but: AdapterProtocol) -> AdapterProtocol | None:
        candidates = [c for c in self._open() if c._loom_phase in phases and c is not but]
        return min(candidates, key=lambda c: c._loom_progress, default=None)

    def make_room(self, newcomer: AdapterProtocol) -> bool:
        """Close the reading connection with the oldest progress, else the longest-idle kept-alive
        one, else one that has sent nothing for `deadlines.silent_after`, to admit `newcomer`; False when
        every open connection has work in progress or has only just opened."""
        victim = self._oldest(READING, newcomer) or self._oldest(("idle",), newcomer)
        if victim is None:
            silent = self._oldest(("new",), newcomer)
            if silent is not None and self._loom_loop.time() - silent._loom_progress >= self.deadlines.silent_after:
                victim = silent
        if victim is None:
            self.count(503)
            return False
        victim.loom_close()
        return True

    def bound_reading(self, entered: AdapterProtocol) -> None:
        """`entered` started reading a request: over `max_reading`, close the reading connection
        (another one) whose last progress is oldest."""
        reading = [c for c in self._open() if c._loom_phase in READING]
        if len(reading) > self.deadlines.max_reading:
            victim = self._oldest(READING, entered)
            if victim is not None:
                victim.loom_close()


class AdapterRunner(web.AppRunner):
    """`web.AppRunner` serving through `AdapterServer`. Refuses an aiohttp outside
    `AIOHTTP_SUPPORTED` when constructed."""

    def __init__(self, app: web.Application, *, max_connections: int, refusal: bytes, render_error: ErrorRenderer,
                 reject_expect: ExpectRefusal, deadlines: Deadlines | None = None,
                 count: BelowAppCounter = _no_count, **kwargs: Any) -> None:
        check_aiohttp_version()
        super().__init__(app, **kwargs)
        self._loom_server_options = {"max_connections": max_connections, "refusal": refusal,
                                     "render_error": render_error, "reject_expect": reject_expect,
                                     "deadlines": deadlines, "count": count}

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # the Application's own web.Server, never started
        return AdapterServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation, **self._loom_server_options,
                             **server._kwargs)


__all__ = ["AIOHTTP_REQUIREMENT", "AIOHTTP_SUPPORTED", "SILENT_AFTER_S", "AdapterProtocol", "AdapterRunner",
           "AdapterServer", "BelowAppCounter", "Deadlines", "ErrorRenderer", "ExpectRefusal", "check_aiohttp_version"]
