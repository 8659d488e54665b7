"""Raw tokenization and input-token counting against a real scout daemon (spec: "Raw
tokenization", "Count a chat before generating").

One daemon for the module: scout with one row (so a single stream occupies every row) and
the tiny `mini` model, which has no tokenizer and is not a text deployment."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from conformance_support import write_document
from scout_daemon import chat, open_stream, scheduler, SseReader, start_scout, wait_idle, wait_until

MIB = 1 << 20
MAX_TOKENS = 262_144
VOCAB = 49_152


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scout-tokenize")
    server = start_scout(tmp, write_document(tmp, "mini"), rows=1, context_length=512, max_output_tokens=64)
    try:
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


def tokenize(server, body, **kw):
    return server.request("POST", "/tokenize", {"model": "scout", **body}, **kw)


def detokenize(server, body, **kw):
    return server.request("POST", "/detokenize", {"model": "scout", **body}, **kw)


def count(server, body, headers=None):
    return server.request("POST", "/v1/chat/completions/input_tokens", body, headers)


def error_of(response, status):
    assert response.status == status, (response.status, response.body[:500])
    return response.json()["error"]


# ---- /tokenize and /detokenize ------------------------------------------------------------------

def test_tokenize_defaults_parse_special_and_add_nothing(scout):
    r = tokenize(scout, {"content": "<|im_start|>"})
    assert r.status == 200, r.body
    assert r.json() == {"tokens": [1]}
    hello = tokenize(scout, {"content": "Hello!"}).json()["tokens"]
    assert hello and all(isinstance(t, int) and 0 <= t < VOCAB for t in hello)
    explicit = tokenize(scout, {"content": "Hello!", "add_special": False, "parse_special": True}).json()
    assert explicit == {"tokens": hello}
    # scout's tokenizer adds no BOS/EOS, so add_special: true changes nothing, but it is accepted
    assert tokenize(scout, {"content": "Hello!", "add_special": True}).status == 200


def test_tokenize_without_parse_special_splits_the_special_text(scout):
    tokens = tokenize(scout, {"content": "<|im_start|>", "parse_special": False}).json()["tokens"]
    assert len(tokens) > 1 and 1 not in tokens, tokens
    assert detokenize(scout, {"tokens": tokens}).json() == {"content": "<|im_start|>"}


def test_empty_content_and_empty_tokens(scout):
    assert tokenize(scout, {"content": ""}).json() == {"tokens": []}
    assert detokenize(scout, {"tokens": []}).json() == {"content": ""}


def test_detokenize_round_trip_preserves_special_tokens(scout):
    text = "<|im_start|>user\nHello, world! 123 café ünïcödé 🙂<|im_end|>\n"
    tokens = tokenize(scout, {"content": text}).json()["tokens"]
    assert tokens[0] == 1 and 2 in tokens
    assert detokenize(scout, {"tokens": tokens}).json() == {"content": text}
    assert detokenize(scout, {"tokens": [0, 1, 2]}).json() == {"content": "<|endoftext|><|im_start|><|im_end|>"}


def test_content_over_one_mib_is_413(scout):
    error = error_of(tokenize(scout, {"content": "a" * (MIB + 1)}), 413)
    assert "1048576" in error["message"]


def test_content_over_the_token_bound_is_413(scout):
    # digits tokenize one by one, so this is more than 262144 tokens in well under 1 MiB
    error_of(tokenize(scout, {"content": "1" * (MAX_TOKENS + 1)}), 413)


def test_too_many_tokens_to_detokenize_is_413(scout):
    error_of(detokenize(scout, {"tokens": [42] * (MAX_TOKENS + 1)}), 413)


def test_decoded_text_over_one_mib_is_413(scout):
    # a long token (a run of spaces): fewer than 262144 of them decode to more than 1 MiB
    [token] = tokenize(scout, {"content": " " * 16}).json()["tokens"]
    size = len(detokenize(scout, {"tokens": [token]}).json()["content"].encode())
    assert size == 16
    fits, over = MIB // size, MIB // size + 1
    assert len(detokenize(scout, {"tokens": [token] * fits}).json()["content"].encode()) == MIB
    error = error_of(detokenize(scout, {"tokens": [token] * over}), 413)
    assert str(MIB) in error["message"]


def test_with_pieces(scout):
    assert tokenize(scout, {"content": "Hi", "with_pieces": False}).status == 200
    error_of(tokenize(scout, {"content": "Hi", "with_pieces": True}), 400)


@pytest.mark.parametrize("alias", [{"prompt": "Hi"}, {"content": "Hi", "add_special_tokens": False},
                                   {"text": "Hi"}, {"content": "Hi", "messages": []}])
def test_aliases_are_unknown_fields(scout, alias):
    error_of(tokenize(scout, alias), 400)


@pytest.mark.parametrize("body", [{"content": 5}, {"content": "Hi", "add_special": 1},
                                  {"content": "Hi", "parse_special": "yes"}, {}])
def test_tokenize_wrong_fields_are_400(scout, body):
    error_of(tokenize(scout, body), 400)


def test_duplicate_field_is_400(scout):
    raw = b'{"model": "scout", "content": "a", "content": "b"}'
    error_of(scout.request("POST", "/tokenize", raw), 400)


@pytest.mark.parametrize("bad", [-1, VOCAB, "a", True, 1.5, None])
def test_invalid_token_ids_are_400(scout, bad):
    error_of(detokenize(scout, {"tokens": [1, bad]}), 400)


def test_detokenize_wrong_fields_are_400(scout):
    error_of(detokenize(scout, {"tokens": "1 2"}), 400)
    error_of(detokenize(scout, {"tokens": [1], "skip_special_tokens": True}), 400)


def test_unknown_model_is_404(scout):
    for path, body in (("/tokenize", {"content": "Hi"}), ("/detokenize", {"tokens": [1]})):
        r = scout.request("POST", path, {"model": "nobody", **body})
        error_of(r, 404)


def test_model_without_tokenizer_is_404(scout):
    for path, body in (("/tokenize", {"content": "Hi"}), ("/detokenize", {"tokens": [1]})):
        error = error_of(scout.request("POST", path, {"model": "mini", **body}), 404)
        assert "tokenizer" in error["message"]


# ---- /v1/chat/completions/input_tokens ---------------------------------------------------------------

CHAT = {"model": "scout", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Name three colours."}],
        "temperature": 0, "max_tokens": 1}


def test_input_tokens_equals_the_chats_prompt_tokens(scout):
    counted = count(scout, CHAT)
    assert counted.status == 200, counted.body
    assert set(counted.json()) == {"input_tokens"}
    n = counted.json()["input_tokens"]
    completion = chat(scout, CHAT)
    assert completion.status == 200, completion.body
    usage = completion.json()["usage"]
    assert usage["prompt_tokens"] == n
    assert usage["completion_tokens"] == 1 and usage["total_tokens"] == n + 1
    # tools are part of the rendered input: declaring one makes the count larger
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    assert count(scout, {**CHAT, "tools": [tool]}).json()["input_tokens"] > n


def test_input_tokens_with_stream_is_one_json_count(scout):
    plain = count(scout, CHAT).json()
    r = count(scout, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status == 200, r.body
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == plain


@pytest.mark.parametrize("header", ["X-Loom-Session", "X-Loom-Checkpoint"])
def test_input_tokens_rejects_session_headers(scout, header):
    error_of(count(scout, CHAT, {header: "anything"}), 400)


def test_input_tokens_validates_generation_fields(scout):
    error_of(count(scout, {**CHAT, "max_tokens": 0}), 400)
    error_of(count(scout, {**CHAT, "temperature": 3}), 400)
    error_of(count(scout, {**CHAT, "stream_options": {"include_usage": True}}), 400)
    error_of(count(scout, {**CHAT, "bogus": 1}), 400)
    error_of(count(scout, {**CHAT, "model": "nobody"}), 404)
    error_of(count(scout, {**CHAT, "model": "mini"}), 404)


def test_input_tokens_over_the_context_is_400(scout):
    long = {**CHAT, "messages": [{"role": "user", "content": "1" * 600}]}
    error = error_of(count(scout, long), 400)
    assert "512" in error["message"]


def test_input_tokens_works_while_every_row_is_busy(scout):
    wait_idle(scout)
    long = {"model": "scout", "messages": [{"role": "user", "content": "Count from 1 to 100, one per line."}],
            "temperature": 0, "max_tokens": 64, "stream": True}
    with open_stream(scout, long) as s:
        reader = SseReader(s)
        assert reader.head() == 200
        first = json.loads(reader.next_event())
        assert first["choices"][0]["delta"]["role"] == "assistant"
        busy = wait_until(lambda: (lambda s: s if s["active"] == 1 else None)(scheduler(scout)),
                          "the stream to take the only row")
        assert busy["rows"] == 1, busy
        counted = count(scout, CHAT)
        assert counted.status == 200 and counted.json()["input_tokens"] > 0, counted.body
        assert tokenize(scout, {"content": "Hello!"}).status == 200
        assert detokenize(scout, {"tokens": [1]}).status == 200
        assert scheduler(scout)["active"] == 1  # the row was busy throughout
    wait_until(lambda: scheduler(scout)["active"] == 0, "the closed stream's row to free")


# ---- utility requests in request inspection (issue 23's audit) -----------------------------------------

def journal_after(server, cursor: int) -> tuple[list[dict], int]:
    """Every journal entry after `cursor`, paging /logz to the end, and the cursor after them."""
    out = []
    while True:
        r = server.request("GET", f"/logz?cursor={cursor}&limit=1000")
        assert r.status == 200, r.body
        page = [json.loads(line) for line in r.body.decode().splitlines()]
        cursor = int(r.headers["x-loom-cursor"])
        if not page:
            return out, cursor
        out += [e for e in page if e.get("event") != "gap"]


def scout_tokens(server) -> dict[str, float]:
    """loom_tokens_total of scout by direction (the inference-token counters)."""
    text = server.request("GET", "/metrics").body.decode()
    found = re.findall(r'^loom_tokens_total\{direction="(\w+)",model="scout"\} (\S+)$', text, re.M)
    return {d: float(v) for d, v in found}


def test_utility_requests_end_with_a_request_event_and_count_no_tokens(scout):
    """Spec: utility requests appear in request inspection and outcome counters, but never
    increment inference-token counters. Each one is a `request` journal entry (its kind,
    route and what it counted; a failure with its error), published before the answer."""
    _, cursor = journal_after(scout, 0)
    tokens_before = scout_tokens(scout)
    ids = tokenize(scout, {"content": "Hello!"}).json()["tokens"]
    assert detokenize(scout, {"tokens": ids}).status == 200
    n = count(scout, CHAT).json()["input_tokens"]
    error_of(tokenize(scout, {"content": "1" * (MAX_TOKENS + 1)}), 413)
    entries, _ = journal_after(scout, cursor)
    requests = [e for e in entries if e["event"] == "request"]
    shown = [(e["kind"], e["route"], e["model"]) for e in requests]
    assert shown == [("tokenize", "/tokenize", "scout"), ("detokenize", "/detokenize", "scout"),
                     ("input_tokens", "/v1/chat/completions/input_tokens", "scout"),
                     ("tokenize", "/tokenize", "scout")], requests
    assert requests[0]["tokens"] == len(ids) and requests[1]["tokens"] == len(ids)
    assert requests[2]["input_tokens"] == n and "prompt_tokens" not in requests[2]
    assert "error" not in requests[0] and requests[3]["error"]["status"] == 413, requests
    assert len({e["request"] for e in requests}) == 4   # request ids, as /v1/requests shows them
    assert scout_tokens(scout) == tokens_before


LONG_TEXT = "Hello world, this is text. " * 30_000   # ~210,000 tokens: under the bound, a visible moment of work


def test_a_running_utility_request_is_listed(scout):
    """While a tokenizer works on a long text, `/v1/requests` lists it (kind, model, state);
    polled with a deadline, re-sending the long tokenize until a poll catches one."""
    stop = threading.Event()
    statuses: list[int] = []

    def work() -> None:
        while not stop.is_set():
            statuses.append(tokenize(scout, {"content": LONG_TEXT}, timeout=120).status)

    worker = threading.Thread(target=work, name="long-tokenize")
    worker.start()
    try:
        deadline = time.monotonic() + 120
        listed = None
        while listed is None:
            assert time.monotonic() < deadline, "no utility request was ever listed by /v1/requests"
            page = scout.request("GET", "/v1/requests?model=scout").json()
            listed = next((r for r in page["data"] if r["kind"] == "tokenize"), None)
    finally:
        stop.set()
        worker.join(timeout=240)
    assert not worker.is_alive()
    assert set(statuses) <= {200}, statuses
    assert {k: listed[k] for k in ("object", "model", "kind", "state", "utility")} == {
        "object": "request", "model": "scout", "kind": "tokenize", "state": "active", "utility": True}, listed
    assert isinstance(listed["id"], int) and listed["id"] > 0
    assert scout.request("GET", "/v1/requests?model=scout").json()["data"] == []
