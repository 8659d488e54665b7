"""Chat completions and input-token counting (spec: "Chat completions", "Count a chat before generating").

The host checks the OpenAI-shaped fields it owns (stream, limits, tools' shape, tool_choice,
store) and rejects everything else it does not know; then one runtime call
(`loomrt.inference.chat` / `count_chat`) resolves the text deployment, runs its control
program (`TextPolicy`: sampling, thinking, model options, messages, the prompt) and starts
the generation on its `TextService`. This module only frames the generation's events as one
`chat.completion` or as `chat.completion.chunk` SSE events; the request's outcome event and
token counts come from loomrt.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from loomd.app import REGISTRY
from loomd.bodies import json_body
from loomd.errors import error_body, json_response
from loomd.jobs import finished
from loomrt import inference
from loomrt.errors import InvalidRequest, LoomError
from loomrt.fields import expect_string, reject_unknown
from loomrt.services.text import Generation
from loomrt.sessions import check_session_name

CHAT_FIELDS = ("model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
               "temperature", "top_p", "top_k", "seed", "tools", "tool_choice", "store", "enable_thinking",
               "model_options")
MAX_OUTPUT_TOKENS = 16384
MAX_TOOLS = 4096
SESSION_HEADERS = ("X-Loom-Session", "X-Loom-Checkpoint")


def _optional_bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key}: expected boolean or null, got {json.dumps(value)}", param=key)
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    """The output cap the request asks for (None: the deployment's default)."""
    given = [k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None]
    if len(given) == 2:
        raise InvalidRequest("max_tokens and max_completion_tokens are alternatives: send one", param="max_tokens")
    if not given:
        return None
    value = body[given[0]]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise InvalidRequest(f"{given[0]}: expected an integer in 1..{MAX_OUTPUT_TOKENS}, got {json.dumps(value)}",
                             param=given[0])
    return value


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise InvalidRequest(f"tools: expected a list of at most {MAX_TOOLS} function declarations", param="tools")
        for i, tool in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"),
                                                                                              dict):
                raise InvalidRequest(f"{where}: expected {{\"type\": \"function\", \"function\": {{...}}}}",
                                     param=where)
            reject_unknown(tool, ("type", "function"), f"{where}.")
            fn = tool["function"]
            reject_unknown(fn, ("name", "description", "parameters", "strict"), f"{where}.function.")
            name = fn.get("name")
            if not isinstance(name, str) or not 1 <= len(name) <= 64 or not all(c.isalnum() or c in "_-" for c in name):
                raise InvalidRequest(f"{where}.function.name: 1-64 letters, digits, '_' or '-'", param=where)
            if "description" in fn and not isinstance(fn["description"], str):
                raise InvalidRequest(f"{where}.function.description: expected string", param=where)
            if "parameters" in fn and not isinstance(fn["parameters"], dict):
                raise InvalidRequest(f"{where}.function.parameters: expected a JSON Schema object", param=where)
            if "strict" in fn and not isinstance(fn["strict"], (bool, type(None))):
                raise InvalidRequest(f"{where}.function.strict: expected boolean", param=where)
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise InvalidRequest("tool_choice: only \"auto\" (the default) and \"none\" are supported; required and "
                             "named tool choices are not", param="tool_choice")


def validate_chat(body: dict[str, Any]) -> tuple[str, bool, bool, int | None]:
    """(model, stream, include_usage, max_tokens) after the host-owned checks."""
    reject_unknown(body, CHAT_FIELDS)
    if "model" not in body:
        raise InvalidRequest("model: required field is missing", param="model")
    model = expect_string("model", body["model"])
    if "messages" not in body:
        raise InvalidRequest("messages: required field is missing", param="messages")
    stream = _optional_bool(body, "stream")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("stream_options: expected an object", param="stream_options")
        reject_unknown(options, ("include_usage",), "stream_options.")
        include_usage = _optional_bool(options, "include_usage")
        if not stream:
            raise InvalidRequest("stream_options requires stream: true", param="stream_options")
    if body.get("store") not in (None, False):
        raise InvalidRequest("store: only false is supported (nothing is stored)", param="store")
    _check_tools(body)
    return model, stream, include_usage, _max_tokens(body)


def _chunk(gen: Generation, model: str, created: int, delta: dict[str, Any], finish: str | None = None,
           usage: dict[str, Any] | None = None) -> bytes:
    body = {"id": f"chatcmpl-{gen.id}", "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else []}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


async def _stream(request: web.Request, gen: Generation, model: str, include_usage: bool) -> web.StreamResponse:
    created = int(time.time())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(_chunk(gen, model, created, {"role": "assistant", "content": ""}))
    while True:
        kind, payload = await gen.outbox.aget()
        if kind == "delta":
            await response.write(_chunk(gen, model, created, payload))
        elif kind == "done":
            delta: dict[str, Any] = {}
            if payload["tool_calls"]:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(payload["tool_calls"])]
            await response.write(_chunk(gen, model, created, delta, payload["finish_reason"]))
            if include_usage:
                await response.write(_chunk(gen, model, created, {}, usage=payload["usage"]))
            break
        else:
            error: LoomError = payload
            await response.write(b"data: " + json.dumps(error_body(error.status, error.message, error.code))
                                 .encode() + b"\n\n")
            break
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _completion(gen: Generation, model: str, result: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result["content"]}
    if result["reasoning_content"]:
        message["reasoning_content"] = result["reasoning_content"]
    if result["tool_calls"]:
        message["tool_calls"] = result["tool_calls"]
        message["content"] = result["content"] or None
    return {"id": f"chatcmpl-{gen.id}", "object": "chat.completion", "created": int(gen.created), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": result["finish_reason"]}],
            "usage": result["usage"]}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    model, stream, include_usage, max_tokens = validate_chat(body)
    session = request.headers.get("X-Loom-Session")
    if session is not None:
        check_session_name(session)
    checkpoint = request.headers.get("X-Loom-Checkpoint")
    if checkpoint is not None:
        check_session_name(checkpoint, "X-Loom-Checkpoint")
    gen = await asyncio.to_thread(inference.chat, request.app[REGISTRY], model, body, max_tokens=max_tokens,
                                  stream=stream, session=session, checkpoint=checkpoint, what=request.path,
                                  loop=asyncio.get_running_loop())
    try:
        if stream:
            return await _stream(request, gen, gen.model, include_usage)
        # a client that leaves frees its row and pages at the next step boundary
        result = await finished(gen.future, on_leave=gen.cancel)
        return json_response(_completion(gen, gen.model, result))
    except (asyncio.CancelledError, ConnectionError):
        gen.cancel()  # the client left during a stream
        raise


async def input_tokens(request: web.Request) -> web.StreamResponse:
    body = await json_body(request)
    model, _, _, max_tokens = validate_chat(body)
    for header in SESSION_HEADERS:
        if header in request.headers:
            raise InvalidRequest(f"{header} selects cached history; input-token counting is stateless and "
                                 "rejects it", param=header)
    count = await asyncio.to_thread(inference.count_chat, request.app[REGISTRY], model, body, request.path,
                                    max_tokens=max_tokens)
    return json_response({"input_tokens": count})


def add_routes(add) -> None:
    add("POST", "/v1/chat/completions", chat_completions)
    add("POST", "/v1/chat/completions/input_tokens", input_tokens)
