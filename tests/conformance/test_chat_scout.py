"""Chat completions served by a real `loomd` running scout (spec: "Chat completions").

Three daemons, each started once: `scout` (4 rows, plus the tiny `mini` model, which is
not a text deployment) for results, validation and batching; `busy` (1 row, 1 pending
slot) for admission; and a dedicated one that the SIGTERM test stops. Generations are
greedy (temperature 0) and short, so every expectation is about the protocol and about
requests agreeing with each other, never about what the model says (except "Paris")."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conformance_support import write_document
from scout_daemon import (READY_DEADLINE_S, SseReader, chat, open_stream, scheduler, start_scout, stream_chat,
                          stream_result, wait_idle, wait_until)

PARIS = {"model": "scout", "messages": [{"role": "user", "content": "What is the capital of France?"}],
         "temperature": 0, "max_tokens": 24}
LONG = {"model": "scout", "messages": [{"role": "user", "content": "Count from 1 to 100, one per line."}],
        "temperature": 0, "max_tokens": 64}


SCOUT_MAX_OUTPUT = 96   # the `scout` daemon's limits.max_output_tokens (above LONG's 72-token test)


def body(content: str, max_tokens: int, **extra) -> dict:
    return {"model": "scout", "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": max_tokens, **extra}


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scout-chat")
    server = start_scout(tmp, write_document(tmp, "mini"), rows=4, context_length=512,
                         max_output_tokens=SCOUT_MAX_OUTPUT)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scout-busy")
    server = start_scout(tmp, rows=1, context_length=512, max_output_tokens=64, pending_capacity=1)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


@pytest.fixture(scope="module")
def paris(scout):
    """The greedy non-streamed answer to PARIS, with its input-token count. The daemon's first
    request loads (on a cold cache: compiles) its kernels, so it gets the readiness deadline."""
    r = chat(scout, PARIS, timeout=READY_DEADLINE_S)
    assert r.status == 200, r.body
    counted = scout.request("POST", "/v1/chat/completions/input_tokens", PARIS)
    assert counted.status == 200, counted.body
    return r.json(), counted.json()["input_tokens"]


def error_of(response, status):
    assert response.status == status, (response.status, response.body[:500])
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


# ---- results ----------------------------------------------------------------------------------

def test_greedy_answer_names_paris(paris):
    completion, input_tokens = paris
    assert completion["object"] == "chat.completion"
    assert completion["id"].startswith("chatcmpl-") and completion["model"] == "scout"
    (choice,) = completion["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    usage = completion["usage"]
    assert usage["prompt_tokens"] == input_tokens
    assert 0 < usage["completion_tokens"] <= PARIS["max_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_stream_matches_the_complete_response(scout, paris):
    completion, _ = paris
    status, events = stream_chat(scout, {**PARIS, "stream_options": {"include_usage": True}})
    assert status == 200, events
    result = stream_result(events)
    assert result["role"] == "assistant"
    assert result["content"] == completion["choices"][0]["message"]["content"]
    assert result["finish_reason"] == completion["choices"][0]["finish_reason"]
    assert token_counts(result["usage"]) == token_counts(completion["usage"])
    # without include_usage there is no usage-only chunk
    status, events = stream_chat(scout, {**PARIS, "max_tokens": 2})
    plain = stream_result(events)
    assert plain["usage"] is None
    assert completion["choices"][0]["message"]["content"].startswith(plain["content"])
    if completion["usage"]["completion_tokens"] > 2:
        assert plain["finish_reason"] == "length"


def test_a_response_longer_than_the_output_credit(scout):
    """More text events than one row's output credit (64): the streamed reader takes them
    as they come, and a complete (non-streamed) response, which has no incremental
    reader, must not stall on them."""
    request = {**LONG, "max_tokens": 72}
    with ThreadPoolExecutor(1) as pool:  # both at once: they share steps
        complete = pool.submit(chat, scout, request, timeout=180)
        status, events = stream_chat(scout, request)
        r = complete.result(timeout=300)
    assert status == 200, events
    streamed = stream_result(events)
    deltas = sum(1 for c in streamed["chunks"] if c["choices"][0]["delta"].get("content"))
    assert deltas > 64, f"the prompt should produce more than 64 text deltas, got {deltas}"
    assert r.status == 200, r.body
    assert r.json()["choices"][0]["message"]["content"] == streamed["content"]
    assert r.json()["choices"][0]["finish_reason"] == streamed["finish_reason"]


def test_small_max_tokens_finishes_with_length(scout):
    for key in ("max_tokens", "max_completion_tokens"):
        request = body("Tell me a long story about a dragon.", 1)
        del request["max_tokens"]
        r = chat(scout, {**request, key: 3})
        assert r.status == 200, r.body
        result = r.json()
        assert result["choices"][0]["finish_reason"] == "length"
        assert result["usage"]["completion_tokens"] == 3


# ---- validation -------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Current weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}

BAD_REQUESTS = {
    "stream_options without stream": {"stream_options": {"include_usage": True}},
    "stream_options with stream false": {"stream": False, "stream_options": {"include_usage": True}},
    "unknown stream_options field": {"stream": True, "stream_options": {"include_obfuscation": True}},
    "stream not a boolean": {"stream": "yes"},
    "both limits": {"max_tokens": 4, "max_completion_tokens": 4},
    "max_tokens 0": {"max_tokens": 0},
    "max_tokens 16385": {"max_tokens": 16385},
    "max_completion_tokens 0": {"max_tokens": None, "max_completion_tokens": 0},
    "max_tokens not an integer": {"max_tokens": 4.5},
    "tool_choice required": {"tools": [WEATHER], "tool_choice": "required"},
    "named tool_choice": {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "weather"}}},
    "store true": {"store": True},
    "unknown field": {"frequency_penalty": 0.5},
    "temperature 3": {"temperature": 3},
    "top_p 0": {"top_p": 0},
    "top_k not an integer": {"top_k": 1.5},
    "enable_thinking true": {"enable_thinking": True},
    "model_options": {"model_options": {"x": 1}},
    "tools not a list": {"tools": {"type": "function"}},
    "tool without function": {"tools": [{"type": "function"}]},
    "tool of another type": {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
    "tool with a bad name": {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
    "tool with bad parameters": {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
    "tool with an unknown field": {"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
    "messages missing": {"messages": None},
    "empty messages": {"messages": []},
    "unknown role": {"messages": [{"role": "robot", "content": "Hi"}]},
    "image content": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
}


@pytest.mark.parametrize("change", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_invalid_requests_are_400(scout, change):
    request = {**body("Hi", 4), **change}
    for key in [k for k, v in change.items() if v is None]:
        request.pop(key)
    error = error_of(chat(scout, request), 400)
    assert error["type"] == "invalid_request_error"


def test_allowed_optional_values_are_accepted(scout):
    # enable_thinking false, empty model_options, store false, tool_choice none, nulls
    r = chat(scout, body("Hi", 1, enable_thinking=False, model_options={}, store=False, tools=[WEATHER],
                         tool_choice="none", stream=None, top_p=None, top_k=None, seed=7))
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] == 1


def test_duplicate_field_is_400(scout):
    raw = json.dumps(body("Hi", 1))[:-1] + ', "max_tokens": 2}'
    error = error_of(scout.request("POST", "/v1/chat/completions", raw), 400)
    assert "max_tokens" in error["message"]


def test_discovery_reports_the_text_capabilities(scout):
    models = {m["id"]: m for m in scout.request("GET", "/v1/models").json()["data"]}
    loom = models["scout"]["loom"]
    assert loom["endpoint"] == "/v1/chat/completions"
    assert loom["tokenize"] is True and loom["input_tokens"] is True
    assert loom["context_length"] == 512 and loom["limits"] == {"max_output_tokens": SCOUT_MAX_OUTPUT}


def test_bad_session_names_and_checkpoints_are_400(scout):
    for name in ("", "a b", "x" * 65, "é", "a/b"):
        error_of(chat(scout, body("Hi", 1), **{"X-Loom-Session": name}), 400)
    error_of(chat(scout, body("Hi", 1), **{"X-Loom-Checkpoint": "a b"}), 400)
    error_of(chat(scout, body("Hi", 1), **{"X-Loom-Checkpoint": "abc"}), 404)   # no such checkpoint


def test_unknown_model_is_404(scout):
    error_of(chat(scout, {**body("Hi", 1), "model": "nobody"}), 404)


def test_a_model_that_is_not_text_is_404(scout):
    error = error_of(chat(scout, {**body("Hi", 1), "model": "mini"}), 404)
    assert "mini" in error["message"]


def test_prompt_longer_than_the_context_is_400(scout):
    r = chat(scout, body("1" * 600, 4))
    error = error_of(r, 400)
    needed = re.search(r"needs (\d+) tokens", error["message"])
    assert needed and int(needed.group(1)) > 512, error["message"]
    assert "512" in error["message"]
    assert scheduler(scout)["pending"] == 0


# ---- batching --------------------------------------------------------------------------------------

MIXED = [
    body("What is the capital of France?", 6),
    body("Name a fruit that is yellow.", 4),
    body("Write one sentence about the sea.", 8),
    body("What is 2 + 2?", 5),
    body("Say hello in Spanish.", 3),
    body("List three colours.", 7),
    body("Who wrote Hamlet?", 6),
    body("Describe a cat in five words.", 8),
]


def token_counts(usage: dict) -> dict:
    """Usage without `cached_tokens`: how much of a prompt is reused depends on which retained
    histories are resident (issue: retained conversations), never the text or the counts."""
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached < usage["prompt_tokens"], usage
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def run(server, request, streamed):
    """(content, finish_reason, usage counts) of one chat, streamed (with usage) or not."""
    if streamed:
        status, events = stream_chat(server, {**request, "stream_options": {"include_usage": True}})
        assert status == 200, events
        result = stream_result(events)
        return result["content"], result["finish_reason"], token_counts(result["usage"])
    r = chat(server, request)
    assert r.status == 200, r.body
    choice = r.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"], token_counts(r.json()["usage"])


@pytest.fixture(scope="module")
def alone(scout):
    """Each MIXED request's result when it runs by itself (odd ones streamed)."""
    return [run(scout, request, i % 2 == 1) for i, request in enumerate(MIXED)]


