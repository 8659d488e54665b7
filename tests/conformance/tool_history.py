"""Conversations with tool calls for scout, shared by the tool-call and openai-client tests.

Under greedy decoding, scout answers `HISTORY` (two earlier calls of `get_weather`) with a
well-formed third call, for London, and `ONE_SHOT` (one earlier call) with a malformed one.
"""

from __future__ import annotations

import json

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(i: int, city: str) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def _result(i: int) -> dict:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps({"temperature_c": 18})}


ONE_SHOT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(0, "Paris")]}, _result(0),
    {"role": "assistant", "content": "It is 18 degrees in Paris."},
    {"role": "user", "content": "Weather in London?"},
]
HISTORY = ONE_SHOT[:4] + [
    {"role": "user", "content": "Weather in Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(1, "Rome")]}, _result(1),
    {"role": "assistant", "content": "It is 18 degrees in Rome."},
    {"role": "user", "content": "Weather in London?"},
]

__all__ = ["HISTORY", "ONE_SHOT", "WEATHER"]
