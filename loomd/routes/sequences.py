"""Known-token sequences (spec: "Known-token sequences"): `POST /v1/sequences`, streamed as SSE.

The host owns the request's shape: `model`, optional `session` (a handle this server
issued), `position` (the completed position the caller knows), nonempty `token_ids`
(nonnegative int32) and an optional `options` object that the model's control program
validates (`sequence_request`). Everything else (unknown, duplicate or wrongly typed
fields, an `X-Loom-Session` header: identity is the body's `session`) is a 400 before
admission; an unknown model or one that is not a sequence deployment is 404. Admission
errors (unknown handle 404, busy handle or stale position 409, context/pool 400, a full
queue 503) are JSON errors.

`X-Loom-Checkpoint: NAME` (a pin made with `POST /v1/checkpoints/NAME`, routes/checkpoints.py)
forks: `session` omitted, `position` the checkpoint's consumed position; the response's
handle is new and starts as a copy of the checkpoint. With `session` it is 400; an unknown
checkpoint 404; any other position 409 (stale). Once admitted the response is SSE:

    event: attached   {"session", "position"}
    event: chunk      {"session", "position", "next_position", "token_ids", "encoding": "base64", "data"}
    event: done       {"session", "position"}

one `chunk` per execution step the request took part in; a failure after the stream began
is one `event: error` with the usual error body, and the stream ends.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import error_body
from loomrt import inference
from loomrt.errors import InvalidRequest, LoomError
from loomrt.fields import expect_integer, expect_object, expect_string, fail, reject_unknown
from loomrt.sessions import check_session_name
from loomrt.services.sequence import INT32_MAX

SEQUENCE_FIELDS = ("model", "session", "position", "token_ids", "options")
HANDLE = re.compile(r"[0-9a-f]{32}")   # whole string: fullmatch


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def validate_sequence(body: dict[str, Any], checkpoint: str | None = None
                      ) -> tuple[str, str | None, int, list[int], dict[str, Any]]:
    """(model, session, position, token_ids, options) after the host-owned checks. A fork
    (`checkpoint` named) starts at the checkpoint's position, which the service checks."""
    reject_unknown(body, SEQUENCE_FIELDS)
    for key in ("model", "position", "token_ids"):
        if key not in body:
            raise InvalidRequest(f"{key}: required field is missing", param=key)
    model = expect_string("model", body["model"])
    session = None
    if "session" in body:
        session = expect_string("session", body["session"])
        if not HANDLE.fullmatch(session):
            raise fail("session", f"expected a handle of 32 lowercase hex digits, got {json.dumps(session)}")
    position = expect_integer("position", body["position"], 0, INT32_MAX)
    ids = body["token_ids"]
    if not isinstance(ids, list):
        raise fail("token_ids", "expected a nonempty array of token ids")
    if not ids:
        raise fail("token_ids", "must not be empty")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= INT32_MAX:
            raise fail(f"token_ids[{i}]", f"expected a nonnegative int32, got {json.dumps(t)}")
    if checkpoint is not None and session is not None:
        raise InvalidRequest("X-Loom-Checkpoint forks into a new handle: omit the body's 'session'",
                             param="X-Loom-Checkpoint")
    if session is None and checkpoint is None and position != 0:
        raise fail("position", f"an initial request (no session) starts at position 0, got {position}")
    options = expect_object("options", body["options"]) if "options" in body else {}
    return model, session, position, ids, options


async def sequences(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    if "X-Loom-Session" in request.headers:
        raise InvalidRequest("X-Loom-Session is not accepted on /v1/sequences: the handle is the body's "
                             "'session' field", param="X-Loom-Session")
    checkpoint = request.headers.get("X-Loom-Checkpoint")
    if checkpoint is not None:
        check_session_name(checkpoint, "X-Loom-Checkpoint")
    model, session, position, ids, options = validate_sequence(body, checkpoint)
    job = await asyncio.to_thread(inference.append, request.app[REGISTRY], model, ids, position, session=session,
                                  options=options, checkpoint=checkpoint, what=request.path,
                                  loop=asyncio.get_running_loop())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        await response.write(_event("attached", {"session": job.handle, "position": position}))
        while True:
            kind, payload = await job.outbox.aget()
            if kind == "chunk":
                data = base64.b64encode(payload.pop("data")).decode("ascii")
                await response.write(_event("chunk", {**payload, "encoding": "base64", "data": data}))
            elif kind == "done":
                await response.write(_event("done", payload))
                break
            else:
                error: LoomError = payload
                await response.write(_event("error", error_body(error.status, error.message, error.code,
                                                                error.param)))
                break
        await response.write_eof()
    except BaseException:
        # The client left (or the stream broke): the append stops at the next step boundary
        # and its handle is invalidated once the step in flight retires.
        job.cancel()
        raise
    return response


def add_routes(add) -> None:
    add("POST", "/v1/sequences", sequences)
