"""Image generation: `POST /v1/images/generations` (spec: "Image generation").

The host checks the fields it owns: `model`, a nonempty `prompt`, `n` (only 1),
`response_format` (only `b64_json`: no URLs are hosted), `size` (`WIDTHxHEIGHT` in plain
decimals, or omitted for the deployment's default), `seed` (an unsigned 64-bit integer or its
decimal string, default 0) and `loras` (a list of `{"id", "scale"}`, scale a finite F32
defaulting to 1); anything else, including reference images and edit fields, is a 400. The
source decides whether it generates that size and prompt (`loomrt.inference.illustrate`), the
host which adapters are registered. The picture comes back as one PNG (Pillow), base64.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import time
from typing import Any

import numpy as np
from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import json_response
from loomd.jobs import finished
from loomrt import inference
from loomrt.fields import expect_seed, expect_string, fail, fields_of, reject_unknown, shown
from loomrt.services.image import finite_f32

SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")   # whole string: fullmatch


def _size(body: dict[str, Any]) -> tuple[int, int] | None:
    value = body.get("size")
    if value is None:
        return None
    text = expect_string("size", value)
    match = SIZE.fullmatch(text)
    if match is None:
        raise fail("size", f"expected WIDTHxHEIGHT in pixels, such as \"64x64\", got {shown(value)}")
    return int(match.group(1)), int(match.group(2))


def _loras(body: dict[str, Any]) -> list[tuple[str, float]]:
    value = body.get("loras")
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail("loras", f"expected an array of {{\"id\", \"scale\"}} objects, got {shown(value)}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise fail(f"loras[{i}]", f"expected an object with id and scale, got {shown(item)}")
        reject_unknown(item, ("id", "scale"), f"loras[{i}].")
        if "id" not in item:
            raise fail(f"loras[{i}].id", "required field is missing")
        name = expect_string(f"loras[{i}].id", item["id"])
        if not name:
            raise fail(f"loras[{i}].id", "expected a nonempty adapter id")
        scale = item.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not finite_f32(float(scale)):
            raise fail(f"loras[{i}].scale", f"expected a finite F32 number, got {shown(scale)}")
        out.append((name, float(np.float32(scale))))
    return out


def image_options(body: dict[str, Any]) -> tuple[str, dict[str, Any], tuple[int, int] | None]:
    """(model, the policy's options without the size, the requested size or None), or the 400
    of the first bad field."""
    fields_of(body, ("model", "prompt"), ("n", "response_format", "size", "seed", "loras"))
    model = expect_string("model", body["model"])
    prompt = expect_string("prompt", body["prompt"])
    if not prompt.strip():
        raise fail("prompt", "expected a nonempty prompt")
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise fail("n", f"only n: 1 is supported (one image per request), got {shown(n)}")
    response_format = body.get("response_format", "b64_json")
    if response_format != "b64_json":
        raise fail("response_format", f"only \"b64_json\" is supported (this server hosts no image URLs), "
                                      f"got {shown(response_format)}")
    options = {"prompt": prompt, "seed": expect_seed(body), "loras": _loras(body)}
    return model, options, _size(body)


def png_base64(image: np.ndarray) -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image), "RGB" if image.shape[-1] == 3 else "RGBA").save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")


def _start(registry: Any, model: str, options: dict[str, Any], size: tuple[int, int] | None, what: str):
    reg = registry.serving(model, "image", what)
    width, height = size if size is not None else (reg.document.width, reg.document.height)
    return inference.illustrate(registry, model, {**options, "width": width, "height": height}, what)


async def generations(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    model, options, size = image_options(body)
    job = await asyncio.to_thread(_start, request.app[REGISTRY], model, options, size, request.path)
    # a client that leaves takes its image out of the batch at the next boundary
    image = await finished(job.future, on_leave=job.cancel)
    encoded = await asyncio.to_thread(png_base64, image)
    return json_response({"created": int(time.time()), "data": [{"b64_json": encoded}]})


def add_routes(add) -> None:
    add("POST", "/v1/images/generations", generations)


__all__ = ["add_routes", "generations", "image_options", "png_base64"]
