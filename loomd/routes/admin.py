"""Administration: register, drain/undrain, unregister, activate/deactivate, pin/unpin, trim."""

from __future__ import annotations

import asyncio

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body, json_or_package
from loomd.errors import json_response
from loomrt.fields import expect_string, fields_of


async def register(request: web.Request) -> web.StreamResponse:
    upload = await json_or_package(request)
    registry = request.app[REGISTRY]
    reg = await asyncio.to_thread(registry.register, upload.raw, package=upload.package, origin=upload.origin)
    return json_response({"object": "registration", "model": reg.name, "phase": reg.phase,
                          "admission": reg.admission, "created": int(reg.created)}, 202)


async def _model_only(request: web.Request) -> str:
    body = fields_of(await json_body(request), ("model",))
    return expect_string("model", body["model"])


async def drain(request: web.Request) -> web.StreamResponse:
    reg = request.app[REGISTRY].drain(await _model_only(request))
    return json_response({"model": reg.name, "admission": reg.admission})


async def undrain(request: web.Request) -> web.StreamResponse:
    reg = request.app[REGISTRY].undrain(await _model_only(request))
    return json_response({"model": reg.name, "admission": reg.admission})


async def unregister(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model",), ("mode",))
    model = expect_string("model", body["model"])
    mode = expect_string("mode", body.get("mode", "drain"))
    request.app[REGISTRY].unregister(model, mode)
    return json_response({"model": model, "removing": mode}, 202)


async def _component_request(request: web.Request) -> tuple[str, object]:
    body = fields_of(await json_body(request), ("model",), ("component",))
    return expect_string("model", body["model"]), body.get("component", "primary")


async def activate(request: web.Request) -> web.StreamResponse:
    model, component = await _component_request(request)
    request.app[REGISTRY].activate(model, component)
    return json_response({"model": model, "component": component, "operation": "activate"}, 202)


async def deactivate(request: web.Request) -> web.StreamResponse:
    model, component = await _component_request(request)
    request.app[REGISTRY].deactivate(model, component)
    return json_response({"model": model, "component": component, "operation": "deactivate"}, 202)


async def pin(request: web.Request) -> web.StreamResponse:
    model, component = await _component_request(request)
    request.app[REGISTRY].pin(model, component)
    return json_response({"model": model, "component": component, "pinned": True})


async def unpin(request: web.Request) -> web.StreamResponse:
    model, component = await _component_request(request)
    request.app[REGISTRY].unpin(model, component)
    return json_response({"model": model, "component": component, "pinned": False})


async def trim(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("device", "target_bytes"))
    accounting = request.app[REGISTRY].trim(body["device"], body["target_bytes"])
    return json_response({"object": "devices", "data": accounting})


def add_routes(add) -> None:
    add("POST", "/v1/models/register", register)
    add("POST", "/v1/models/drain", drain)
    add("POST", "/v1/models/undrain", undrain)
    add("POST", "/v1/models/unregister", unregister)
    add("POST", "/v1/models/activate", activate)
    add("POST", "/v1/models/deactivate", deactivate)
    add("POST", "/v1/models/pin", pin)
    add("POST", "/v1/models/unpin", unpin)
    add("POST", "/v1/devices/trim", trim)
