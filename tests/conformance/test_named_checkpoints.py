"""Named checkpoints over HTTP (spec: "Named checkpoints"): pin, suspend, delete, and chats that
fork or rewind from a checkpoint, judged against a fresh replay on a twin deployment.

Three deployments: `scout` (checkpoint_capacity 2, the default elastic backing), `twin` (no
checkpoints: the replay reference) and `fixed` (checkpoint_backing "fixed", one row)."""

from __future__ import annotations

import json
import math
import select

import pytest

from loomd_process import read_response
from scout_daemon import chat, open_stream, scheduler, scout_document, start_scout, wait_until

FIRST = [{"role": "user", "content": "Remember the number seven."}]
PAGE_SIZE = 16
PAGE_BYTES = 30 * PAGE_SIZE * 192 * (4 + 2)   # k_cache (f32) + v_cache (f16) of one page (samples/scout/model.loom)


# Streams that hold a row while a test looks at the queue behind them: about 300 tokens of
# answer, capped at 256 (a second at least; 16 tokens took well under 100 ms on a fast machine,
# and the rows came free before the queued request was seen waiting)
LONG = {"model": "scout", "messages": [{"role": "user", "content": "Count from 1 to 100, one per line."}],
        "temperature": 0, "max_tokens": 256, "stream": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checkpoints")
    twin = scout_document(tmp, "twin", rows=2, context_length=512, max_output_tokens=16)
    fixed = scout_document(tmp, "fixed", rows=1, context_length=512, max_output_tokens=16, checkpoint_capacity=1)
    fixed.write_text(json.dumps({**json.loads(fixed.read_text()), "checkpoint_backing": "fixed"}))
    daemon = start_scout(tmp, twin, fixed, rows=2, context_length=512, max_output_tokens=LONG["max_tokens"],
                         checkpoint_capacity=2)
    try:
        for model in ("scout", "twin", "fixed"):  # a deployment's first step loads its kernels: slow once
            assert chat(daemon, {"model": model, "messages": FIRST, "max_tokens": 1}, timeout=300).status == 200
        yield daemon
    finally:
        assert daemon.stop() == 0


def ask(server, model, messages, **headers):
    r = chat(server, {"model": model, "messages": messages, "temperature": 0, "max_tokens": 16}, timeout=180,
             **headers)
    return r


def control(server, method, path, model="scout", **headers):
    return server.request(method, path, None, {"X-Loom-Model": model, **headers})


def snapshots(server, model="scout") -> int:
    """Host bytes the device ledger charges to the deployment as snapshots."""
    devices = server.request("GET", "/v1/status").json()["devices"]
    cpu = next(d for d in devices if d["device"] == "cpu")
    return cpu["owners"].get(f"{model}/primary", {}).get("snapshots", 0)


def test_elastic_suspend_parks_the_pin_on_the_host_and_a_fork_resumes_it(server):
    """A pin lives in pool pages of its own; suspension moves it to a host image (pages freed,
    bytes charged to the host), and the next fork warms it back into new pages and answers
    exactly as a fork before suspension did."""
    r = ask(server, "scout", FIRST, **{"X-Loom-Session": "e"})
    assert r.status == 200
    answer = r.json()["choices"][0]["message"]["content"]
    before = scheduler(server)
    pinned = control(server, "POST", "/v1/checkpoints/ce", **{"X-Loom-Session": "e"})
    assert pinned.status == 201, pinned.body
    position = pinned.json()["position"]
    pages = math.ceil(position / PAGE_SIZE)
    held = scheduler(server)
    assert (held["pages_checkpoints"], held["checkpoint_host_bytes"]) == (pages, 0)
    assert held["pages_used"] == before["pages_used"] + pages     # the pin's own pages, from the pool

    follow = FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which number?"}]
    first = ask(server, "scout", follow, **{"X-Loom-Checkpoint": "ce", "X-Loom-Session": "e2"})
    assert first.status == 200, first.body
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == position

    used = scheduler(server)["pages_used"]
    suspended = control(server, "POST", "/v1/checkpoints/ce/suspend")
    assert suspended.status == 200, suspended.body
    assert suspended.json()["host_snapshot_bytes"] == pages * PAGE_BYTES
    parked = scheduler(server)
    assert (parked["pages_checkpoints"], parked["checkpoint_host_bytes"]) == (0, pages * PAGE_BYTES)
    assert parked["pages_used"] == used - pages
    assert snapshots(server) >= pages * PAGE_BYTES
    again = control(server, "POST", "/v1/checkpoints/ce/suspend")          # already parked: same image
    assert again.status == 200 and again.json()["host_snapshot_bytes"] == pages * PAGE_BYTES

    resumed = ask(server, "scout", follow, **{"X-Loom-Checkpoint": "ce", "X-Loom-Session": "e3"})
    assert resumed.status == 200, resumed.body
    assert resumed.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
    assert resumed.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == position
    warm = scheduler(server)
    assert (warm["pages_checkpoints"], warm["checkpoint_host_bytes"]) == (pages, 0)
    assert snapshots(server) == 0
    assert control(server, "DELETE", "/v1/checkpoints/ce").status == 200
    assert scheduler(server)["pages_checkpoints"] == 0


def test_fixed_backing_keeps_pins_in_the_pool_and_rejects_suspension(server):
    assert ask(server, "fixed", FIRST, **{"X-Loom-Session": "f"}).status == 200
    pinned = control(server, "POST", "/v1/checkpoints/cf", "fixed", **{"X-Loom-Session": "f"})
    assert pinned.status == 201, pinned.body
    pages = math.ceil(pinned.json()["position"] / PAGE_SIZE)
    refused = control(server, "POST", "/v1/checkpoints/cf/suspend", "fixed")
    assert refused.status == 400, refused.body
    assert "fixed backing" in refused.json()["error"]["message"]
    held = scheduler(server, "fixed")
    assert (held["pages_checkpoints"], held["checkpoint_host_bytes"]) == (pages, 0)
    assert snapshots(server, "fixed") == 0
    assert control(server, "POST", "/v1/checkpoints/nope/suspend", "fixed").status == 404
    assert control(server, "DELETE", "/v1/checkpoints/cf", "fixed").status == 200
    assert scheduler(server, "fixed")["pages_checkpoints"] == 0


def test_pin_fork_rewind_suspend_delete(server):
    r = ask(server, "scout", FIRST, **{"X-Loom-Session": "a"})
    assert r.status == 200
    answer, usage = r.json()["choices"][0]["message"]["content"], r.json()["usage"]
    pinned = control(server, "POST", "/v1/checkpoints/cp1", **{"X-Loom-Session": "a"})
    assert pinned.status == 201, pinned.body
    position = pinned.json()["position"]
    assert position >= usage["prompt_tokens"] + usage["completion_tokens"] - 1
    # the exact pending token: sampled last, never fed (scout's end of turn when it stopped)
    pending = pinned.json()["pending_token"]
    assert isinstance(pending, int)
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert pending == 2

    follow = FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which number?"}]
    fresh = ask(server, "twin", follow).json()["choices"][0]["message"]["content"]
    # fork into another session
    forked = ask(server, "scout", follow, **{"X-Loom-Checkpoint": "cp1", "X-Loom-Session": "b"})
    assert forked.status == 200, forked.body
    assert forked.json()["choices"][0]["message"]["content"] == fresh
    assert forked.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == position
    # session a advances elsewhere, then rewinds to the checkpoint
    other = FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Say hello."}]
    assert ask(server, "scout", other, **{"X-Loom-Session": "a"}).status == 200
    rewound = ask(server, "scout", follow, **{"X-Loom-Checkpoint": "cp1", "X-Loom-Session": "a"})
    assert rewound.status == 200 and rewound.json()["choices"][0]["message"]["content"] == fresh

    suspended = control(server, "POST", "/v1/checkpoints/cp1/suspend")
    assert suspended.status == 200 and suspended.json()["host_snapshot_bytes"] > 0
    assert control(server, "POST", "/v1/checkpoints/cp1", **{"X-Loom-Session": "a"}).status == 409  # duplicate
    assert control(server, "DELETE", "/v1/checkpoints/cp1").status == 200
    assert control(server, "DELETE", "/v1/checkpoints/cp1").status == 404
    assert control(server, "POST", "/v1/checkpoints/cp1/suspend").status == 404


def test_history_mismatch_is_400_and_unknown_checkpoint_404(server):
    assert ask(server, "scout", FIRST, **{"X-Loom-Session": "m"}).status == 200
    assert control(server, "POST", "/v1/checkpoints/cpm", **{"X-Loom-Session": "m"}).status == 201
    other = [{"role": "user", "content": "Something else entirely."}]
    assert ask(server, "scout", other, **{"X-Loom-Checkpoint": "cpm"}).status == 400
    assert ask(server, "scout", other, **{"X-Loom-Checkpoint": "nope"}).status == 404
    assert control(server, "DELETE", "/v1/checkpoints/cpm").status == 200


def test_pin_errors(server):
    assert control(server, "POST", "/v1/checkpoints/x").status == 400                       # no session
    assert control(server, "POST", "/v1/checkpoints/x", **{"X-Loom-Session": "ghost"}).status == 404
    assert control(server, "POST", "/v1/checkpoints/bad%20name", **{"X-Loom-Session": "a"}).status == 400
    assert server.request("POST", "/v1/checkpoints/x", None, {"X-Loom-Session": "a"}).status == 400  # no model
    assert server.request("POST", "/v1/checkpoints/x", None, {"X-Loom-Model": "nobody"}).status == 404
    assert server.request("POST", "/v1/checkpoints/x", None,
                          {"X-Loom-Model": "twin", "X-Loom-Session": "a"}).status == 404        # capacity 0
    assert server.request("POST", "/v1/checkpoints/x", "{}", {"X-Loom-Model": "scout"}).status == 400  # body


def test_capacity_exhausted_is_503(server):
    """checkpoint_capacity 2. (Each session is pinned right after its turn: with 2 rows and no
    session cache, a third session's turn would push the first one's history out.)"""
    for name, session in (("k1", "c1"), ("k2", "c2")):
        assert ask(server, "scout", FIRST, **{"X-Loom-Session": session}).status == 200
        assert control(server, "POST", f"/v1/checkpoints/{name}", **{"X-Loom-Session": session}).status == 201
    assert ask(server, "scout", FIRST, **{"X-Loom-Session": "c3"}).status == 200
    full = control(server, "POST", "/v1/checkpoints/k3", **{"X-Loom-Session": "c3"})
    assert full.status == 503, full.body
    for name in ("k1", "k2"):
        assert control(server, "DELETE", f"/v1/checkpoints/{name}").status == 200


def answered(s) -> bool:
    """Whether anything (a response, or the server closing) has come back on `s`: no waiting."""
    readable, _, _ = select.select([s], [], [], 0)
    return bool(readable)


def test_pin_and_suspend_wait_for_admission_to_reopen_and_delete_does_not(server):
    assert ask(server, "scout", FIRST, **{"X-Loom-Session": "w"}).status == 200
    assert control(server, "POST", "/v1/checkpoints/kw0", **{"X-Loom-Session": "w"}).status == 201
    admin = {"Content-Type": "application/json"}
    assert server.request("POST", "/v1/models/drain", '{"model":"scout"}', admin).status == 200
    # The pin goes out whole on its own connection and is left unread. The server exposes no
    # count of admission waiters, so "it waits" is checked by order, not by time: the pin's
    # bytes reach the server before the DELETE's connection even opens, and once the DELETE
    # is answered nothing has come back on the pin's connection. A server that holds pins
    # while drained always passes this; one that answered them has, in practice, written its
    # answer by then (the pin's bytes reached the same event loop first). Nothing sleeps.
    waiter = server.connect(timeout=60)
    try:
        try:
            waiter.sendall(b"POST /v1/checkpoints/kw1 HTTP/1.1\r\nHost: loom\r\nConnection: close\r\n"
                           b"X-Loom-Model: scout\r\nX-Loom-Session: w\r\n\r\n")
            assert control(server, "DELETE", "/v1/checkpoints/kw0").status == 200   # deletion is not held
            assert not answered(waiter)                                           # the pin still waits
            assert control(server, "DELETE", "/v1/checkpoints/kw1").status == 404   # and has pinned nothing
            assert not answered(waiter)
        finally:
            assert server.request("POST", "/v1/models/undrain", '{"model":"scout"}', admin).status == 200
        pinned = read_response(waiter)              # answered once admission reopened
    finally:
        waiter.close()
    assert pinned.status == 201, pinned.body
    assert pinned.json()["name"] == "kw1" and pinned.json()["session"] == "w"
    assert control(server, "DELETE", "/v1/checkpoints/kw1").status == 200




def test_busy_session_and_queued_borrower_are_409(server):
    """A session whose request is running cannot be pinned; a checkpoint that a queued request
    continues from cannot be deleted. (scout has 2 rows: two long streams hold both.)"""
    first = ask(server, "scout", FIRST, **{"X-Loom-Session": "q"})
    assert first.status == 200
    answer = first.json()["choices"][0]["message"]["content"]
    assert control(server, "POST", "/v1/checkpoints/kq", **{"X-Loom-Session": "q"}).status == 201
    holders = [open_stream(server, LONG, headers={"X-Loom-Session": f"hold-{i}"}) for i in range(2)]
    try:
        wait_until(lambda: scheduler(server)["active"] == 2, "two streams to hold both rows")
        busy = control(server, "POST", "/v1/checkpoints/kb", **{"X-Loom-Session": "hold-0"})
        assert busy.status == 409, busy.body
        follow = FIRST + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Again?"}]
        queued = open_stream(server, {"model": "scout", "messages": follow, "max_tokens": 2, "stream": True},
                             headers={"X-Loom-Checkpoint": "kq", "X-Loom-Session": "q2"})
        try:
            wait_until(lambda: scheduler(server)["pending"] == 1, "the fork to queue")
            blocked = control(server, "DELETE", "/v1/checkpoints/kq")
            assert blocked.status == 409, blocked.body
        finally:
            queued.close()
    finally:
        for holder in holders:
            holder.close()
    wait_until(lambda: scheduler(server)["active"] == 0 and scheduler(server)["pending"] == 0, "idle")
    assert control(server, "DELETE", "/v1/checkpoints/kq").status == 200
