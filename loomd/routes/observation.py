"""Observation: `/logz` (JSONL with a cursor), `/logz/stream` (SSE, resumable), `/metrics`,
`/v1/requests` and `/v1/sessions` (bounded pages)."""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from loomd.app import JOURNAL, METRICS, REGISTRY, SETTINGS
from loomd.errors import json_response
from loomd.metrics import CONTENT_TYPE
from loomd.params import is_decimal, one_decimal
from loomrt.errors import InvalidRequest

MAX_PAGE = 1000
DEFAULT_PAGE = 100
KEEPALIVE_S = 15.0
WAIT_SLICE_S = 1.0


def _query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    values = request.query.getall(name, [])
    if not values:
        return default
    return one_decimal(values, f"query parameter {name!r}", lo, hi, param=name)


def _no_unknown_query(request: web.Request, known: tuple[str, ...]) -> None:
    for key in request.query:
        if key not in known:
            raise InvalidRequest(f"unknown query parameter {key!r} (known: {', '.join(known)})", param=key)


def _not_ahead(journal, cursor: int, name: str) -> None:
    """A cursor this process never issued (ahead of the newest entry, e.g. from before a
    restart) would silently skip the entries up to it: reject it instead."""
    newest = journal.last_id
    if cursor > newest:
        raise InvalidRequest(f"{name} {cursor} is ahead of the newest log entry ({newest}); "
                             "ids restart with the server", param=name)


async def logz(request: web.Request) -> web.StreamResponse:
    _no_unknown_query(request, ("cursor", "limit"))
    cursor = _query_int(request, "cursor", 0, 0, 2**62)
    limit = _query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    journal = request.app[JOURNAL]
    _not_ahead(journal, cursor, "cursor")
    entries, gap = journal.since(cursor, limit)
    lines = ([gap] if gap else []) + entries
    following = entries[-1]["id"] if entries else max(cursor, (gap or {}).get("to", cursor))
    body = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines)
    return web.Response(text=body, content_type="application/x-ndjson", headers={"X-Loom-Cursor": str(following)})


def _sse(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def logz_stream(request: web.Request) -> web.StreamResponse:
    _no_unknown_query(request, ("cursor",))
    journal = request.app[JOURNAL]
    last = request.headers.get("Last-Event-ID")
    if last is not None:
        if not is_decimal(last.strip()):
            raise InvalidRequest(f"Last-Event-ID must be a decimal event id, got {last!r}")
        cursor = int(last.strip())
        _not_ahead(journal, cursor, "Last-Event-ID")
    else:
        cursor = _query_int(request, "cursor", journal.last_id, 0, 2**62)
        _not_ahead(journal, cursor, "cursor")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    settings = request.app[SETTINGS]
    written = time.monotonic()
    try:
        while not settings.stopping and not _client_gone(request):
            entries, gap = journal.since(cursor, MAX_PAGE)
            if gap:
                await response.write(_sse("gap", gap, gap["to"]))
                cursor = gap["to"]
            for entry in entries:
                await response.write(_sse("log", entry, entry["id"]))
                cursor = entry["id"]
            if entries or gap:
                written = time.monotonic()
                continue
            # Wait in short slices so a departed client or a stopping server ends the stream
            # promptly; a keepalive goes out only after KEEPALIVE_S without any event.
            await journal.wait(cursor, WAIT_SLICE_S)
            if journal.last_id <= cursor and time.monotonic() - written >= KEEPALIVE_S:
                await response.write(b": keepalive\n\n")
                written = time.monotonic()
    except ConnectionResetError:  # the client left mid-write: the stream simply ends
        pass
    return response


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})


def _page(request: web.Request, items: list[dict[str, Any]], key: str) -> web.StreamResponse:
    _no_unknown_query(request, ("after", "limit", "model"))
    after = _query_int(request, "after", 0, 0, 2**62)
    limit = _query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    chosen = [i for i in items if i[key] > after][:limit]
    more = len([i for i in items if i[key] > after]) > limit
    return json_response({"object": "list", "data": chosen,
                          "next_after": chosen[-1][key] if more and chosen else None})


async def requests(request: web.Request) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    model = request.query.get("model")
    if model is not None:
        registry.get(model)
    return _page(request, registry.requests(model), "id")


async def sessions(request: web.Request) -> web.StreamResponse:
    registry = request.app[REGISTRY]
    return _page(request, registry.sessions(request.query.get("model")), "order")


def add_routes(add) -> None:
    add("GET", "/logz", logz)
    add("GET", "/logz/stream", logz_stream)
    add("GET", "/metrics", metrics)
    add("GET", "/v1/requests", requests)
    add("GET", "/v1/sessions", sessions)