def test_concurrent_requests_return_what_they_return_alone(scout, alone):
    wait_idle(scout)
    start = threading.Barrier(len(MIXED))

    def one(i):
        start.wait(timeout=30)
        return run(scout, MIXED[i], i % 2 == 1)

    with ThreadPoolExecutor(len(MIXED)) as pool:
        together = list(pool.map(one, range(len(MIXED)), timeout=300))
    for i, (got, expected) in enumerate(zip(together, alone)):
        assert got == expected, (i, MIXED[i]["messages"][0]["content"])
    wait_idle(scout)


def test_disconnect_mid_stream_frees_its_row_while_others_finish(scout, alone):
    """A client that leaves mid-stream gives back its row and KV pages at a step boundary
    (found when the next chunk cannot be written), while the other streams go on."""
    wait_idle(scout)
    before = scheduler(scout)
    leaving = open_stream(scout, {**LONG, "stream": True})
    reader = SseReader(leaving)
    assert reader.head() == 200
    while not json.loads(reader.next_event())["choices"][0]["delta"].get("content"):
        pass  # wait for generated text: the row is decoding

    others = [0, 3]
    streams = [open_stream(scout, {**MIXED[i], "stream": True, "stream_options": {"include_usage": True}})
               for i in others]
    try:
        readers = [SseReader(s) for s in streams]
        for other in readers:  # both others are generating when the first client leaves
            assert other.head() == 200
            while not json.loads(other.next_event())["choices"][0]["delta"].get("content"):
                pass
        leaving.close()
        for i, other in zip(others, readers):
            result = stream_result(other.read_all())
            assert (result["content"], result["finish_reason"], token_counts(result["usage"])) == alone[i]
    finally:
        for stream in streams:
            stream.close()
    idle = wait_idle(scout)
    # the closed request would have needed at least max_tokens steps to end by itself
    assert idle["steps"] - before["steps"] < LONG["max_tokens"], (before, idle)
    # no page is held but by retained (finished) histories: the cancelled row kept nothing
    assert idle["pages_used"] == idle["pages_retained"], idle


