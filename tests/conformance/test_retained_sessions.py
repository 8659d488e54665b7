"""Retained conversations over HTTP (spec: "Retained conversations"): automatic reuse of an idle
row's history, named sessions (`X-Loom-Session`), the prefix cache (`prefix_cache_capacity`),
`cached_tokens`, and `/v1/sessions`.

Correctness is always judged against a fresh replay: the same request sent to a twin
deployment of the same weights that holds no history gives the same greedy text, so reuse
changes only how much is prefilled (`cached_tokens`), never the answer."""

from __future__ import annotations

import itertools
import json
import threading

import pytest

from conformance_support import SseReader
from scout_daemon import chat, open_stream, scheduler, scout_document, start_scout, stream_result, wait_until

SYSTEM = {"role": "system", "content": "Be brief."}


# The first of two requests on one session runs this many tokens, so that it is still running
# when the second arrives (24 took about 100 ms on a fast machine)
BUSY_TOKENS = 160


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retained")
    twin = scout_document(tmp, "twin", rows=2, context_length=512, max_output_tokens=24)
    other = scout_document(tmp, "other", rows=2, context_length=512, max_output_tokens=24,
                           session_cache_capacity=2)
    prefixed = scout_document(tmp, "prefixed", rows=1, context_length=1024, max_output_tokens=24,
                              pool_capacity=4096, prefix_cache_capacity=3072)
    daemon = start_scout(tmp, twin, other, prefixed, rows=2, context_length=512, max_output_tokens=BUSY_TOKENS,
                         session_cache_capacity=2)
    try:
        for model in ("scout", "twin", "other", "prefixed"):  # a deployment's first step loads its kernels: slow once
            r = chat(daemon, {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
                     timeout=300)
            assert r.status == 200, r.body
        yield daemon
    finally:
        assert daemon.stop() == 0


def ask(server, model, messages, **headers):
    r = chat(server, {"model": model, "messages": messages, "temperature": 0, "max_tokens": 24}, timeout=180,
             **headers)
    assert r.status == 200, r.body
    body = r.json()
    return body["choices"][0]["message"]["content"], body["usage"]


def ask_streamed(server, model, messages, **headers):
    """The same turn as `ask`, streamed (SSE), with the usage chunk."""
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 24, "stream": True,
            "stream_options": {"include_usage": True}}
    with open_stream(server, body, timeout=180, headers=headers or None) as s:
        reader = SseReader(s)
        status = reader.head()
        assert status == 200, reader.buf.decode(errors="replace")
        result = stream_result(reader.read_all())
    return result["content"], result["usage"]


REPLAYS = itertools.count(1)


def replay_on(server, model, messages):
    """A fresh replay on `model` itself: a session name never used before has no history to
    take (untagged histories are no candidates for a named request), so all is prefilled."""
    text, usage = ask(server, model, messages, **{"X-Loom-Session": f"replay-{next(REPLAYS)}"})
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0, usage
    return text, usage


def position_of(server, model, session):
    """The consumed position `/v1/sessions` lists for a named history: the length it holds."""
    listed = server.request("GET", f"/v1/sessions?model={model}&limit=1000").json()["data"]
    mine = [s for s in listed if s["session"] == session and s["model"] == model]
    assert len(mine) == 1, json.dumps(listed)
    return mine[0]["position"]


def fresh(server, messages):
    """The answer with no reusable history: the twin deployment, its rows evicted first."""
    for i in range(2):  # two unrelated requests take both of the twin's rows
        ask(server, "twin", [{"role": "user", "content": f"Say the number {i + 40}."}])
    return ask(server, "twin", messages)


def test_second_turn_reuses_the_first_turns_row(server):
    first = [SYSTEM, {"role": "user", "content": "Name a large city in Japan."}]
    answer, usage1 = ask(server, "scout", first)
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in Italy?"}]
    text, usage2 = ask(server, "scout", second)
    assert usage2["prompt_tokens_details"]["cached_tokens"] >= \
        usage1["prompt_tokens"] + usage1["completion_tokens"] - 1, (usage1, usage2)
    replay_text, replay_usage = fresh(server, second)
    assert text == replay_text
    assert replay_usage["prompt_tokens"] == usage2["prompt_tokens"]


