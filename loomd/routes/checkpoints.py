"""Named checkpoints (spec: "Named checkpoints"): pin, suspend and delete immutable endpoints.

Control requests have an empty body and select the deployment with `X-Loom-Model` (omissible
only when exactly one deployment is registered). A pin keeps a copy of the session's KV in
pool pages of its own (loomrt/pins.py); with the document's `checkpoint_backing` "elastic"
(the default) `/suspend` moves it to a host image and reports its size, with "fixed" it is
400. Chats continue from a checkpoint with `X-Loom-Checkpoint` (routes/chat.py), and so do forks
of known-token sequences (routes/sequences.py), whose handle is the `X-Loom-Session` to pin.
The route is the same for every kind: the deployment's service owns `pin`, `checkpoint`
and `unpin` and raises the contract's errors.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import empty_body
from loomd.errors import json_response
from loomrt.errors import InvalidRequest, NotFound
from loomrt.sessions import check_session_name

ADMISSION_POLL_S = 1.0   # how often a pin waiting for admission checks that its client is still there


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


async def _admission_open(request: web.Request, reg) -> None:
    """Pinning and suspension wait for inference admission to reopen (spec), for as long as
    the client waits; a registration removed meanwhile is gone (404)."""
    registry = request.app[REGISTRY]
    while reg.admission != "open" and reg.removing is None:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise asyncio.CancelledError()
        await registry.until(lambda: reg.admission == "open" or reg.removing is not None, ADMISSION_POLL_S)
    if reg.removing is not None:
        raise NotFound(f"model '{reg.name}' is being removed", param="X-Loom-Model")


async def pin(request: web.Request) -> web.StreamResponse:
    name, reg = _target(request)
    await empty_body(request)
    session = request.headers.get("X-Loom-Session")
    if session is None:
        raise InvalidRequest("pinning needs X-Loom-Session: the session whose history becomes the checkpoint",
                             param="X-Loom-Session")
    session = check_session_name(session)
    await _admission_open(request, reg)
    point = reg.service.pin(name, session)
    return json_response({"object": "checkpoint", "name": name, "model": reg.name, "session": point.session,
                          "position": point.position, "pending_token": point.pending}, 201)


async def suspend(request: web.Request) -> web.StreamResponse:
    name, reg = _target(request)
    await empty_body(request)
    reg.service.checkpoint(name, suspending=True)   # 404 or 400 (fixed backing) at once, before waiting
    await _admission_open(request, reg)
    point = reg.service.suspend(name)
    return json_response({"object": "checkpoint", "name": name, "model": reg.name, "position": point.position,
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