def test_disconnect_before_a_complete_response_frees_its_row(scout):
    """A non-streamed request whose client leaves is cancelled at the next step boundary (the
    handler is cancelled with the connection), not when its finished response is written."""
    wait_idle(scout)
    before = scheduler(scout)
    leaving = open_stream(scout, LONG)    # stream omitted: one JSON response at the end
    wait_until(lambda: scheduler(scout)["active"] == 1, "the request to be decoding")
    leaving.close()
    idle = wait_idle(scout)
    assert idle["steps"] - before["steps"] < LONG["max_tokens"], (before, idle)
    assert idle["pages_used"] == idle["pages_retained"], idle


# ---- admission -----------------------------------------------------------------------------------

def test_full_queue_is_503_and_a_queued_request_starts_when_the_row_frees(busy):
    wait_idle(busy)
    short = body("Say hello in Spanish.", 4, stream=True)
    holder = open_stream(busy, {**LONG, "stream": True})
    try:
        wait_until(lambda: scheduler(busy)["active"] == 1, "the long stream to take the only row")
        with open_stream(busy, short) as queued:
            wait_until(lambda: scheduler(busy)["pending"] == 1, "the short stream to queue")
            error = error_of(chat(busy, body("Hi", 1)), 503)
            assert error["code"] == "queue_full"
            status, events = stream_chat(busy, body("Hi", 1))
            assert status == 503, events
            assert scheduler(busy)["pending"] == 1
            holder.close()  # the row frees: the queued stream starts and completes
            reader = SseReader(queued)
            assert reader.head() == 200
            result = stream_result(reader.read_all())
        assert result["finish_reason"] in ("stop", "length")
        alone = chat(busy, {**short, "stream": False})
        assert alone.status == 200, alone.body
        assert result["content"] == alone.json()["choices"][0]["message"]["content"]
    finally:
        holder.close()
    wait_idle(busy)