def test_edited_history_replays_a_shorter_prefix(server):
    first = [SYSTEM, {"role": "user", "content": "What colour is the sky on a clear day?"}]
    answer, usage1 = ask(server, "scout", first)
    edited = [SYSTEM, {"role": "user", "content": "What colour is grass?"}, {"role": "assistant", "content": answer},
              {"role": "user", "content": "Why?"}]
    text, usage2 = ask(server, "scout", edited)
    cached = usage2["prompt_tokens_details"]["cached_tokens"]
    assert cached < usage1["prompt_tokens"], (usage1, usage2)
    assert text == fresh(server, edited)[0]


def test_named_session_continues_its_own_history(server):
    first = [{"role": "user", "content": "Remember the word lantern."}]
    answer, usage1 = ask(server, "scout", first, **{"X-Loom-Session": "s-1"})
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which word?"}]
    text, usage2 = ask(server, "scout", second, **{"X-Loom-Session": "s-1"})
    assert usage2["prompt_tokens_details"]["cached_tokens"] >= \
        usage1["prompt_tokens"] + usage1["completion_tokens"] - 1
    assert text == fresh(server, second)[0]
    sessions = server.request("GET", "/v1/sessions").json()["data"]
    mine = [s for s in sessions if s["session"] == "s-1" and s["model"] == "scout"]
    assert len(mine) == 1 and mine[0]["position"] >= usage2["prompt_tokens"]
    assert mine[0]["residency"] in ("row", "host")


def test_untagged_requests_do_not_take_a_named_history(server):
    messages = [{"role": "user", "content": "Spell the word river."}]
    ask(server, "scout", messages, **{"X-Loom-Session": "s-2"})
    _, usage = ask(server, "scout", messages)   # same prompt, untagged: the session is not a candidate
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


def test_same_session_name_on_two_deployments_is_independent(server):
    """Two conversations that part after the shared system prompt, each under the name `shared`
    on its own deployment. Each second turn takes exactly its own deployment's history: the
    whole of it (`cached_tokens` equals the position that deployment lists), which the other
    deployment's history, a different conversation, could not give."""
    a = [{"role": "user", "content": "Count to three."}]
    b = [{"role": "user", "content": "Name a fruit."}]
    answer_a, _ = ask(server, "scout", a, **{"X-Loom-Session": "shared"})
    answer_b, _ = ask(server, "other", b, **{"X-Loom-Session": "shared"})
    held = {"scout": position_of(server, "scout", "shared"), "other": position_of(server, "other", "shared")}
    a2 = a + [{"role": "assistant", "content": answer_a}, {"role": "user", "content": "And then?"}]
    b2 = b + [{"role": "assistant", "content": answer_b}, {"role": "user", "content": "Another one?"}]
    text_a, usage_a = ask(server, "scout", a2, **{"X-Loom-Session": "shared"})
    text_b, usage_b = ask(server, "other", b2, **{"X-Loom-Session": "shared"})
    assert usage_a["prompt_tokens_details"]["cached_tokens"] == held["scout"], (held, usage_a)
    assert usage_b["prompt_tokens_details"]["cached_tokens"] == held["other"], (held, usage_b)
    assert text_a == replay_on(server, "scout", a2)[0]
    assert text_b == replay_on(server, "other", b2)[0]
    listed = {(s["model"], s["session"]) for s in server.request("GET", "/v1/sessions").json()["data"]}
    assert {("scout", "shared"), ("other", "shared")} <= listed


