"""Speech synthesis: `POST /v1/audio/speech` (spec: "Speech synthesis").

The host checks the fields it owns: `model`, a nonempty `input`, `voice` (an id string or
`{"id": ...}`), `response_format` (required, and only `pcm`: there are no encoders),
`stream_format` (omitted or `audio`), `speed` (0.25..4, default 1) and `seed` (an unsigned
64-bit integer or its decimal string, default 0); `instructions` (a string) goes to the
source's policy with the rest, which cuts the input into blocks or rejects what it cannot do
(`loomrt.inference.speak`). Then the response streams each block's PCM16LE samples as the
service computes them, with `Content-Type: audio/pcm;rate=R;channels=1`, and ends when the
last block is written. A failure before the first block is an ordinary JSON error; one after
it cannot change the status any more, so the connection is closed without the stream's end
(the client sees a truncated body, never a wrong one).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomrt import inference
from loomrt.errors import LoomError
from loomrt.fields import expect_seed, expect_string, fail, fields_of, reject_unknown, shown

FIELDS = ("model", "input", "voice", "response_format", "stream_format", "speed", "seed", "instructions")
ENCODED_FORMATS = ("mp3", "opus", "aac", "flac", "wav")
SPEED_RANGE = (0.25, 4.0)

log = logging.getLogger("loomd.speech")


def _voice(value: Any) -> str:
    if isinstance(value, dict):
        reject_unknown(value, ("id",), "voice.")
        if "id" not in value:
            raise fail("voice.id", "required field is missing")
        value = expect_string("voice.id", value["id"])
    else:
        value = expect_string("voice", value)
    if not value:
        raise fail("voice", "expected a nonempty voice id")
    return value


def _speed(body: dict[str, Any]) -> float:
    value = body.get("speed")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail("speed", f"expected a number from {SPEED_RANGE[0]} through {SPEED_RANGE[1]}, got {shown(value)}")
    if not SPEED_RANGE[0] <= value <= SPEED_RANGE[1]:
        raise fail("speed", f"{value} is out of range {SPEED_RANGE[0]}..{SPEED_RANGE[1]}")
    return float(value)


def speech_options(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(model, the policy's options) of a request body, or the 400 of its first bad field."""
    fields_of(body, ("model", "input", "voice", "response_format"), FIELDS[4:])
    model = expect_string("model", body["model"])
    text = expect_string("input", body["input"])
    if not text.strip():
        raise fail("input", "expected nonempty text")
    response_format = body["response_format"]
    if response_format != "pcm":
        if response_format in ENCODED_FORMATS:
            raise fail("response_format", f"{response_format!r} is an encoded format; this server streams raw "
                                          "audio only: send \"pcm\" (PCM16LE mono)")
        raise fail("response_format", f"expected \"pcm\", got {shown(response_format)}")
    stream_format = body.get("stream_format")
    if stream_format is not None and stream_format != "audio":
        raise fail("stream_format", f"expected \"audio\" (or omit it), got {shown(stream_format)}"
                   + ("; server-sent events are not supported" if stream_format == "sse" else ""))
    instructions = body.get("instructions")
    if instructions is not None:
        expect_string("instructions", instructions)
    options = {"input": text, "voice": _voice(body["voice"]), "speed": _speed(body), "seed": expect_seed(body),
               "instructions": instructions}
    return model, options


async def speech(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    model, options = speech_options(body)
    registry = request.app[REGISTRY]
    job = await asyncio.to_thread(inference.speak, registry, model, options, request.path,
                                  asyncio.get_running_loop())
    response: web.StreamResponse | None = None
    try:
        while True:
            kind, payload = await job.outbox.aget()
            if kind == "error":
                error: LoomError = payload
                if response is None:
                    raise error
                log.warning("speech request %s failed after its first block: %s", job.id, error.message)
                request.transport.close()        # no end of stream: the client sees a truncated body
                return response
            if response is None:
                rate = registry.get(job.model).policy.sample_rate
                response = web.StreamResponse(headers={"Content-Type": f"audio/pcm;rate={rate};channels=1",
                                                       "Cache-Control": "no-cache"})
                await response.prepare(request)
            if kind == "audio":
                await response.write(payload)
                if not job.first_sent:
                    job.first_sent = True
                    job.report("speech_first_audio", {"bytes": len(payload),
                                                      "first_audio_ms": round(1000 * (time.time() - job.created), 3)})
            else:
                await response.write_eof()
                return response
    except (asyncio.CancelledError, ConnectionError):
        job.cancel()   # the client left: its blocks stop at the next boundary
        raise


def add_routes(add) -> None:
    add("POST", "/v1/audio/speech", speech)


__all__ = ["add_routes", "speech", "speech_options"]