def test_sigterm_finishes_streams_in_flight_then_exits_0(tmp_path):
    """SIGTERM closes admission but lets accepted streams end normally, then loomd exits 0.
    The second stream omits max_tokens: the deployment's default cap (10 here) applies."""
    default_cap = 10
    server = start_scout(tmp_path, rows=2, context_length=256, max_output_tokens=default_cap)
    try:
        requests = [body("What is the capital of France?", 8, stream=True, stream_options={"include_usage": True}),
                    {**body("Write one sentence about the sea.", 1, stream=True,
                            stream_options={"include_usage": True}), "max_tokens": None}]
        sockets = [open_stream(server, r) for r in requests]
        readers = [SseReader(s) for s in sockets]
        for reader in readers:
            assert reader.head() == 200
            while not json.loads(reader.next_event())["choices"][0]["delta"].get("content"):
                pass
        server.process.send_signal(signal.SIGTERM)
        for reader, cap in zip(readers, (8, default_cap)):
            result = stream_result(reader.read_all())
            assert result["finish_reason"] in ("stop", "length")
            assert result["usage"]["completion_tokens"] <= cap
            if result["finish_reason"] == "length":
                assert result["usage"]["completion_tokens"] == cap
        for s in sockets:
            s.close()
        assert server.process.wait(timeout=60) == 0, "".join(server.output)
    finally:
        code = server.stop()
    assert code == 0, "".join(server.output)
    assert "loomd: stopped" in "".join(server.output)


# ---- issue 23's audit: deviations from the spec, each pinned ---------------------------------------

@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_an_output_cap_above_the_advertised_limit_is_400(scout, key):
    """Discovery advertises `limits.max_output_tokens`; a request above it is refused, naming
    the field and the limit, by generation and by input-token counting alike."""
    advertised = {m["id"]: m for m in scout.request("GET", "/v1/models").json()["data"]}["scout"]["loom"]["limits"]
    limit = advertised["max_output_tokens"]
    request = body("Hi", 1)
    del request["max_tokens"]
    for path in ("/v1/chat/completions", "/v1/chat/completions/input_tokens"):
        error = error_of(scout.request("POST", path, {**request, key: limit + 1}), 400)
        assert error["param"] == key and str(limit) in error["message"], error
        assert "limits.max_output_tokens" in error["message"], error
    counted = scout.request("POST", "/v1/chat/completions/input_tokens", {**request, key: limit})
    assert counted.status == 200, counted.body
    r = chat(scout, {**request, key: limit})   # "Hi" ends its turn long before the cap
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] <= limit


CURL_BODY = {"model": "scout", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}


