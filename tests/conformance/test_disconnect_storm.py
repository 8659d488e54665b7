"""A disconnect storm: 1,000 streamed requests, abandoned at random points, leave nothing behind.

One daemon serves scout (chat, 4 rows) and encoder (known-token sequences, 2 rows). 1,000
streamed requests (about 70% chats, 30% sequences), at most 32 at a time over raw sockets,
are each abandoned at a seeded random point: right after the response head, after k SSE
events, or in the middle of a chunk; the client closes normally (FIN) or abortively (RST).
Every request is answered 200 (no request may hang past its deadline): at most 32
clients are connected at once and each deployment queues 64, so a 503 `queue_full` would
mean that abandoned requests still held queue places (they did, until cancelled pending jobs
stopped counting against `pending_capacity`).

Afterwards `/v1/status` must return (polled with a generous deadline) to rest: no active or
pending request in either scheduler, every KV page of scout held only by retained
(finished, reusable) histories, no live request in `/v1/requests`, the device's params,
state and snapshot bytes equal to the baseline recorded before the storm. Then two sequence
requests of a full context each, together needing the whole encoder pool, must both run:
retained handles are evicted for them, a page leaked by an abandoned request would not be,
and what they leave is exactly their own two handles' pages. A normal chat answers too.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import threading
import time
from typing import Any

import pytest

from conformance_support import encoder_document, sequence, wait_ready
from loomd_process import Daemon
from scout_daemon import READY_DEADLINE_S, _request_bytes, chat, scout_document

REQUESTS = 1000
CONCURRENCY = 32
SEED = 23
REQUEST_DEADLINE_S = 120.0   # per abandoned request: a bound for "does not hang"
SETTLE_DEADLINE_S = 180.0    # for /v1/status to return to rest after the storm
ENCODER_CONTEXT = 256
ENCODER_ROWS = 2
PROMPTS = ["Tell me a story about a lighthouse.", "List three colours.", "What is 2 + 2?",
           "Describe the sea in one sentence.", "Name a fruit."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("storm")
    docs = [scout_document(tmp, rows=4, context_length=512, max_output_tokens=32, pending_capacity=64),
            encoder_document(tmp, rows=ENCODER_ROWS, context_length=ENCODER_CONTEXT, step_tokens=16,
                             pending_capacity=64)]
    daemon = Daemon.start(tmp, docs)
    try:
        assert wait_ready(daemon, ["scout", "encoder"], timeout=READY_DEADLINE_S), \
            daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def status(server: Daemon) -> dict[str, Any]:
    response = server.request("GET", "/v1/status")
    assert response.status == 200, response.body
    return response.json()


def schedulers(snapshot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["model"]: r["scheduler"] for r in snapshot["registrations"]}


def device_bytes(snapshot: dict[str, Any]) -> dict[str, int]:
    [cpu] = snapshot["devices"]
    return {k: cpu["categories"][k] for k in ("params", "state", "snapshots")}


def at_rest(snapshot: dict[str, Any]) -> bool:
    s = schedulers(snapshot)
    scout, encoder = s["scout"], s["encoder"]
    return (scout["active"] == 0 and scout["pending"] == 0 and scout["pages_used"] == scout["pages_retained"]
            and scout["retained"] <= scout["rows"] and encoder["active"] == 0 and encoder["pending"] == 0)


def plan(rng: random.Random, i: int) -> dict[str, Any]:
    """What request i sends and where its client gives up."""
    where = rng.choice(["head", "events", "mid-chunk"])
    if rng.random() < 0.7:
        body = {"model": "scout", "stream": True, "max_tokens": rng.randint(2, 24), "temperature": 0.8,
                "seed": i, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
        path = "/v1/chat/completions"
    else:
        body = {"model": "encoder", "position": 0,
                "token_ids": [rng.randrange(1, 40000) for _ in range(rng.randint(8, 64))]}
        path = "/v1/sequences"
    return {"path": path, "body": body, "where": where, "events": rng.randint(1, 4),
            "bytes": rng.randint(1, 40), "reset": rng.random() < 0.5}


async def abandon(port: int, p: dict[str, Any]) -> int:
    """Send one streamed request, read up to its abandonment point, close; the response status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request_bytes(p["path"], p["body"]))
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        code = int(head.split(b" ", 2)[1])
        if code != 200:
            await reader.read()   # the error body, to the server's close
            return code
        if p["where"] == "events":     # k complete SSE events (each ends in a blank line)
            seen = b""
            while seen.count(b"\n\n") < p["events"]:
                more = await reader.read(4096)
                if not more:
                    break
                seen += more
        elif p["where"] == "mid-chunk":   # the chunk-size line and part of the first chunk's data
            await reader.readuntil(b"\r\n")
            await reader.read(p["bytes"])
        return code
    finally:
        if p["reset"]:   # an abortive close: the server's next write fails at once
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


