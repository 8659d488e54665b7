"""Request framing: our rules on top of aiohttp's HTTP/1.1 parser.

- A body comes with `Content-Length` or `Transfer-Encoding: chunked`, never both (400).
  Any other transfer coding is refused with 400 (aiohttp's parser refuses most of them
  before we see the request; we refuse the rest the same way).
- The decoded body is bounded by `--request_body_bytes`: a declared length over the bound is
  refused before reading, a chunked body as soon as it passes the bound (413; the connection
  closes, since the rest of the body is never read).
- `Expect` is unsupported: 417, and `100 Continue` is never sent (every route, the catch-all
  included, carries `reject_expect` as its expect handler, which runs before any handler).
- A body that ends early (a truncated chunk or a short Content-Length) is 400.
- Errors aiohttp's parser raises below the application (malformed request line, headers or
  chunk framing) get the same JSON error body through `JsonErrorRunner`.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from loomd.errors import error_body, error_response
from loomrt.errors import InvalidRequest, LoomError, PayloadTooLarge

READ_CHUNK = 65536


async def reject_expect(request: web.BaseRequest) -> web.StreamResponse:
    return error_response(417, f"Expect: {request.headers.get('Expect', '')!r} is not supported; send the "
                               "request without an Expect header (curl: -H 'Expect:')", "expectation_failed",
                          close=request.body_exists)


def check_framing(request: web.BaseRequest) -> None:
    te = request.headers.getall("Transfer-Encoding", [])
    if te and "Content-Length" in request.headers:
        raise InvalidRequest("a request may not carry both Content-Length and Transfer-Encoding")
    codings = [c.strip().lower() for value in te for c in value.split(",") if c.strip()]
    if codings and codings != ["chunked"]:
        raise InvalidRequest(f"Transfer-Encoding {', '.join(codings)!r} is not supported; use chunked or "
                             "Content-Length")


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The whole decoded body, bounded by `limit` bytes."""
    check_framing(request)
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is larger than the server's limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            chunk = await request.content.read(READ_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than the server's limit of {limit} bytes")
            chunks.append(chunk)
    except LoomError:
        raise
    except Exception as exc:  # aiohttp's payload errors: a truncated chunk, a short body
        raise InvalidRequest(f"request body is incomplete or malformed: {exc}") from None
    return b"".join(chunks)


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: %d\r\n\r\n%s")


class _JsonErrorHandler(RequestHandler):
    """aiohttp's protocol handler with its low-level error pages replaced by our JSON body,
    and the server's connection bound: a connection over `--connections` gets 503 and closes."""

    def connection_made(self, transport) -> None:
        server = self._manager
        if server is not None and len(server.connections) >= getattr(server, "max_connections", 1 << 30):
            body = json.dumps(error_body(503, "too many open connections; retry later", "unavailable")).encode()
            transport.write(_BUSY % (len(body), body))
            transport.close()
            return
        super().connection_made(transport)

    def eof_received(self) -> bool | None:
        """The client closed its side. With every request body complete (or the connection
        idle) that means it left, as uvicorn and aiohttp's own handler take it: the transport
        closes and the handler is cancelled, so a generation nobody waits for stops at its next
        step. A body cut short keeps our side open to answer it with a 400."""
        idle = not self._messages and self._waiter is not None and not self._waiter.done()
        if idle or self._bodies_complete():
            return None
        self._keepalive = False  # answer, then close (force_close would drop a queued request unanswered)
        self._end_truncated_bodies(tries=100)
        return True

    def _bodies_complete(self) -> bool:
        payloads = [payload for _, payload in self._messages]
        if self._current_request is not None:
            payloads.append(self._current_request.content)
        return bool(payloads) and all(payload.is_eof() for payload in payloads)

    def _end_truncated_bodies(self, tries: int) -> None:
        """Fail the body of the request in progress if it is incomplete. The request object may
        not exist yet (aiohttp creates it in a task), so look again on the next loop turns."""
        payloads = [payload for _, payload in self._messages]
        if self._current_request is not None:
            payloads.append(self._current_request.content)
        elif tries > 0 and self._loop is not None:
            self._loop.call_soon(self._end_truncated_bodies, tries - 1)
        for payload in payloads:
            if not payload.is_eof():
                payload.set_exception(ConnectionResetError("the client ended the connection before the body "
                                                           "was complete"))

    async def finish_response(self, request, resp, start_time):  # type: ignore[override]
        """A response that ends the connection while the request body is unread or broken
        (413, 417, a truncated body) closes it as soon as the response is written. aiohttp
        would otherwise linger, reading and discarding the body for up to 10 s (holding a
        `--connections` slot) and log the truncated body's error as an unhandled exception."""
        result = await super().finish_response(request, resp, start_time)
        body = request.content
        if not body.is_eof() and (not resp.keep_alive or body.exception() is not None):
            self.force_close()  # the transport flushes the written response, then closes
        return result

    def handle_error(self, request, status=500, exc=None, message=None):  # type: ignore[override]
        text = str(getattr(exc, "message", None) or message or exc or "bad request")
        if status < 500:  # the client's malformed request: answer it, no traceback in the log
            response = web.Response(status=status, body=json.dumps(error_body(
                status, f"malformed HTTP request: {text}")).encode(), content_type="application/json")
            response.force_close()
            return response
        response = super().handle_error(request, status, exc, message)
        if status >= 500:
            text = "internal server error (logged)"
        response.body = json.dumps(error_body(status, f"malformed HTTP request: {text}" if status < 500
                                              else text)).encode()
        response.content_type = "application/json"
        return response


class _JsonErrorServer(Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An AppRunner whose connections render parser errors as JSON (see module docstring)."""

    def __init__(self, app: web.Application, *, max_connections: int = 1 << 30, **kwargs) -> None:
        super().__init__(app, **kwargs)
        self._max_connections = max_connections

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same object, one overridden factory method
        server.max_connections = self._max_connections
        return server


__all__ = ["JsonErrorRunner", "check_framing", "read_body", "reject_expect"]
