"""The official `openai` Python client, unmodified, against a real scout daemon.

The client only gets a base_url (`http://127.0.0.1:PORT/v1`) and a placeholder api_key;
everything else is its own request building and response parsing, so these tests check
that loomd's chat responses, SSE chunks, tool-call history and model list are shapes the
client accepts."""

from __future__ import annotations

import json

import openai
import pytest

from scout_daemon import start_scout
from tool_history import HISTORY, WEATHER

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scout-openai")
    server = start_scout(tmp, rows=2, context_length=1024, max_output_tokens=64)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


@pytest.fixture(scope="module")
def client(scout):
    with openai.OpenAI(base_url=f"http://127.0.0.1:{scout.port}/v1", api_key="unused", timeout=120,
                       max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def answer(client):
    return client.chat.completions.create(model="scout", messages=QUESTION, temperature=0, max_tokens=24)


def test_models_list_includes_scout(client):
    models = client.models.list()
    assert "scout" in [m.id for m in models.data]


def test_chat_completion(answer):
    assert answer.object == "chat.completion" and answer.model == "scout"
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_streamed_chat_concatenates_to_the_same_text(client, answer):
    stream = client.chat.completions.create(model="scout", messages=QUESTION, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage, roles = [], None, None, []
    with stream:
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                assert chunk.choices == []
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            roles.append(delta.role)
            parts.append(delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant"
    assert "".join(parts) == answer.choices[0].message.content
    assert finish == answer.choices[0].finish_reason
    assert usage is not None
    # token counts are the same; cached_tokens may differ (the second run can reuse the first's row)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens)
    assert 0 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_invalid_request_is_a_client_error(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="scout", messages=QUESTION, max_tokens=4, temperature=3)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nobody", messages=QUESTION, max_tokens=4)


def test_tool_call_round_trip(client):
    """Tools out, a generated call back as the client's own types, the result sent back in.

    The conversation (`tool_history.HISTORY`: two earlier calls of the same tool)
    makes the model call `get_weather` for London under greedy decoding; the client parses
    it, and the second turn sends the full history with that assistant `tool_calls` message
    and a `tool` result message and must get a completion back."""
    messages = HISTORY
    first = client.chat.completions.create(model="scout", messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=48)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls, choice.message
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "London"}
    calls = [c.model_dump() for c in choice.message.tool_calls]

    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"temperature_c": 18, "sky": "clear"})}
          for c in calls),
    ]
    second = client.chat.completions.create(model="scout", messages=history, tools=[WEATHER], temperature=0,
                                            max_tokens=32)
    follow = second.choices[0]
    assert follow.finish_reason in ("stop", "length", "tool_calls")
    if follow.message.tool_calls:
        for call in follow.message.tool_calls:
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(follow.message.content, str)
    # the history (tool catalog, the call written back, the result) is part of the prompt
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.completion_tokens <= 32

    # tool_choice "none" keeps the catalog and the history, and answers in text
    summary = client.chat.completions.create(model="scout", messages=history, tools=[WEATHER], tool_choice="none",
                                             temperature=0, max_tokens=8)
    assert summary.usage.prompt_tokens == second.usage.prompt_tokens