def test_streamed_and_json_turns_alternate_on_one_session(server):
    """A streamed turn, a JSON turn, a streamed turn on one X-Loom-Session: each continues the
    whole history the previous one left (whatever its framing) and answers as a replay does."""
    headers = {"X-Loom-Session": "alt"}
    first = [{"role": "user", "content": "Name a planet."}]
    answer1, usage1 = ask_streamed(server, "scout", first, **headers)
    assert usage1["prompt_tokens_details"]["cached_tokens"] == 0
    held = position_of(server, "scout", "alt")
    assert held >= usage1["prompt_tokens"] + usage1["completion_tokens"] - 1, (held, usage1)

    second = first + [{"role": "assistant", "content": answer1}, {"role": "user", "content": "Is it large?"}]
    answer2, usage2 = ask(server, "scout", second, **headers)              # JSON, reusing the stream's row
    assert usage2["prompt_tokens_details"]["cached_tokens"] == held, (held, usage2)
    held = position_of(server, "scout", "alt")
    assert held >= usage2["prompt_tokens"] + usage2["completion_tokens"] - 1, (held, usage2)

    third = second + [{"role": "assistant", "content": answer2}, {"role": "user", "content": "Why?"}]
    answer3, usage3 = ask_streamed(server, "scout", third, **headers)      # streamed again, after JSON
    assert usage3["prompt_tokens_details"]["cached_tokens"] == held, (held, usage3)

    for messages, answer, usage in ((second, answer2, usage2), (third, answer3, usage3)):
        replay_text, replay_usage = replay_on(server, "scout", messages)
        assert answer == replay_text
        assert replay_usage["prompt_tokens"] == usage["prompt_tokens"]


def test_concurrent_use_of_one_session_is_409(server):
    long = {"model": "scout", "messages": [{"role": "user", "content": "Count from 1 to 100."}],
            "temperature": 0, "max_tokens": BUSY_TOKENS}
    results = {}

    def first():
        results["first"] = chat(server, long, timeout=180, **{"X-Loom-Session": "busy-1"})

    thread = threading.Thread(target=first)
    thread.start()
    wait_until(lambda: scheduler(server)["active"] >= 1, "the first request to be running")
    second = chat(server, long, timeout=180, **{"X-Loom-Session": "busy-1"})
    thread.join(120)
    assert results["first"].status == 200
    assert second.status == 409 and second.json()["error"]["code"] == "conflict"


def test_session_cache_keeps_named_histories_beyond_the_rows(server):
    """With 2 rows and session_cache_capacity 2, a named history pushed out of its row by other
    requests moves to host memory and is still reused (restored into fresh pages)."""
    first = [{"role": "user", "content": "The code word is amber."}]
    answer, usage1 = ask(server, "other", first, **{"X-Loom-Session": "keep"})
    for i in range(3):   # untagged traffic takes both rows
        ask(server, "other", [{"role": "user", "content": f"Say {i}."}])
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Repeat it."}]
    text, usage2 = ask(server, "other", second, **{"X-Loom-Session": "keep"})
    assert usage2["prompt_tokens_details"]["cached_tokens"] >= \
        usage1["prompt_tokens"] + usage1["completion_tokens"] - 1
    assert text == fresh(server, second)[0]


# ---- the prefix cache ---------------------------------------------------------------------------

RULES = {"role": "system", "content": " ".join(f"Rule {i}: answer politely, briefly and in English." for i in range(30))}


def take_the_row(server, model):
    """`prefixed` has one row: another conversation takes it, so what it held is no longer a history."""
    ask(server, model, [{"role": "user", "content": "Say 7."}])


def test_prefix_cache_keeps_a_shared_prefix_after_its_row_moved_on(server):
    first = [RULES, {"role": "user", "content": "Name a colour."}]
    _, usage1 = ask(server, "prefixed", first)
    assert usage1["prompt_tokens"] > 256, usage1   # crosses the first natural boundary (256)
    take_the_row(server, "prefixed")
    second = [RULES, {"role": "user", "content": "Name an animal."}]
    text, usage2 = ask(server, "prefixed", second)
    cached = usage2["prompt_tokens_details"]["cached_tokens"]
    assert 256 <= cached < usage2["prompt_tokens"], usage2
    assert text == fresh(server, second)[0]
    counts = scheduler(server, "prefixed")
    assert counts["prefixes"] >= 1 and counts["pages_prefixes"] > 0


def test_prompt_end_boundary_survives_a_changed_later_message(server):
    """The later boundary at the prompt's end: the next turn edits the answer (as a client that
    drops generated reasoning does), and still reuses the whole previous prompt."""
    first = [RULES, {"role": "user", "content": "What is two plus two?"}]
    answer, usage1 = ask(server, "prefixed", first)
    take_the_row(server, "prefixed")
    second = first + [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "And three plus three?"}]
    text, usage2 = ask(server, "prefixed", second)
    assert usage2["prompt_tokens_details"]["cached_tokens"] == usage1["prompt_tokens"], (usage1, usage2)
    assert text == fresh(server, second)[0]
