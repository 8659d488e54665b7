"""Native executable variants: inventory, staging, selection and removal (spec: "Native executable variants")."""

from __future__ import annotations

import asyncio

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import empty_body, json_body, json_or_package
from loomd.errors import json_response
from loomd.jobs import finished
from loomd.params import one_decimal
from loomrt.errors import InvalidRequest
from loomrt.fields import expect_string, fields_of

def _header_int(request: web.Request, name: str) -> int | None:
    values = request.headers.getall(name, [])
    if not values:
        return None
    return one_decimal(values, name)


def _variant_id(body: dict, key: str) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(f"{key}: expected a variant ID (non-negative integer), got {value!r}", param=key)
    return value


async def inventory(request: web.Request) -> web.StreamResponse:
    models = request.headers.getall("X-Loom-Model", [])
    if len(models) != 1 or not models[0]:
        raise InvalidRequest("GET /v1/models/variants needs exactly one X-Loom-Model header")
    offset = _header_int(request, "X-Loom-Offset")
    variant = _header_int(request, "X-Loom-Variant")
    if offset is not None and variant is not None:
        raise InvalidRequest("X-Loom-Offset and X-Loom-Variant are mutually exclusive")
    await empty_body(request)
    registry = request.app[REGISTRY]
    if variant is not None:
        return json_response(registry.variant(models[0], variant))
    return json_response(registry.list_variants(models[0], offset or 0))


async def stage(request: web.Request) -> web.StreamResponse:
    upload = await json_or_package(request)
    body = fields_of(upload.body, ("model", "base", "sources"), ("base_directory", "wait"))
    model = expect_string("model", body["model"])
    base = _variant_id(body, "base")
    wait = body.get("wait", True)
    if not isinstance(wait, bool):
        raise InvalidRequest(f"wait: expected boolean, got {wait!r}", param="wait")
    if upload.package is not None and "base_directory" in body:
        raise InvalidRequest("base_directory: an uploaded package resolves relative sources itself",
                             param="base_directory")
    registry = request.app[REGISTRY]
    variant = registry.stage_variant(model, base, body["sources"], base_directory=body.get("base_directory"),
                                     package=upload.package, origin=upload.origin)
    # the table is taken now (no await since staging): a removal that completes while this
    # request waits cannot turn a finished compilation's answer into a 404/409
    table = registry.get(model).variants
    if not wait:
        return json_response({"selected": table.selected, "variant": variant.record()}, 202)
    # awaited on the loop, not in a worker thread: a compilation can take minutes, and waiters
    # (abandoned ones too) must not use up the threads every other route submits work with
    settled = [asyncio.wrap_future(f) for f in registry.variant_settled(model, variant)]
    await asyncio.wait(settled, return_when=asyncio.FIRST_COMPLETED)
    registry.wait_variant(model, variant, timeout=0)
    return json_response({"selected": table.selected, "variant": variant.record(detailed=True)},
                         200 if variant.phase == "ready" else 422)


async def select(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model", "variant", "expected"))
    model = expect_string("model", body["model"])
    done = request.app[REGISTRY].select_variant(model, _variant_id(body, "variant"), _variant_id(body, "expected"))
    selected = await finished(done)  # a disconnect withdraws only the reader
    return json_response({"selected": selected})


async def remove(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model", "variant"))
    model = expect_string("model", body["model"])
    removed = request.app[REGISTRY].remove_variant(model, _variant_id(body, "variant"))
    return json_response({"removed": removed})


def add_routes(add) -> None:
    add("GET", "/v1/models/variants", inventory)
    add("POST", "/v1/models/variants", stage)
    add("POST", "/v1/models/variants/select", select)
    add("POST", "/v1/models/variants/remove", remove)
