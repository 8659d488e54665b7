"""Embeddings: `POST /v1/embeddings` (spec: "Embeddings").

The host owns the OpenAI-shaped request: `model`, the shape of `input`, `encoding_format`
and `user`, and rejects unknown fields. `input` is one string, a list of strings, one list of
token ids or a list of such lists; whatever the shape, the policy sees a list of inputs.
Empty input is refused (400), as OpenAI refuses it: an empty string, an empty list, an
empty token list inside a batch, and a list that mixes strings, ids and lists. The model's
control program (`EmbeddingPolicy`) validates `dimensions`, tokenizes and frames each input
and enforces the source's limits (input count, length: too long is 400, never truncated).
The inputs then join cohorts of the deployment's `EmbeddingService`; this module only
encodes the vectors: JSON floats (each F32 value exactly, as a double) or base64 of the
little-endian F32 bytes.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import json_response
from loomd.jobs import finished
from loomrt import inference
from loomrt.errors import InvalidRequest
from loomrt.fields import expect_string, fields_of, shown

ENCODING_FORMATS = ("float", "base64")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _id_list(path: str, value: list) -> list[int]:
    if not value:
        raise InvalidRequest(f"{path}: a token-id input must not be empty", param="input")
    for i, t in enumerate(value):
        if not _is_id(t):
            raise InvalidRequest(f"{path}[{i}]: expected a token id (a non-negative integer), got {shown(t)}",
                                 param="input")
    return value


def normalize_input(value: Any) -> list[str | list[int]]:
    """The inputs of a request, in order: each a non-empty string or a non-empty list of ids."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequest("input: must not be an empty string", param="input")
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest(f"input: expected a string, an array of strings, an array of token ids or an array of "
                             f"token-id arrays, got {shown(value)}", param="input")
    if not value:
        raise InvalidRequest("input: must not be an empty array", param="input")
    first = value[0]
    if isinstance(first, str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise InvalidRequest(f"input[{i}]: expected a string like input[0], got {shown(item)}", param="input")
            if not item:
                raise InvalidRequest(f"input[{i}]: must not be an empty string", param="input")
        return list(value)
    if isinstance(first, list):
        out: list[str | list[int]] = []
        for i, item in enumerate(value):
            if not isinstance(item, list):
                raise InvalidRequest(f"input[{i}]: expected an array of token ids like input[0], got {shown(item)}",
                                     param="input")
            out.append(_id_list(f"input[{i}]", item))
        return out
    if _is_id(first):
        return [_id_list("input", value)]
    raise InvalidRequest(f"input[0]: expected a string, a token id or an array of token ids, got {shown(first)}",
                         param="input")


def _encoding_format(body: dict[str, Any]) -> str:
    value = body.get("encoding_format")
    if value is None:
        return "float"
    if value not in ENCODING_FORMATS:
        raise InvalidRequest(f"encoding_format: expected \"float\" or \"base64\", got {shown(value)}",
                             param="encoding_format")
    return value


def _encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()  # each f32 exactly, as the double it widens to


async def embeddings(request: web.Request) -> web.StreamResponse:
    body = fields_of(await json_body(request), ("model", "input"), ("encoding_format", "dimensions", "user"))
    model = expect_string("model", body["model"])
    encoding = _encoding_format(body)
    if body.get("user") is not None:
        expect_string("user", body["user"])  # client metadata: accepted, not used
    policy_request: dict[str, Any] = {"input": normalize_input(body["input"])}
    if "dimensions" in body:
        policy_request["dimensions"] = body["dimensions"]
    job = await asyncio.to_thread(inference.embed, request.app[REGISTRY], model, policy_request, request.path)
    # a client that leaves takes its inputs out of the cohorts at the next boundary
    vectors = await finished(job.future, on_leave=job.cancel)
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(vectors)]
    return json_response({"object": "list", "data": data, "model": job.model, "usage": job.usage()})


def add_routes(add) -> None:
    add("POST", "/v1/embeddings", embeddings)


__all__ = ["add_routes", "embeddings", "normalize_input"]
