"""The observation routes in-process (`loomd.routes.observation` over `make_app`), for what
the conformance daemon cannot show cheaply: pagination of non-empty inspection lists (the
conformance daemon's `mini` deployments have no HTTP inference route to fill `/v1/requests`) and gap records over HTTP (the daemon's
journal retains 4096 entries; here the app gets a journal retaining four).

Each test runs an aiohttp test server under `asyncio.run`; every read has a deadline."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loomd.app import JOURNAL, make_app
from loomd.logz import Journal
from loomrt.devices import Devices
from loomrt.registry import Registry

DEADLINE_S = 10.0


def run(scenario, *, retained: int | None = None, requests=None, sessions=None):
    """Run `scenario(client, registry, journal)` against a fresh app."""
    registry = Registry(Devices(cuda={}))
    if requests is not None:
        registry.requests = lambda model=None: [dict(r) for r in requests]
    if sessions is not None:
        registry.sessions = lambda model=None: [dict(s) for s in sessions]
    app = make_app(registry)
    if retained is not None:
        registry.listeners.remove(app[JOURNAL].publish_threadsafe)
        app[JOURNAL] = Journal(retained)
        registry.listeners.append(app[JOURNAL].publish_threadsafe)
    journal = app[JOURNAL]

    async def main():
        async with TestClient(TestServer(app)) as client:
            await asyncio.wait_for(scenario(client, registry, journal), DEADLINE_S)

    try:
        asyncio.run(main())
    finally:
        registry.close()


async def get_json(client, path, status=200):
    response = await client.get(path)
    assert response.status == status, await response.text()
    return await response.json()


def fake_requests(ids):
    return [{"id": i, "object": "request", "model": "m", "kind": "stage", "state": "pending",
             "created": 0.0, "steps": 1, "steps_done": 0} for i in ids]


# ---- /v1/requests and /v1/sessions pages ------------------------------------------------------------

def test_requests_pages_by_id_with_next_after():
    ids = [3, 5, 8, 13, 21]

    async def scenario(client, registry, journal):
        page = await get_json(client, "/v1/requests?limit=2")
        assert page == {"object": "list", "data": fake_requests([3, 5]), "next_after": 5}
        page = await get_json(client, "/v1/requests?limit=2&after=5")
        assert [r["id"] for r in page["data"]] == [8, 13] and page["next_after"] == 13
        page = await get_json(client, "/v1/requests?limit=2&after=8")      # exactly the rest: last page
        assert [r["id"] for r in page["data"]] == [13, 21] and page["next_after"] is None
        page = await get_json(client, "/v1/requests?after=4")               # after need not be an id
        assert [r["id"] for r in page["data"]] == [5, 8, 13, 21] and page["next_after"] is None
        assert await get_json(client, "/v1/requests?after=21") == {"object": "list", "data": [],
                                                                   "next_after": None}
        walked, after = [], 0
        while True:
            page = await get_json(client, f"/v1/requests?limit=1&after={after}")
            walked += [r["id"] for r in page["data"]]
            if page["next_after"] is None:
                break
            after = page["next_after"]
        assert walked == ids

    run(scenario, requests=fake_requests(ids))


def test_requests_page_size_default_and_maximum():
    async def scenario(client, registry, journal):
        page = await get_json(client, "/v1/requests")
        assert len(page["data"]) == 100 and page["next_after"] == 100
        page = await get_json(client, "/v1/requests?limit=1000")
        assert len(page["data"]) == 1000 and page["next_after"] == 1000
        page = await get_json(client, "/v1/requests?limit=1000&after=1000")
        assert [r["id"] for r in page["data"]] == list(range(1001, 1501)) and page["next_after"] is None
        error = await get_json(client, "/v1/requests?limit=1001", 400)
        assert error["error"]["param"] == "limit"

    run(scenario, requests=fake_requests(range(1, 1501)))


def test_sessions_page_by_order():
    sessions = [{"object": "session", "name": f"s{i}", "order": i} for i in range(1, 6)]

    async def scenario(client, registry, journal):
        page = await get_json(client, "/v1/sessions?limit=3")
        assert [s["name"] for s in page["data"]] == ["s1", "s2", "s3"] and page["next_after"] == 3
        page = await get_json(client, "/v1/sessions?limit=3&after=3")
        assert [s["name"] for s in page["data"]] == ["s4", "s5"] and page["next_after"] is None

    run(scenario, sessions=sessions)


# ---- gap records over HTTP ------------------------------------------------------------------------

def test_logz_reports_a_gap_line_then_the_retained_entries():
    async def scenario(client, registry, journal):
        for i in range(7):
            journal.publish({"event": "e", "n": i})                   # retains 4..7
        response = await client.get("/logz?cursor=1")
        assert response.status == 200
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        assert lines[0] == {"event": "gap", "from": 2, "to": 3, "missed": 2}
        assert [e["id"] for e in lines[1:]] == [4, 5, 6, 7]
        assert response.headers["X-Loom-Cursor"] == "7"
        response = await client.get("/logz?cursor=0&limit=1")
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        assert lines == [{"event": "gap", "from": 1, "to": 3, "missed": 3}, lines[1]] and lines[1]["id"] == 4
        assert response.headers["X-Loom-Cursor"] == "4"
        response = await client.get("/logz?cursor=3")                  # at the window's edge: no gap
        assert [json.loads(line)["id"] for line in (await response.text()).splitlines()] == [4, 5, 6, 7]

    run(scenario, retained=4)


async def read_event(response) -> dict:
    while True:
        block = await asyncio.wait_for(response.content.readuntil(b"\n\n"), DEADLINE_S)
        fields = dict(line.split(": ", 1) for line in block.decode().strip().split("\n")
                      if not line.startswith(":"))
        if fields:
            return {"id": int(fields["id"]), "event": fields["event"], "data": json.loads(fields["data"])}


def test_stream_sends_an_explicit_gap_event_and_continues_after_it():
    async def scenario(client, registry, journal):
        for i in range(7):
            journal.publish({"event": "e", "n": i})                   # retains 4..7
        response = await client.get("/logz/stream", headers={"Last-Event-ID": "1"})
        assert response.status == 200
        gap = await read_event(response)
        assert gap == {"id": 3, "event": "gap", "data": {"event": "gap", "from": 2, "to": 3, "missed": 2}}
        following = [await read_event(response) for _ in range(4)]
        assert [(e["event"], e["id"], e["data"]["id"]) for e in following] == [("log", i, i) for i in range(4, 8)]
        journal.publish({"event": "new"})
        assert (await read_event(response))["id"] == 8
        response.close()
        # resuming from the gap's id (what a client's Last-Event-ID now is) continues without a gap
        response = await client.get("/logz/stream", headers={"Last-Event-ID": "3"})
        assert [(await read_event(response))["id"] for _ in range(5)] == [4, 5, 6, 7, 8]
        response.close()

    run(scenario, retained=4)


def test_stream_reader_falling_behind_the_window_gets_a_gap():
    """A reader paused while more than the window is appended sees one gap, then the rest."""
    async def scenario(client, registry, journal):
        journal.publish({"event": "e"})
        response = await client.get("/logz/stream", headers={"Last-Event-ID": "0"})
        assert (await read_event(response))["id"] == 1
        for i in range(10):                      # 2..11 appended at once; the window keeps 8..11
            journal.publish({"event": "e", "n": i})
        events = [await read_event(response) for _ in range(5)]
        assert events[0] == {"id": 7, "event": "gap", "data": {"event": "gap", "from": 2, "to": 7, "missed": 6}}
        assert [e["id"] for e in events[1:]] == [8, 9, 10, 11]
        response.close()

    run(scenario, retained=4)


@pytest.mark.parametrize("path", ["/logz?cursor=9", "/logz/stream?cursor=9"])
def test_cursor_ahead_of_the_journal_is_rejected(path):
    async def scenario(client, registry, journal):
        for _ in range(3):
            journal.publish({"event": "e"})
        error = await get_json(client, path, 400)
        assert error["error"]["param"] == "cursor" and "ahead" in error["error"]["message"]

    run(scenario)


def test_idle_stream_sends_keepalive_comments(monkeypatch):
    from loomd.routes import observation

    monkeypatch.setattr(observation, "KEEPALIVE_S", 0.05)
    monkeypatch.setattr(observation, "WAIT_SLICE_S", 0.02)

    async def scenario(client, registry, journal):
        journal.publish({"event": "e"})
        response = await client.get("/logz/stream", headers={"Last-Event-ID": "1"})   # nothing newer
        assert response.status == 200
        for _ in range(2):
            block = await asyncio.wait_for(response.content.readuntil(b"\n\n"), DEADLINE_S)
            assert block == b": keepalive\n\n"
        journal.publish({"event": "after"})          # events still follow keepalives
        assert (await read_event(response))["id"] == 2
        response.close()

    run(scenario)