def test_curl_default_content_type_with_a_json_body_is_accepted(scout):
    """`curl URL -d '{...}'` labels the JSON application/x-www-form-urlencoded (what people
    type first): run curl itself, as a user would, and get the completion."""
    url = f"http://127.0.0.1:{scout.port}/v1/chat/completions"
    done = subprocess.run(["curl", "-sS", "--fail-with-body", "--max-time", "120", url, "-d", json.dumps(CURL_BODY)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert result["object"] == "chat.completion" and result["usage"]["completion_tokens"] == 1


def test_real_form_data_is_still_400(scout):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    for raw in (b"a=1&b=2", b"model=scout&messages=hi", b"[1, 2]"):
        error = error_of(scout.request("POST", "/v1/chat/completions", raw, form), 400)
        assert "application/json" in error["message"], error
    # a body that starts like JSON under the form type is strict JSON like any other
    duplicate = json.dumps(CURL_BODY)[:-1] + ', "max_tokens": 2}'
    error = error_of(scout.request("POST", "/v1/chat/completions", duplicate, form), 400)
    assert error["param"] == "max_tokens", error
    error = error_of(scout.request("POST", "/v1/chat/completions", json.dumps(CURL_BODY), {"Content-Type": "text/plain"}),
                     400)
    assert "application/json" in error["message"], error


UNKNOWN_MESSAGE_FIELDS = {
    "name on a user message": ([{"role": "user", "content": "Hi", "name": "ann"}], "messages[0].name"),
    "name on a system message": ([{"role": "system", "content": "Be brief.", "name": "x"},
                                  {"role": "user", "content": "Hi"}], "messages[0].name"),
    "tool_call_id on a user message": ([{"role": "user", "content": "Hi", "tool_call_id": "call_0"}],
                                       "messages[0].tool_call_id"),
    "tool_calls on a user message": ([{"role": "user", "content": "Hi", "tool_calls": []}], "messages[0].tool_calls"),
    "tool_call_id on an assistant message": ([{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello.", "tool_call_id": "c"},
                                             {"role": "user", "content": "Again"}], "messages[1].tool_call_id"),
    "an unknown field": ([{"role": "user", "content": "Hi", "weight": 2}], "messages[0].weight"),
    "an unknown field in a text part": ([{"role": "user", "content": [{"type": "text", "text": "Hi", "lang": "en"}]}],
                                        "messages[0].content[0].lang"),
    "an unknown role": ([{"role": "robot", "content": "Hi"}], "messages[0].role"),
}


@pytest.mark.parametrize("messages, param", UNKNOWN_MESSAGE_FIELDS.values(), ids=UNKNOWN_MESSAGE_FIELDS.keys())
def test_a_message_field_the_template_does_not_render_is_400(scout, messages, param):
    """Unknown fields reject (spec), inside messages too: scout's policy declares each role's
    fields (`message_fields()`), and a field it would drop is named instead of ignored."""
    for path in ("/v1/chat/completions", "/v1/chat/completions/input_tokens"):
        error = error_of(scout.request("POST", path, {**body("Hi", 1), "messages": messages}), 400)
        assert error["param"] == param, error
        assert param in error["message"], error


def test_the_fields_each_role_may_carry_are_accepted(scout):
    """A tool result's tool_call_id, an assistant's tool_calls and text parts are rendered
    or accepted: the fields an OpenAI client sends for a tool conversation."""
    call = {"id": "call_0", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": "18 degrees"},
                {"role": "user", "content": "Thanks."}]
    r = chat(scout, {**body("Hi", 1), "messages": messages, "tools": [WEATHER]})
    assert r.status == 200, r.body


@pytest.mark.parametrize("seed", [18446744073709551616, -18446744073709551616, 10**30])
def test_a_seed_beyond_64_bits_is_named_out_of_range(scout, seed):
    """Not "the body is not valid JSON": the field, its value and the range are named."""
    error = error_of(chat(scout, body("Hi", 1, seed=seed)), 400)
    assert error["param"] == "seed", error
    assert error["message"].startswith(f"seed: {seed} is out of range"), error
    assert "18446744073709551615" in error["message"], error
    assert "not valid JSON" not in error["message"], error


def test_the_largest_seed_is_accepted(scout):
    assert chat(scout, body("Hi", 1, seed=18446744073709551615)).status == 200
