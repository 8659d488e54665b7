"""Tool calls the model itself generates, through `/v1/chat/completions` (spec: "Chat completions").

scout's control program owns the tool grammar (`<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`, docs in samples/scout/README.md). The 135M model rarely calls a tool from a
bare question, but greedy decoding after a conversation that already holds two calls of the
same tool (`tool_history.HISTORY`) reliably writes a third, well-formed one; after a single example
(`ONE_SHOT`) it writes a malformed one (an unclosed tag around the tool's result). Greedy
outputs do not depend on batching (docs/language.md §9), so these are fixed inputs with
fixed outputs, and the tests check what the server makes of each:

* a well-formed call becomes structured `tool_calls` (finish_reason "tool_calls"), whole, in
  a complete response and in the final chunk of a stream, never as content text;
* `tool_choice: "none"` with the same history rejects the call at the completion boundary;
* malformed syntax fails the completion: no partial call and no tag text is published.
"""

from __future__ import annotations

import json

import pytest

from scout_daemon import chat, start_scout, stream_chat, stream_result
from tool_history import HISTORY, ONE_SHOT, WEATHER

TIMEOUT = 300.0   # a hang guard: the first request loads every kernel, on a shared machine

@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    server = start_scout(tmp_path_factory.mktemp("scout-tools"), rows=2, context_length=1024, max_output_tokens=64)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


def _request(messages: list[dict], **extra) -> dict:
    return {"model": "scout", "messages": messages, "tools": [WEATHER], "temperature": 0, "max_tokens": 48,
            **extra}


def _assert_london_call(calls: list[dict]) -> None:
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["type"] == "function" and isinstance(call["id"], str) and call["id"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "London"}


def test_a_generated_call_is_a_structured_tool_call(scout):
    r = chat(scout, _request(HISTORY), timeout=TIMEOUT)
    assert r.status == 200, r.body
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None        # the call's text is not content
    _assert_london_call(choice["message"]["tool_calls"])


def test_a_streamed_call_arrives_whole_in_the_final_chunk(scout):
    status, events = stream_chat(scout, _request(HISTORY), timeout=TIMEOUT)
    assert status == 200, events
    result = stream_result(events)
    assert result["finish_reason"] == "tool_calls"
    assert "<tool_call>" not in result["content"] and "get_weather" not in result["content"]
    final = result["chunks"][-1]["choices"][0]["delta"]
    assert [c.pop("index") for c in final["tool_calls"]] == [0]
    _assert_london_call(final["tool_calls"])
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in result["chunks"][:-1])


def test_tool_choice_none_rejects_the_generated_call(scout):
    r = chat(scout, _request(HISTORY, tool_choice="none"), timeout=TIMEOUT)
    assert r.status == 500, r.body
    error = r.json()["error"]
    assert "tool_choice" in error["message"] and error["type"] and error["code"]


def test_malformed_call_syntax_fails_without_publishing_a_partial_call(scout):
    r = chat(scout, _request(ONE_SHOT), timeout=TIMEOUT)
    assert r.status == 500, r.body
    assert "tool call" in r.json()["error"]["message"]

    status, events = stream_chat(scout, _request(ONE_SHOT), timeout=TIMEOUT)
    assert status == 200 and events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    assert "error" in chunks[-1] and "tool call" in chunks[-1]["error"]["message"], chunks[-1]
    published = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert "<tool_call" not in published and "temperature" not in published, published
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks[:-1])