async def storm(port: int, plans: list[dict[str, Any]]) -> list[int | str]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(p: dict[str, Any]) -> int | str:
        async with gate:
            try:
                return await asyncio.wait_for(abandon(port, p), REQUEST_DEADLINE_S)
            except TimeoutError:
                return "hung"
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                return f"connection: {exc!r}"

    return await asyncio.gather(*(one(p) for p in plans))


def full_context_sequences(server: Daemon) -> list[tuple[int, Any]]:
    """Two full-context sequence requests at once: together they need every encoder page."""
    rng = random.Random(SEED + 1)
    results: list[tuple[int, Any]] = [None, None]   # type: ignore[list-item]

    def run(k: int) -> None:
        ids = [rng.randrange(1, 40000) for _ in range(ENCODER_CONTEXT)]
        results[k] = sequence(server, {"model": "encoder", "position": 0, "token_ids": ids})

    threads = [threading.Thread(target=run, args=(k,)) for k in range(ENCODER_ROWS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "a full-context sequence request hung"
    return results


def test_abandoned_streams_leave_no_rows_pages_or_sessions(server):
    # Warm up (kernels compile on first use) and record the baseline.
    warm = chat(server, {"model": "scout", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
                timeout=READY_DEADLINE_S)
    assert warm.status == 200, warm.body
    warm = server.request("POST", "/v1/sequences", {"model": "encoder", "position": 0, "token_ids": [504, 2365]},
                          timeout=READY_DEADLINE_S)
    assert warm.status == 200, warm.body
    baseline = status(server)
    assert at_rest(baseline), baseline

    rng = random.Random(SEED)
    plans = [plan(rng, i) for i in range(REQUESTS)]
    started = time.monotonic()
    outcomes = asyncio.run(storm(server.port, plans))
    elapsed = time.monotonic() - started
    failed = [(p["path"], p["where"], o) for p, o in zip(plans, outcomes) if o != 200]
    assert not failed, f"{len(failed)} of {REQUESTS} failed (storm {elapsed:.1f} s): {failed[:10]}"

    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while not at_rest(now := status(server)):
        assert time.monotonic() < deadline, "not at rest after the storm: " + json.dumps(schedulers(now))
        time.sleep(0.1)   # poll interval; the deadline bounds the wait
    assert device_bytes(now) == device_bytes(baseline), (device_bytes(now), device_bytes(baseline))
    live = server.request("GET", "/v1/requests").json()
    assert live["data"] == [], live

    # Every encoder page can still be had: none was leaked by an abandoned request.
    for code, events in full_context_sequences(server):
        assert code == 200, events
        assert [e[0] for e in events][0] == "attached" and events[-1][0] == "done", [e[0] for e in events]
    encoder = schedulers(status(server))["encoder"]
    pool_pages = encoder["pages_used"] + encoder["pages_free"]
    assert encoder["pages_free"] == 0 and encoder["sessions"] == ENCODER_ROWS and pool_pages > 0, encoder

    normal = chat(server, {"model": "scout", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert normal.status == 200 and normal.json()["choices"][0]["message"]["content"], normal.body
    print(f"storm: {REQUESTS} requests in {elapsed:.1f} s")
