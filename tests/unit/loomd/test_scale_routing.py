"""loomd/scale/routing.py and aggregate.py without Ray: where each request goes, what a lost
replica costs, and how many replicas' answers become one."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loomd.scale import aggregate
from loomd.scale.aggregate import Outcome
from loomd.scale.routing import HashRing, Lost, Router, prefix_chain


def chat(*contents: str) -> dict:
    roles = ["user", "assistant"]
    return {"model": "scout", "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]}


def test_adding_a_replica_moves_only_the_keys_it_takes():
    keys = [f"session-{i}" for i in range(3000)]
    before = HashRing(range(2))
    after = HashRing(range(3))
    moved = [k for k in keys if before.owner(k) != after.owner(k)]
    assert all(after.owner(k) == 2 for k in moved)          # nothing moves between the old two
    assert 0.2 < len(moved) / len(keys) < 0.45                # about a third: the newcomer's share


def test_a_session_keeps_its_owner_and_moves_only_when_the_owner_is_lost():
    router = Router.of(2)
    owner = router.for_session("s1")
    assert all(router.for_session("s1") == owner for _ in range(5))
    router.lose(owner)
    survivor = 1 - owner
    assert router.for_session("s1") == survivor               # best effort: replayed there
    assert router.sessions["s1"] == survivor


def test_handles_and_checkpoints_of_a_lost_replica_are_lost():
    router = Router.of(2)
    router.issued_handle("h1", 1)
    router.pinned("c1", 1)
    router.pinned("c0", 0)
    assert router.for_handle("h1") == 1 and router.for_session("h1") == 1   # a handle pinned as a session
    router.lose(1)
    with pytest.raises(Lost):
        router.for_handle("h1")
    with pytest.raises(Lost):
        router.for_session("h1")
    with pytest.raises(Lost):
        router.for_checkpoint("c1")
    assert router.for_checkpoint("c0") == 0
    router.unpinned("c1")
    assert router.for_checkpoint("c1") == 0                   # forgotten: the ring (the replica answers 404)


def test_a_later_turn_follows_its_longest_prefix():
    router = Router.of(3, spill=4)
    router.replicas[0].in_flight = 5                          # the least loaded is not where the prefix is
    first = chat("Hello")
    assert router.for_chat("scout", first) == 1
    router.served_chat("scout", first, 1)
    router.replicas[1].in_flight = 3
    second = chat("Hello", "Hi! How can I help?", "Tell me a joke")
    assert router.for_chat("scout", second) == 1              # shares the first turn's hash
    assert router.for_chat("other-model", second) == 2        # names are per model: no prefix there


def test_affinity_spills_to_the_least_loaded_past_the_threshold_and_can_be_off():
    router = Router.of(2, spill=4)
    router.served_chat("scout", chat("Hello"), 0)
    router.replicas[0].in_flight = 4
    assert router.for_chat("scout", chat("Hello", "Hi", "More")) == 1
    router.replicas[0].in_flight = 3
    assert router.for_chat("scout", chat("Hello", "Hi", "More")) == 0
    plain = Router.of(2, affinity=False)
    plain.served_chat("scout", chat("Hello"), 1)
    assert plain.for_chat("scout", chat("Hello", "Hi", "More")) == 0


def test_prefix_chain_is_seeded_by_model_and_tools():
    base = prefix_chain("scout", chat("a", "b"))
    assert len(base) == 2 and prefix_chain("scout", chat("a"))[0] == base[0]
    assert prefix_chain("scout", {**chat("a", "b"), "tools": [{"type": "function"}]})[0] != base[0]
    assert prefix_chain("scout", {"messages": "not a list"}) == []


def test_no_live_replica_routes_nowhere():
    router = Router.of(1)
    router.lose(0)
    assert router.for_load() is None and router.for_session("s") is None


def test_metrics_get_a_replica_label_and_one_help_per_family():
    text = ("# HELP loom_x_total Things\n# TYPE loom_x_total counter\nloom_x_total{model=\"scout\"} 3.0\n"
            "# HELP loom_up Up\n# TYPE loom_up gauge\nloom_up 1.0\n")
    merged = aggregate.metrics([Outcome(0, 200, text.encode()), Outcome(1, 200, text.encode()), Outcome(2, 0, b"")])
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert sorted((s.labels["replica"], s.labels.get("model")) for s in families["loom_x"].samples) == \
        [("0", "scout"), ("1", "scout")]
    assert sorted(s.labels["replica"] for s in families["loom_up"].samples) == ["0", "1"]
    assert merged.count("# HELP loom_x_total") == 1


def test_administration_reports_the_worst_outcome_and_every_replica():
    ok = json.dumps({"model": "scout", "admission": "drained"}).encode()
    conflict = json.dumps({"error": {"message": "busy", "type": "invalid_request_error", "code": "conflict"}}).encode()
    status, body = aggregate.fanned_out([Outcome(0, 200, ok), Outcome(1, 409, conflict)])
    assert status == 409 and body["error"]["code"] == "conflict"
    assert [(r["replica"], r["status"]) for r in body["replicas"]] == [(0, 200), (1, 409)]
    status, body = aggregate.fanned_out([Outcome(0, 200, ok), Outcome(1, 0, b"")])
    assert status == 502 and body["error"]["code"] == "replica_unavailable"


def test_models_and_lists_merge_across_replicas():
    listed = json.dumps({"object": "list", "data": [{"id": "scout", "object": "model", "loom": {}}]}).encode()
    merged = aggregate.models([Outcome(0, 200, listed), Outcome(1, 200, listed)])
    assert [m["id"] for m in merged["data"]] == ["scout"] and merged["data"][0]["loom"]["replicas"] == [0, 1]
    page = json.dumps({"object": "list", "data": [{"id": 1}], "next_after": 1}).encode()
    merged = aggregate.listing([Outcome(0, 200, page), Outcome(1, 200, page)])
    assert [(i["id"], i["replica"]) for i in merged["data"]] == [(1, 0), (1, 1)]
    assert merged["replicas_next_after"] == {"0": 1, "1": 1}


def test_the_ingress_learns_a_handle_from_the_attached_event_and_ends_cut_streams_in_profile():
    pytest.importorskip("ray.serve", reason="the scale extra (ray[serve]) is installed by `make test`")
    from loomd.scale.ingress import _cut_off_event, _sse_data

    first = (b'event: attached\ndata: {"session":"0123456789abcdef0123456789abcdef","position":0}\n\n'
             b'event: chunk\ndata: {"x":1}\n\n')
    assert _sse_data(first, "attached")["session"] == "0123456789abcdef0123456789abcdef"
    assert _sse_data(b"data: {}\n\n", "attached") is None
    sequence = _cut_off_event("/v1/sequences", "text/event-stream", 1).decode()
    assert sequence.startswith("event: error\ndata: ") and json.loads(sequence.split("data: ", 1)[1])["error"]["code"] == "replica_lost"
    chat_end = _cut_off_event("/v1/chat/completions", "text/event-stream; charset=utf-8", 1).decode()
    assert chat_end.endswith("data: [DONE]\n\n") and '"replica_lost"' in chat_end
    assert _cut_off_event("/v1/audio/speech", "audio/pcm;rate=24000;channels=1", 1) == b""
