"""The one place a failure becomes an HTTP response: `{"error": {message, type, param, code}}`.

Every `loomrt.errors.LoomError` carries its status, type and code; anything else reaching
here is a bug and becomes a 500 whose message says only that (the details go to the log).
Framing errors that aiohttp detects below the application (a malformed request line, a
bad chunk) are rendered by the same `error_body` in `framing.py`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from loomrt.errors import LoomError, type_for_status

log = logging.getLogger("loomd")

#: Codes for statuses that framing and routing produce themselves (no LoomError behind them).
STATUS_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed", 411: "length_required",
                413: "request_too_large", 414: "uri_too_long", 417: "expectation_failed",
                431: "headers_too_large", 500: "internal_error", 501: "not_implemented",
                503: "unavailable"}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_for_status(status), "param": param,
                      "code": code or STATUS_CODES.get(status, "error")}}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body, ensure_ascii=False).encode(),
                        content_type="application/json", headers=headers)


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   *, close: bool = False) -> web.Response:
    response = json_response(error_body(status, message, code, param), status)
    if close:
        response.force_close()
    return response


def loom_error_response(exc: LoomError) -> web.Response:
    return json_response(exc.to_dict(), exc.status)


def unexpected_error_response(exc: BaseException) -> web.Response:
    log.exception("unexpected error while handling a request", exc_info=exc)
    return error_response(500, "internal server error (logged)", "internal_error")


__all__ = ["error_body", "error_response", "json_response", "loom_error_response", "unexpected_error_response"]
