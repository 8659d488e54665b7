"""Named checkpoints of known-token sequences over a real `loomd` serving samples/encoder (spec:
"Named checkpoints", "Known-token sequences"): pin a completed handle, fork it with
`X-Loom-Checkpoint` on `/v1/sequences`, suspend and delete the pin, and `/v1/sessions`
listing sequence handles.

One daemon for the module: `encoder` (checkpoint_capacity 2, rows 2, context 256, 16 ids per
step) and `plain`, the same model with the default checkpoint_capacity 0. A fork is judged
against appending the same ids to the source handle directly: both continue from the same
cached positions, so their chunk bytes agree (bound 1e-5; on the CPU back end they are
bit-identical, as the per-token states depend only on the token's row cache). The last test
unregisters `plain`, to use the controls without X-Loom-Model once one deployment is left.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance_support import SequenceStream, checked_sequence, encoder_document, sequence, wait_ready
from loomd_process import Daemon
from scout_daemon import READY_DEADLINE_S, wait_until

# SmolLM2 ids of an English sentence (any valid ids would do: ids < 49152).
IDS = [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 21017, 17837, 685, 281, 28, 5631, 2496, 1690,
       578, 28, 284, 260, 13842, 30058]
K = 10              # the pinned prefix
BOUND = 1e-5
PAGE_BYTES = 2 * 30 * 16 * 192 * 4   # k_cache + v_cache of one page (samples/scout/prepare.loom)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequence-checkpoints")
    docs = [encoder_document(tmp, checkpoint_capacity=2), encoder_document(tmp, "plain")]
    daemon = Daemon.start(tmp, docs)
    try:
        assert wait_ready(daemon, ["encoder", "plain"], timeout=READY_DEADLINE_S), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def control(server, method: str, path: str, model: str = "encoder", **headers: str):
    return server.request(method, path, None, {"X-Loom-Model": model, **headers})


def start(server, ids: list[int], model: str = "encoder") -> tuple[str, np.ndarray]:
    status, events = sequence(server, {"model": model, "position": 0, "token_ids": ids})
    assert status == 200, events
    handle, rows, _ = checked_sequence(events, ids)
    return handle, rows


def append(server, handle: str, position: int, ids: list[int]) -> np.ndarray:
    status, events = sequence(server, {"model": "encoder", "session": handle, "position": position, "token_ids": ids})
    assert status == 200, events
    return checked_sequence(events, ids, position, handle)[1]


def fork(server, name: str, position: int, ids: list[int]) -> tuple[str, np.ndarray]:
    status, events = sequence(server, {"model": "encoder", "position": position, "token_ids": ids},
                              {"X-Loom-Checkpoint": name})
    assert status == 200, events
    handle, rows, _ = checked_sequence(events, ids, position)
    return handle, rows


def error_of(result, status: int, param: str | None = None) -> dict:
    got, body = result
    assert got == status, body
    if param is not None:
        assert body["error"]["param"] == param, body
    return body


def test_a_fork_equals_a_direct_append_and_outlives_its_pin(server):
    source, head = start(server, IDS[:K])
    pinned = control(server, "POST", "/v1/checkpoints/cp1", **{"X-Loom-Session": source})
    assert pinned.status == 201, pinned.body
    assert pinned.json() == {"object": "checkpoint", "name": "cp1", "model": "encoder", "session": source,
                             "position": K, "pending_token": None}   # sequences: no pending prediction

    direct = append(server, source, K, IDS[K:])        # the source advances past the pin
    forked, rows = fork(server, "cp1", K, IDS[K:])
    assert forked != source
    assert np.abs(rows - direct).max() <= BOUND
    # Without the checkpoint's state the same ids give other states: the fork did use it.
    assert np.abs(start(server, IDS[K:K + 4])[1] - direct[:4]).max() > 1e-2

    suspended = control(server, "POST", "/v1/checkpoints/cp1/suspend")
    assert suspended.status == 200, suspended.body
    # The image is the handle's one started page: keys and values, 30 layers x 16 x 192 f32.
    assert suspended.json()["position"] == K and suspended.json()["host_snapshot_bytes"] == PAGE_BYTES

    assert control(server, "DELETE", "/v1/checkpoints/cp1").status == 200
    # The fork owns its pages: it keeps working after the pin is gone, like the source.
    more = IDS[:5]
    np.testing.assert_allclose(append(server, forked, len(IDS), more), append(server, source, len(IDS), more),
                               rtol=0, atol=BOUND)
    error_of(sequence(server, {"model": "encoder", "position": K, "token_ids": [1]}, {"X-Loom-Checkpoint": "cp1"}),
             404, "X-Loom-Checkpoint")
    assert control(server, "DELETE", "/v1/checkpoints/cp1").status == 404
    assert control(server, "POST", "/v1/checkpoints/cp1/suspend").status == 404


def pool(server) -> dict:
    status = server.request("GET", "/v1/status").json()
    scheduler = next(r for r in status["registrations"] if r["model"] == "encoder")["scheduler"]
    cpu = next(d for d in status["devices"] if d["device"] == "cpu")
    return {"used": scheduler["pages_used"], "pinned": scheduler["pages_checkpoints"],
            "host": scheduler["checkpoint_host_bytes"],
            "ledger": cpu["owners"].get("encoder/primary", {}).get("snapshots", 0)}


def test_a_suspended_pin_moves_to_the_host_and_a_fork_resumes_it(server):
    """encoder's backing is elastic (the default): the pin's page leaves the pool on suspension,
    and a fork afterwards gives the same bytes as a fork before it, warming the pin back."""
    source, _ = start(server, IDS[:K])
    before = pool(server)
    assert control(server, "POST", "/v1/checkpoints/cs", **{"X-Loom-Session": source}).status == 201
    assert pool(server) == {**before, "used": before["used"] + 1, "pinned": before["pinned"] + 1}
    _, rows = fork(server, "cs", K, IDS[K:])

    used = pool(server)["used"]
    suspended = control(server, "POST", "/v1/checkpoints/cs/suspend")
    assert suspended.status == 200 and suspended.json()["host_snapshot_bytes"] == PAGE_BYTES, suspended.body
    parked = pool(server)
    assert (parked["used"], parked["pinned"], parked["host"]) == (used - 1, 0, PAGE_BYTES)
    assert parked["ledger"] >= PAGE_BYTES

    _, resumed = fork(server, "cs", K, IDS[K:])
    np.testing.assert_array_equal(resumed, rows)
    warm = pool(server)
    assert (warm["pinned"], warm["host"], warm["ledger"]) == (1, 0, 0)
    assert control(server, "DELETE", "/v1/checkpoints/cs").status == 200


def test_fork_request_errors(server):
    source, _ = start(server, IDS[:4])
    assert control(server, "POST", "/v1/checkpoints/cpf", **{"X-Loom-Session": source}).status == 201
    try:
        error_of(sequence(server, {"model": "encoder", "position": 4, "token_ids": [1]},
                          {"X-Loom-Checkpoint": "nope"}), 404, "X-Loom-Checkpoint")
        body = error_of(sequence(server, {"model": "encoder", "position": 3, "token_ids": [1]},
                                 {"X-Loom-Checkpoint": "cpf"}), 409, "position")
        assert "stale position 3" in body["error"]["message"]
        error_of(sequence(server, {"model": "encoder", "session": source, "position": 4, "token_ids": [1]},
                          {"X-Loom-Checkpoint": "cpf"}), 400, "X-Loom-Checkpoint")
        error_of(sequence(server, {"model": "encoder", "position": 4, "token_ids": [1]},
                          {"X-Loom-Checkpoint": "bad name"}), 400, "X-Loom-Checkpoint")
        error_of(sequence(server, {"model": "plain", "position": 4, "token_ids": [1]},
                          {"X-Loom-Checkpoint": "cpf"}), 404, "X-Loom-Checkpoint")   # per deployment
    finally:
        assert control(server, "DELETE", "/v1/checkpoints/cpf").status == 200


def test_pin_errors_and_capacity(server):
    source, _ = start(server, IDS[:4])
    assert control(server, "POST", "/v1/checkpoints/x").status == 400                          # no handle
    assert control(server, "POST", "/v1/checkpoints/x", **{"X-Loom-Session": "ab" * 16}).status == 404
    plain, _ = start(server, IDS[:4], "plain")
    assert control(server, "POST", "/v1/checkpoints/x", "plain", **{"X-Loom-Session": plain}).status == 404
    # X-Loom-Model may be omitted only with exactly one deployment registered: here there are two.
    two = server.request("POST", "/v1/checkpoints/x", None, {"X-Loom-Session": source})
    assert two.status == 400 and two.json()["error"]["param"] == "X-Loom-Model", two.body
    assert control(server, "POST", "/v1/checkpoints/k1", **{"X-Loom-Session": source}).status == 201
    assert control(server, "POST", "/v1/checkpoints/k1", **{"X-Loom-Session": source}).status == 409   # duplicate
    assert control(server, "POST", "/v1/checkpoints/k2", **{"X-Loom-Session": source}).status == 201
    full = control(server, "POST", "/v1/checkpoints/k3", **{"X-Loom-Session": source})
    assert full.status == 503, full.body                                                         # capacity 2
    for name in ("k1", "k2"):
        assert control(server, "DELETE", f"/v1/checkpoints/{name}").status == 200


def test_checkpoint_names_outside_the_alphabet_are_400(server):
    """Names are 1-64 of [A-Za-z0-9_.-] and nothing else, to the end: a trailing newline (the
    URL's %0A, decoded into the path parameter) is refused like any other character, before the
    session is looked at, so the idle handle below is never pinned."""
    source, _ = start(server, IDS[:2])
    for name in ("x%0A", "x%0D%0A", "%0Ax", "a" * 65, "bad%20name"):
        for method, path in (("POST", f"/v1/checkpoints/{name}"), ("POST", f"/v1/checkpoints/{name}/suspend"),
                             ("DELETE", f"/v1/checkpoints/{name}")):
            got = control(server, method, path, **{"X-Loom-Session": source})
            assert got.status == 400, (method, path, got.body)
            assert got.json()["error"]["param"] == "checkpoint name", (method, path, got.body)
    assert control(server, "POST", "/v1/checkpoints/x", **{"X-Loom-Session": source}).status == 201  # same handle
    assert control(server, "DELETE", "/v1/checkpoints/x").status == 200


def test_a_busy_handle_cannot_be_pinned(server):
    source, _ = start(server, IDS[:4])
    long = SequenceStream(server, {"model": "encoder", "session": source, "position": 4, "token_ids": IDS * 10})
    try:
        assert long.event() == ("attached", {"session": source, "position": 4})
        # The append owns the handle until its 15 steps retire.
        busy = control(server, "POST", "/v1/checkpoints/b", **{"X-Loom-Session": source})
        assert busy.status == 409, busy.body
        assert [k for k, _ in long.events()][-1] == "done"
    finally:
        long.close()
    assert control(server, "POST", "/v1/checkpoints/b", **{"X-Loom-Session": source}).status == 201
    assert control(server, "DELETE", "/v1/checkpoints/b").status == 200


def test_a_queued_fork_blocks_deleting_its_pin(server):
    source, _ = start(server, IDS[:4])
    assert control(server, "POST", "/v1/checkpoints/q", **{"X-Loom-Session": source}).status == 201
    # Two long appends (240 ids: 30 steps sharing the 16-id budget, and they stall on output
    # credit while unread) hold both rows, so the fork waits in the queue.
    holders = [SequenceStream(server, {"model": "encoder", "position": 0, "token_ids": IDS * 10}) for _ in range(2)]
    queued = None
    try:
        for h in holders:
            assert h.event()[0] == "attached"
        queued = SequenceStream(server, {"model": "encoder", "position": 4, "token_ids": IDS[4:8]},
                                {"X-Loom-Checkpoint": "q"})
        assert queued.status == 200 and queued.event()[0] == "attached"
        blocked = control(server, "DELETE", "/v1/checkpoints/q")
        assert blocked.status == 409, blocked.body
        for h in holders:
            assert [k for k, _ in h.events()][-1] == "done"
        events = queued.events()
        assert events[-1][0] == "done" and events[-1][1]["position"] == 8
    finally:
        for s in holders + ([queued] if queued is not None else []):
            s.close()
    assert control(server, "DELETE", "/v1/checkpoints/q").status == 200


def test_sessions_lists_sequence_handles(server):
    start(server, IDS[:2], "plain")
    handle, _ = start(server, IDS[:6])
    listed = server.request("GET", "/v1/sessions?model=encoder").json()
    mine = [s for s in listed["data"] if s["session"] == handle]
    assert len(mine) == 1, listed
    assert {k: mine[0][k] for k in ("object", "model", "position", "residency", "busy")} == {
        "object": "session", "model": "encoder", "position": 6, "residency": "pool", "busy": False}
    assert isinstance(mine[0]["order"], int)
    # Pages of one item walk the same list, in order, across both deployments.
    everything = server.request("GET", "/v1/sessions?limit=1000").json()["data"]
    assert {"encoder", "plain"} <= {s["model"] for s in everything}
    walked, after = [], 0
    while True:
        page = server.request("GET", f"/v1/sessions?limit=1&after={after}").json()
        walked += page["data"]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert [(s["model"], s["session"]) for s in walked] == [(s["model"], s["session"]) for s in everything]
    assert [s["order"] for s in everything] == sorted(s["order"] for s in everything)


def test_x_loom_model_may_be_omitted_with_one_deployment(server):
    """Last in the module: it unregisters `plain`, leaving `encoder` the only deployment, whose
    checkpoint controls then need no X-Loom-Model."""
    source, _ = start(server, IDS[:K])
    removed = server.request("POST", "/v1/models/unregister", {"model": "plain", "mode": "drain"})
    assert removed.status == 202, removed.body
    wait_until(lambda: [r["model"] for r in server.request("GET", "/v1/status").json()["registrations"]]
               == ["encoder"], "plain removed")
    pinned = server.request("POST", "/v1/checkpoints/solo", None, {"X-Loom-Session": source})
    assert pinned.status == 201, pinned.body
    assert pinned.json()["model"] == "encoder" and pinned.json()["position"] == K
    suspended = server.request("POST", "/v1/checkpoints/solo/suspend")
    assert suspended.status == 200 and suspended.json()["model"] == "encoder", suspended.body
    forked, _ = fork(server, "solo", K, IDS[K:K + 3])   # the pin is encoder's, as if named
    assert forked != source
    deleted = server.request("DELETE", "/v1/checkpoints/solo")
    assert deleted.status == 200 and deleted.json() == {"object": "checkpoint", "name": "solo", "model": "encoder",
                                                        "deleted": True}, deleted.body
    assert server.request("DELETE", "/v1/checkpoints/solo").status == 404
