"""Request framing: our rules on top of aiohttp's HTTP/1.1 parser.

- A body comes with `Content-Length` or `Transfer-Encoding: chunked`, never both (400).
  Any other transfer coding is refused with 400 (aiohttp's parser refuses most of them
  before we see the request; we refuse the rest the same way).
- The decoded body is bounded by `--request_body_bytes`: a declared length over the bound is
  refused before reading, a chunked body as soon as it passes the bound (413; the connection
  closes, since the rest of the body is never read).
- `Expect` is unsupported: 417, and `100 Continue` is never sent (every route, the catch-all
  included, carries `reject_expect` as its expect handler, which runs before any handler; a
  target no route can match, CONNECT's `host:port` or `OPTIONS *`, gets it below the app).
- A body that ends early (a truncated chunk or a short Content-Length) is 400, also after the
  client closed its side; a client that closes its side with every body complete has left
  (the connection closes and its handler is cancelled).
- Errors aiohttp's parser raises below the application (malformed request line, headers or
  chunk framing) get the same JSON error body through `JsonErrorRunner`, with an HTTP/1.1
  status line, and are counted in `/metrics` as `loom_http_requests{route="below_app"}`
  (so is every 503 refusal of a connection).
- Slow and stalled peers (`Deadlines`): the request line and headers must arrive within
  `--header-timeout` of the connection's open (or of the first byte of a later request on a
  kept-alive connection); a body that makes no progress for `--body-timeout` is cut; a
  kept-alive connection idle for `--keepalive-timeout` is closed; a response the peer does not
  read for `--write-stall-timeout` is aborted. Each closes the connection without an answer.
- At most `--reading-connections` connections may have sent part of a request and still be
  reading it (header or body); over it, the one whose last progress is oldest is closed.
- More than `--connections` open connections: the next one closes the reading connection
  with the oldest progress (else the longest-idle kept-alive one, else one silent for a
  second) and is served; only when every connection has a handler running (or just opened)
  does it get 503 and is closed. So `/healthz`, `/readyz` and `/metrics` stay answerable
  while stalled uploads or idle clients hold every slot.

`JsonErrorRunner` says what happens below the application; how it reaches into aiohttp (the
only code in loomd that uses aiohttp internals, and the aiohttp versions it supports) is
`loomd/aiohttp_adapter.py`.
"""

from __future__ import annotations

import json

from aiohttp import web

from loomd.aiohttp_adapter import AdapterRunner, BelowAppCounter, Deadlines
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


def _busy_response() -> bytes:
    """The whole HTTP response a connection over `--connections` gets before it is closed."""
    body = json.dumps(error_body(503, "too many open connections; retry later", "unavailable")).encode()
    return _BUSY % (len(body), body)


def _below_app_error(status: int, text: str) -> web.Response:
    """An error aiohttp caught below the application: its parser's (malformed request line,
    headers, chunk framing), or, as a 5xx, an exception no middleware handled."""
    message = f"malformed HTTP request: {text}" if status < 500 else "internal server error (logged)"
    return web.Response(status=status, body=json.dumps(error_body(status, message)).encode(),
                        content_type="application/json")


BELOW_APP_ROUTE = "below_app"


class JsonErrorRunner(AdapterRunner):
    """An AppRunner whose connections follow the rules of the module docstring: errors below the
    application as JSON, at most `max_connections` open connections, the `deadlines`.
    `count(status)` is told each response made below the application (`make_app` apps: their
    `loom_http_requests{route="below_app"}`). The aiohttp mechanics are
    `loomd.aiohttp_adapter`'s; constructing one refuses an aiohttp outside `AIOHTTP_SUPPORTED`."""

    def __init__(self, app: web.Application, *, max_connections: int = 1 << 30, deadlines: Deadlines | None = None,
                 count: BelowAppCounter | None = None, **kwargs) -> None:
        super().__init__(app, max_connections=max_connections, refusal=_busy_response(),
                         render_error=_below_app_error, reject_expect=reject_expect, deadlines=deadlines,
                         count=count or _app_counter(app), **kwargs)


def _app_counter(app: web.Application) -> BelowAppCounter:
    """Counts into the app's metrics when it has them (a `make_app` app), else nowhere."""
    from loomd.app import METRICS  # loomd.app imports this module

    metrics = app.get(METRICS)

    def count(status: int) -> None:
        if metrics is not None:
            metrics.request(BELOW_APP_ROUTE, status)

    return count


__all__ = ["BELOW_APP_ROUTE", "Deadlines", "JsonErrorRunner", "check_framing", "read_body", "reject_expect"]
