"""Audio transcription: `POST /v1/audio/transcriptions` (spec: "Audio transcription").

A finished recording arrives as multipart/form-data with exactly these fields, each at most
once: `model` and `file` (required), `language` and `prompt` (UTF-8 text the package's
policy interprets), `temperature` (a finite number in 0..1), `response_format` (`json`, the
default, or `text`) and `stream` (omitted or `false`: this profile is finite). Unknown or
repeated fields reject. The file part's bytes select the decoder (`loomrt.media.audio`),
except raw PCM16LE, which declares `audio/pcm;rate=R;channels=C` on the part. One runtime
call (`loomrt.inference.transcribe`, on a worker thread: decoding and resampling are CPU
work) checks the options, decodes the recording to the model's geometry, enforces its frame
limit and queues it; the route only frames the transcript.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import form_parts
from loomd.errors import json_response
from loomd.jobs import finished
from loomd.multipart import Part, parse_header_params
from loomrt import inference
from loomrt.errors import InvalidRequest

FIELDS = ("model", "file", "language", "prompt", "temperature", "response_format", "stream")
FORMATS = ("json", "text")


def _text(part: Part) -> str:
    try:
        return part.data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"{part.name}: expected UTF-8 text", param=part.name) from None


def transcription_fields(parts: list[Part]) -> dict[str, Part]:
    """The parts by name: every name known, none repeated, the required ones present."""
    fields: dict[str, Part] = {}
    for part in parts:
        if part.name not in FIELDS:
            raise InvalidRequest(f"unknown field '{part.name}' (fields: {', '.join(FIELDS)})", param=part.name)
        if part.name in fields:
            raise InvalidRequest(f"field '{part.name}' appears twice", param=part.name)
        fields[part.name] = part
    for name in ("model", "file"):
        if name not in fields:
            raise InvalidRequest(f"{name}: required field is missing", param=name)
    return fields


def _options(fields: dict[str, Part]) -> tuple[dict[str, Any], str]:
    """(the policy's options, the response format)."""
    options: dict[str, Any] = {"language": None, "prompt": None, "temperature": 0.0}
    for name in ("language", "prompt"):
        if name in fields:
            options[name] = _text(fields[name])
    if "temperature" in fields:
        raw = _text(fields["temperature"]).strip()
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidRequest(f"temperature: expected a finite number from 0 through 1, got {raw!r}",
                                 param="temperature")
        options["temperature"] = value
    response_format = _text(fields["response_format"]) if "response_format" in fields else "json"
    if response_format not in FORMATS:
        raise InvalidRequest(f"response_format: expected \"json\" or \"text\", got {response_format!r}",
                             param="response_format")
    if "stream" in fields and _text(fields["stream"]).strip().lower() != "false":
        raise InvalidRequest("stream: this profile transcribes finished uploads; omit stream or send false",
                             param="stream")
    return options, response_format


async def transcriptions(request: web.Request) -> web.StreamResponse:
    fields = transcription_fields(await form_parts(request))
    model = _text(fields["model"])
    options, response_format = _options(fields)
    file = fields["file"]
    media_type, params = parse_header_params(file.content_type) if file.content_type else (None, {})
    admitted = asyncio.ensure_future(asyncio.to_thread(
        inference.transcribe, request.app[REGISTRY], model, file.data,
        media_type.strip().lower() if media_type else None, params, options, request.path))
    try:
        job = await asyncio.shield(admitted)
    except asyncio.CancelledError:
        # the client left while its recording was decoding: cancel the job once it is queued
        admitted.add_done_callback(lambda done: done.cancelled() or done.exception() or done.result().cancel())
        raise
    # a client that leaves takes its windows out of the batches at the next boundary
    result = await finished(job.future, on_leave=job.cancel)
    if response_format == "text":
        return web.Response(text=result["text"], content_type="text/plain", charset="utf-8")
    return json_response({"text": result["text"]})


def add_routes(add) -> None:
    add("POST", "/v1/audio/transcriptions", transcriptions)


__all__ = ["add_routes", "transcriptions"]
