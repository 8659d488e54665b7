"""Discovery: `/healthz`, `/readyz`, `/v1/models` and `/v1/status` (spec: "Discovery and administration")."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY, SETTINGS
from loomd.errors import error_response, json_response
from loomrt.media.audio import container_formats
from loomrt.registry import Registration

#: The HTTP inference route and modalities of each kind: HTTP knowledge, so it lives here.
KIND_ROUTES: dict[str, tuple[str, list[str], list[str]]] = {
    "text": ("/v1/chat/completions", ["text"], ["text"]),
    "sequence": ("/v1/sequences", ["text"], ["bytes"]),
    "embedding": ("/v1/embeddings", ["text"], ["embedding"]),
    "decision": ("/v1/systemone", ["text"], ["probabilities"]),
    "image": ("/v1/images/generations", ["text"], ["image"]),
    "speech": ("/v1/audio/speech", ["text"], ["audio"]),
    "recognition": ("/v1/audio/transcriptions", ["audio"], ["text"]),
}


def model_object(reg: Registration) -> dict[str, Any]:
    doc = reg.document
    endpoint, inputs, outputs = KIND_ROUTES[doc.kind]
    images = getattr(reg.policy, "images", None) if doc.kind == "text" else None
    if images is not None:        # a program that takes images, not merely a declared component
        inputs = inputs + ["image"]
    loom: dict[str, Any] = {"kind": doc.kind, "tokenize": reg.tokenizer is not None,
                            "input_tokens": doc.kind == "text" and reg.policy is not None,
                            "admission": reg.admission,
                            "resident": all(c.resident for c in reg.components.values())}
    if not reg.native_only:
        loom["endpoint"] = endpoint
    if doc.kind == "text":
        loom["context_length"] = doc.context_length
        loom["limits"] = {"max_output_tokens": doc.max_output_tokens}
    if images is not None:
        limits = images.limits
        loom["image_input"] = {"formats": list(images.formats.supported()), "max_bytes": limits.max_bytes,
                               "max_side": limits.max_side, "max_pixels": limits.max_pixels}
    if doc.kind == "recognition" and reg.policy is not None:
        geometry = reg.policy.geometry
        loom["input_formats"] = container_formats() + ["pcm"]
        loom["input"] = {"sample_rate": geometry.rate, "channels": geometry.channels, "max_frames": geometry.max_frames}
    if doc.kind == "speech" and reg.policy is not None:
        loom["output_format"] = {"format": "pcm", "sample_rate": reg.policy.sample_rate, "channels": 1}
        loom["voices"] = reg.policy.voices
    if doc.kind == "image" and reg.policy is not None:
        loom["image"] = {"width": doc.width, "height": doc.height, "sizes": reg.policy.geometry,
                         "loras": list(doc.loras), "specialization_capacity": doc.specialization_capacity,
                         "compiled_sizes": reg.service.shapes.sizes() if reg.service is not None else []}
    if reg.variants is not None:
        loom["variants"] = reg.variants.summary()
    return {"id": reg.name, "object": "model", "created": int(reg.created), "owned_by": "local",
            "input_modalities": inputs, "output_modalities": outputs, "loom": loom}


async def healthz(request: web.Request) -> web.StreamResponse:
    return json_response({"status": "ready"})


async def readyz(request: web.Request) -> web.StreamResponse:
    if request.app[SETTINGS].stopping:
        return error_response(503, "the server is shutting down", "unavailable")
    return json_response({"status": "ready"})


async def models(request: web.Request) -> web.StreamResponse:
    data = [model_object(r) for r in request.app[REGISTRY].models()]
    return json_response({"object": "list", "data": data})


async def status(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    body = request.app[REGISTRY].status()
    body = {"object": "status", **body,
            "server": {"started": int(settings.started), "uptime_s": round(time.time() - settings.started, 3),
                       "stopping": settings.stopping, "request_body_bytes": settings.request_body_bytes,
                       "connections": settings.connections}}
    return json_response(body)


def add_routes(add) -> None:
    add("GET", "/healthz", healthz)
    add("GET", "/readyz", readyz)
    add("GET", "/v1/models", models)
    add("GET", "/v1/status", status)
