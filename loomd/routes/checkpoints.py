"""Named checkpoints (spec: "Named checkpoints"): pin, suspend and delete immutable endpoints.

Control requests have an empty body and select the deployment with `X-Loom-Model` (omissible
only when exactly one deployment is registered). A pin is kept as a host image of the
session's KV pages (elastic backing), so `/suspend` always succeeds and reports its size;
chats continue from a checkpoint with `X-Loom-Checkpoint` (routes/chat.py).
"""

from __future__ import annotations

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import empty_body
from loomd.errors import json_response
from loomrt.errors import InvalidRequest, NotFound
from loomrt.sessions import check_session_name

def _target(request: web.Request):
    name = check_session_name(request.match_info["name"], "checkpoint name")
    registry = request.app[REGISTRY]
    model = request.headers.get("X-Loom-Model")
    if model is None:
        regs = registry.registrations()
        if len(regs) != 1:
            raise InvalidRequest("X-Loom-Model is required when more than one deployment is registered",
                                 param="X-Loom-Model")
        model = regs[0].name
    reg = registry.get(model)
    if reg.service is None or not hasattr(reg.service, "pin"):
        raise NotFound(f"model '{reg.name}' is not a prepared deployment with retained sessions", param="X-Loom-Model")
    return name, reg


async def pin(request: web.Request) -> web.StreamResponse:
    name, reg = _target(request)
    await empty_body(request)
    session = request.headers.get("X-Loom-Session")
    if session is None:
        raise InvalidRequest("pinning needs X-Loom-Session: the session whose history becomes the checkpoint",
                             param="X-Loom-Session")
    point = reg.service.pin(name, check_session_name(session))
    return json_response({"object": "checkpoint", "name": name, "model": reg.name, "session": point.session,
                          "position": len(point.tokens)}, 201)


async def suspend(request: web.Request) -> web.StreamResponse:
    name, reg = _target(request)
    await empty_body(request)
    point = reg.service.checkpoint(name)
    return json_response({"object": "checkpoint", "name": name, "model": reg.name, "position": len(point.tokens),
                          "host_snapshot_bytes": point.host_bytes})


async def delete(request: web.Request) -> web.StreamResponse:
    name, reg = _target(request)
    await empty_body(request)
    reg.service.unpin(name)
    return json_response({"object": "checkpoint", "name": name, "model": reg.name, "deleted": True})


def add_routes(add) -> None:
    add("POST", "/v1/checkpoints/{name}", pin)
    add("POST", "/v1/checkpoints/{name}/suspend", suspend)
    add("DELETE", "/v1/checkpoints/{name}", delete)
