"""Observation over HTTP (spec: "Discovery and administration"): `/metrics`, `/logz`,
`/logz/stream`, `/v1/requests` and `/v1/sessions` on a real `loomd` process.

Log traffic comes from admission gate changes: every `POST /v1/models/undrain` of the
(already open, ready) `spare` deployment appends exactly one journal entry and changes
nothing else, so tests know how many entries they made. Every SSE read runs under a socket
timeout and an overall deadline, so a missing event fails the test instead of hanging it.
Tests of shutdown and of a small journal retention start their own `loomd`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from conformance_support import HeldCheckpoint, wait_ready, write_document
from loomd_process import REPO, Daemon, Response
from mini_package import MINI, mini_document
from prometheus_client.parser import text_string_to_metric_families

IO_TIMEOUT_S = 10.0        # bound on one socket read
EVENT_DEADLINE_S = 20.0    # bound on waiting for an expected SSE event
POLL_S = 0.05


# ---- helpers ---------------------------------------------------------------------------------

def make_entries(daemon: Daemon, n: int, model: str = "spare") -> list[int]:
    """Append exactly `n` journal entries (gate changes on the open `model`); their ids, in order."""
    before = newest_id(daemon)
    for _ in range(n):
        r = daemon.request("POST", "/v1/models/undrain", {"model": model})
        assert r.status == 200, r.body
    ids = [e["id"] for e in logz(daemon, cursor=before, limit=1000)[1]]
    assert len(ids) == n and ids == list(range(before + 1, before + n + 1)), ids
    return ids


def logz(daemon: Daemon, **query: Any) -> tuple[int, list[dict[str, Any]], dict[str, str]]:
    path = "/logz" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    r = daemon.request("GET", path)
    assert r.status == 200, r.body
    lines = r.body.decode().splitlines()
    return r.status, [json.loads(line) for line in lines], r.headers


def newest_id(daemon: Daemon) -> int:
    """The newest entry id: the cursor /logz returns when nothing newer is asked for."""
    r = daemon.request("GET", "/logz?limit=1000")
    assert r.status == 200, r.body
    cursor = int(r.headers["x-loom-cursor"])
    while True:  # page to the end (the journal may hold more than one page)
        r = daemon.request("GET", f"/logz?cursor={cursor}&limit=1000")
        following = int(r.headers["x-loom-cursor"])
        if following == cursor:
            return cursor
        cursor = following


def assert_error(r, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    assert r.status == status, (r.status, r.body)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def scrape(daemon: Daemon) -> dict[str, Any]:
    r = daemon.request("GET", "/metrics")
    assert r.status == 200, r.body
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.headers
    return {f.name: f for f in text_string_to_metric_families(r.body.decode())}


def samples(families: dict[str, Any], family: str, sample: str | None = None) -> dict[tuple, float]:
    """{sorted label items: value} of one family's samples named `sample` (default: the family)."""
    sample = sample or family
    return {tuple(sorted(s.labels.items())): s.value for s in families[family].samples if s.name == sample}


def request_counts(daemon: Daemon) -> dict[tuple[str, str], float]:
    found = samples(scrape(daemon), "loom_http_requests", "loom_http_requests_total")
    return {(dict(k)["route"], dict(k)["status"]): v for k, v in found.items()}


class Sse:
    """A `GET /logz/stream` over a raw socket: the response head, then SSE events decoded
    from the chunked body, each read bounded by a socket timeout and a deadline."""

    def __init__(self, daemon: Daemon, headers: dict[str, str] | None = None, query: str = "", *,
                 unix: bool = False):
        self.daemon, self.unix = daemon, unix
        self.sock = daemon.connect(unix=unix, timeout=IO_TIMEOUT_S)
        head = [f"GET /logz/stream{query} HTTP/1.1", "Host: loom", "Accept: text/event-stream"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        buf = b""
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while b"\r\n\r\n" not in buf:
            buf += self._recv(deadline)
        head_bytes, _, self._raw = buf.partition(b"\r\n\r\n")
        status_line, *lines = head_bytes.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines)}
        self._text = b""
        self.ended = False          # the terminating zero-size chunk arrived
        self.comments = 0
        self.body = b""             # the whole body of a refusal (anything but 200)
        if self.status != 200:
            n = int(self.headers["content-length"])
            while len(self._raw) < n:
                self._raw += self._recv(deadline)
            self.body = self._raw[:n]

    def response(self) -> Response:
        """A refusal as the harness's Response (for `assert_error`), after checking that the
        server still answers /healthz on the same listener (as `Daemon.request` does)."""
        assert self.status != 200, "the stream was accepted"
        self.daemon.assert_healthy(unix=self.unix)
        return Response(self.status, self.headers, self.body)

    def _recv(self, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no SSE data before the deadline; pending {self._pending()!r}")
        self.sock.settimeout(min(left, IO_TIMEOUT_S))
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"SSE read timed out; pending {self._pending()!r}") from None
        if not chunk:
            raise EOFError(f"the server closed the stream; pending {self._pending()!r}")
        return chunk

    def _pending(self) -> bytes:
        return getattr(self, "_text", b"") + getattr(self, "_raw", b"")

    def _dechunk(self) -> None:
        while not self.ended:
            size_line, sep, rest = self._raw.partition(b"\r\n")
            if not sep:
                return
            size = int(size_line.split(b";")[0], 16)
            if len(rest) < size + 2:
                return
            assert rest[size:size + 2] == b"\r\n", self._raw
            self._text += rest[:size]
            self._raw = rest[size + 2:]
            if size == 0:
                self.ended = True

    def next_event(self, timeout: float = EVENT_DEADLINE_S) -> dict[str, Any]:
        """The next event (comment-only blocks such as keepalives are counted and skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            self._dechunk()
            if b"\n\n" in self._text:
                block, _, self._text = self._text.partition(b"\n\n")
                fields: dict[str, str] = {}
                for line in block.decode().split("\n"):
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(":")
                    assert name not in fields, f"repeated SSE field {name!r} in {block!r}"
                    fields[name] = value[1:] if value.startswith(" ") else value
                if not fields:
                    self.comments += 1
                    continue
                assert set(fields) == {"id", "event", "data"}, block
                return {"id": int(fields["id"]), "event": fields["event"], "data": json.loads(fields["data"])}
            if self.ended:
                raise EOFError(f"the stream ended; pending {self._text!r}")
            self._raw += self._recv(deadline)

    def events(self, n: int) -> list[dict[str, Any]]:
        return [self.next_event() for _ in range(n)]

    def read_to_end(self, timeout: float = EVENT_DEADLINE_S) -> list[dict[str, Any]]:
        """Events until the server ends the stream (terminating chunk or close)."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                out.append(self.next_event(max(deadline - time.monotonic(), 0.001)))
            except EOFError:
                return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Sse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def log_ids(events: list[dict[str, Any]]) -> list[int]:
    for e in events:
        assert e["event"] == "log", e
        assert e["id"] == e["data"]["id"], e
    return [e["id"] for e in events]


# ---- /metrics ----------------------------------------------------------------------------------

def test_metrics_families_are_all_loom_prefixed(daemon):
    families = scrape(daemon)
    assert families and all(name.startswith("loom_") for name in families), sorted(families)
    for family in ("loom_http_requests", "loom_tokens", "loom_queue_depth", "loom_rows_active",
                   "loom_registration_ready", "loom_device_memory_bytes", "loom_device_budget_bytes"):
        assert family in families, sorted(families)
    assert families["loom_http_requests"].type == "counter"
    assert families["loom_tokens"].type == "counter"
    for gauge in ("loom_queue_depth", "loom_rows_active", "loom_device_memory_bytes"):
        assert families[gauge].type == "gauge"


def test_http_requests_counted_by_route_and_status(daemon):
    before = request_counts(daemon)               # this scrape itself is counted after it renders
    for _ in range(3):
        assert daemon.request("GET", "/v1/models").status == 200
    assert daemon.request("GET", "/v1/models", unix=True).status == 200   # both listeners count
    for _ in range(2):
        assert_error(daemon.request("POST", "/v1/models/drain", {"model": "nope"}), 404)
    assert_error(daemon.request("GET", "/v1/requests?limit=0"), 400)
    assert_error(daemon.request("GET", "/no/such/route"), 404)
    assert_error(daemon.request("DELETE", "/metrics"), 405)
    after = request_counts(daemon)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    delta = {k: v for k, v in delta.items() if v}
    # each of the 5 rejections was followed by the harness's /healthz probe, counted too
    assert delta == {("/metrics", "200"): 1, ("/v1/models", "200"): 4, ("/v1/models/drain", "404"): 2,
                     ("/v1/requests", "400"): 1, ("unmatched", "404"): 1, ("unmatched", "405"): 1,
                     ("/healthz", "200"): 5}, delta


VARIANTS = "/v1/models/variants"


def journal_since(daemon: Daemon, after: int) -> list[dict[str, Any]]:
    """Every journal entry newer than `after`, paging /logz to the end."""
    out, cursor = [], after
    while True:
        _, page, headers = logz(daemon, cursor=cursor, limit=1000)
        if not page:
            return out
        out += page
        cursor = int(headers["x-loom-cursor"])


def wait_for_entry(daemon: Daemon, after: int, predicate, what: str) -> dict[str, Any]:
    """The first journal entry newer than `after` that satisfies `predicate` (polled, with a deadline)."""
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while True:
        found = [e for e in journal_since(daemon, after) if predicate(e)]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no journal entry for {what}"
        time.sleep(POLL_S)  # poll interval; the deadline bounds the wait


def delta_of(before: dict, after: dict) -> dict:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in delta.items() if v}


def test_a_client_that_leaves_before_any_response_is_counted_once_as_499(daemon, tmp_path):
    """A request still waiting server-side when its client closes the connection is counted once
    in loom_http_requests_total, as 499 for its route, and never as a 5xx (nor later as the
    200 it would have had). The request is a variant staging with `wait` on `mini`: its
    compilation is queued behind loomd's two build workers, each held in the preparation of a
    registration whose checkpoint is a FIFO (`HeldCheckpoint`), so the handler keeps waiting
    until the test lets go; the queued staging is observed in /logz before the client leaves."""
    base = daemon.request("GET", VARIANTS, headers={"X-Loom-Model": "mini"}).json()["selected"]
    names = ["held499a", "held499b"]
    held = [HeldCheckpoint(tmp_path / f"{name}.gguf") for name in names]
    try:
        for name, checkpoint in zip(names, held):
            (tmp_path / name).mkdir()
            document = mini_document(tmp_path / name, model=name, checkpoint=str(checkpoint.path))
            response = daemon.request("POST", "/v1/models/register", document)
            assert response.status == 202, response.body
        for checkpoint in held:
            checkpoint.wait_reader()          # both build workers are blocked in preparation
        before = request_counts(daemon)
        start = newest_id(daemon)
        body = json.dumps({"model": "mini", "base": base, "sources": [str(MINI / "model.loom")]}).encode()
        with daemon.connect(timeout=IO_TIMEOUT_S) as client:
            client.sendall(f"POST {VARIANTS} HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            staged = wait_for_entry(daemon, start,
                                    lambda e: e["event"] == "variant_compiling" and e.get("model") == "mini",
                                    "the staged variant")["variant"]
            events = [e["event"] for e in journal_since(daemon, start) if e.get("variant") == staged]
            assert events == ["variant_compiling"], events     # queued: no worker was free to compile it
            client.setblocking(False)
            with pytest.raises(BlockingIOError):               # and nothing was answered yet
                client.recv(1)
        # the client has left: its waiting handler is cancelled and counted
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while (delta := delta_of(before, request_counts(daemon))).get((VARIANTS, "499"), 0) < 1:
            assert time.monotonic() < deadline, delta
            time.sleep(POLL_S)  # poll interval; the deadline bounds the wait
        # the held work ends (both preparations fail), so the queued compilation runs to its end:
        # a disconnect withdraws the reader, not the accepted compilation
        for checkpoint in held:
            checkpoint.release()
        wait_for_entry(daemon, start, lambda e: e.get("variant") == staged and e["event"] == "variant_ready",
                       "the staged variant to compile")
        for name in names:
            wait_for_entry(daemon, start, lambda e, name=name: e.get("model") == name and e["event"] == "failed",
                           f"{name}'s preparation to end")
        delta = delta_of(before, request_counts(daemon))
        assert {k: v for k, v in delta.items() if k[0] == VARIANTS} == {(VARIANTS, "499"): 1}, delta
        assert not [k for k in delta if k[1].startswith("5")], delta
        removed = daemon.request("POST", VARIANTS + "/remove", {"model": "mini", "variant": staged})
        assert removed.status == 200 and removed.json() == {"removed": staged}, removed.body
    finally:
        for checkpoint in held:
            checkpoint.release()
        for name in names:
            daemon.request("POST", "/v1/models/unregister", {"model": name, "mode": "abort"})
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while set(names) & {r["model"] for r in daemon.request("GET", "/v1/status").json()["registrations"]}:
            assert time.monotonic() < deadline, "the held registrations were not removed"
            time.sleep(POLL_S)  # poll interval; the deadline bounds the wait
        for checkpoint in held:               # removal joined their builds: nobody reads the FIFOs now
            checkpoint.close()


def test_memory_gauges_match_status_accounting(daemon):
    families = scrape(daemon)
    devices = daemon.request("GET", "/v1/status").json()["devices"]
    want = {(d["name"], owner, category): n
            for d in devices for owner, categories in d["owners"].items() for category, n in categories.items()}
    assert want, devices   # mini and spare own params and state
    assert {("mini/primary", "params"), ("spare/primary", "state")} <= {(o, c) for _, o, c in want}
    got = {(dict(k)["device"], dict(k)["owner"], dict(k)["category"]): v
           for k, v in samples(families, "loom_device_memory_bytes").items()}
    assert got == want
    budgets = {dict(k)["device"]: v for k, v in samples(families, "loom_device_budget_bytes").items()}
    assert budgets == {d["name"]: d["budget_bytes"] for d in devices}


def test_queue_and_row_gauges_per_model(daemon):
    status = daemon.request("GET", "/v1/status").json()
    families = scrape(daemon)
    models = {r["model"]: r for r in status["registrations"]}
    assert {"mini", "spare"} <= set(models)
    for family, field in (("loom_queue_depth", "pending"), ("loom_rows_active", "active")):
        per_model = {dict(k)["model"]: v for k, v in samples(families, family).items()}
        assert set(per_model) == set(models), (family, per_model)
        for name, reg in models.items():
            assert per_model[name] == reg["scheduler"][field] == 0, (family, name)
    ready = {dict(k)["model"]: v for k, v in samples(families, "loom_registration_ready").items()}
    assert ready == {name: (1 if reg["phase"] == "ready" else 0) for name, reg in models.items()}


def test_drained_model_keeps_its_gauges(daemon):
    assert daemon.request("POST", "/v1/models/drain", {"model": "mini"}).status == 200
    try:
        families = scrape(daemon)
        assert ("model", "mini") in {k[0] for k in samples(families, "loom_queue_depth")}
        ready = {dict(k)["model"]: v for k, v in samples(families, "loom_registration_ready").items()}
        assert ready["mini"] == 1
    finally:
        assert daemon.request("POST", "/v1/models/undrain", {"model": "mini"}).status == 200


# ---- /logz ---------------------------------------------------------------------------------------

def test_logz_is_jsonl_with_increasing_ids_and_a_cursor(daemon):
    make_entries(daemon, 2)
    r = daemon.request("GET", "/logz?limit=1000")
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/x-ndjson"), r.headers
    assert r.body.endswith(b"\n")
    entries = [json.loads(line) for line in r.body.decode().splitlines()]
    ids = [e["id"] for e in entries]
    assert ids == list(range(1, len(ids) + 1)), ids      # a fresh journal: nothing dropped yet
    assert int(r.headers["x-loom-cursor"]) == ids[-1]
    for e in entries:
        assert isinstance(e["time"], float) and isinstance(e["event"], str) and e["model"], e
    # the server's own lifecycle is there: both deployments registered and became ready
    seen = {(e["model"], e["event"]) for e in entries}
    assert {("mini", "registering"), ("mini", "ready"), ("spare", "ready"), ("spare", "open")} <= seen


def test_logz_cursor_returns_only_newer_entries(daemon):
    start = newest_id(daemon)
    made = make_entries(daemon, 3)
    _, entries, headers = logz(daemon, cursor=start)
    assert [e["id"] for e in entries] == made
    assert all(e["event"] == "open" and e["model"] == "spare" for e in entries)
    assert int(headers["x-loom-cursor"]) == made[-1]
    _, entries, headers = logz(daemon, cursor=made[1])
    assert [e["id"] for e in entries] == made[2:]
    # at the newest entry: an empty page that keeps the cursor where it is
    r = daemon.request("GET", f"/logz?cursor={made[-1]}")
    assert r.status == 200 and r.body == b"" and r.headers["x-loom-cursor"] == str(made[-1])


def test_logz_limit_bounds_the_page_and_paging_loses_nothing(daemon):
    start = newest_id(daemon)
    made = make_entries(daemon, 5)
    _, entries, headers = logz(daemon, cursor=start, limit=2)
    assert [e["id"] for e in entries] == made[:2]
    assert int(headers["x-loom-cursor"]) == made[1]
    paged, cursor = [], start
    while True:
        _, page, headers = logz(daemon, cursor=cursor, limit=2)
        assert len(page) <= 2
        if not page:
            break
        paged += page
        cursor = int(headers["x-loom-cursor"])
    assert [e["id"] for e in paged] == made
    assert logz(daemon, cursor=start, limit=1000)[1] == paged


def test_logz_default_page_is_bounded(daemon):
    have = newest_id(daemon)
    if have <= 100:
        make_entries(daemon, 101 - have)
    _, entries, headers = logz(daemon)
    assert [e["id"] for e in entries] == list(range(1, 101))
    assert headers["x-loom-cursor"] == "100"
    _, entries, _ = logz(daemon, limit=1000)
    assert len(entries) == min(newest_id(daemon), 1000) > 100


@pytest.mark.parametrize("query, param", [
    ("cursor=abc", "cursor"), ("cursor=-1", "cursor"), ("cursor=", "cursor"), ("cursor=01", "cursor"),
    ("cursor=1.5", "cursor"), ("cursor=1&cursor=2", "cursor"), ("cursor=99999999999999999999", "cursor"),
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=x", "limit"), ("limit=-5", "limit"),
    ("since=3", "since"), ("cursor=1&format=json", "format"),
])
def test_logz_rejects_bad_queries(daemon, query, param):
    assert_error(daemon.request("GET", f"/logz?{query}"), 400, param=param, code="invalid_request")


def test_logz_rejects_a_cursor_ahead_of_the_journal(daemon):
    """A cursor this process never issued (say, from before a restart) would silently skip
    the entries up to it once they exist; it is rejected instead."""
    newest = newest_id(daemon)
    assert_error(daemon.request("GET", f"/logz?cursor={newest + 1}"), 400, param="cursor")
    r = daemon.request("GET", f"/logz?cursor={newest}")
    assert r.status == 200 and r.headers["x-loom-cursor"] == str(newest)


# ---- /logz/stream ------------------------------------------------------------------------------

def test_stream_from_event_zero_replays_the_journal(daemon):
    newest = newest_id(daemon)
    assert newest < 4096   # inside the retained window: no gap expected
    with Sse(daemon, {"Last-Event-ID": "0"}) as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream"), stream.headers
        assert stream.headers.get("cache-control") == "no-cache"
        events = stream.events(newest)
        assert log_ids(events) == list(range(1, newest + 1))
        assert [e["data"] for e in events] == logz(daemon, limit=1000)[1][:newest]
        # then it follows: a new entry arrives as the very next event
        made = make_entries(daemon, 1)
        assert log_ids([stream.next_event()]) == made


def test_stream_without_a_cursor_starts_at_the_newest_entry(daemon):
    with Sse(daemon) as stream:
        assert stream.status == 200
        made = make_entries(daemon, 2)
        assert log_ids(stream.events(2)) == made


def test_stream_resume_with_last_event_id_has_no_duplicates_or_holes(daemon):
    with Sse(daemon) as first:
        made = make_entries(daemon, 3)
        seen = first.events(3)
        assert log_ids(seen) == made
    resume_from = seen[1]["id"]                # as if the client had only processed two events
    later = make_entries(daemon, 4)            # made while no stream is connected
    with Sse(daemon, {"Last-Event-ID": str(resume_from)}) as second:
        expected = [made[2]] + later
        resumed = second.events(len(expected))
        assert log_ids(resumed) == expected
        assert [e["data"] for e in resumed] == logz(daemon, cursor=resume_from)[1]
        # nothing else was queued before the next new entry (no duplicate, no hole)
        following = make_entries(daemon, 1)
        assert log_ids([second.next_event()]) == following


def test_stream_cursor_query_and_last_event_id_precedence(daemon):
    base = newest_id(daemon)
    made = make_entries(daemon, 3)
    with Sse(daemon, query=f"?cursor={made[0]}") as stream:
        assert log_ids(stream.events(2)) == made[1:]
    # a reconnecting client sends Last-Event-ID; it wins over the URL's original cursor
    with Sse(daemon, {"Last-Event-ID": str(made[1])}, query=f"?cursor={base}") as stream:
        assert log_ids(stream.events(1)) == made[2:]
        following = make_entries(daemon, 1)
        assert log_ids([stream.next_event()]) == following


def test_two_streams_have_independent_cursors(daemon):
    base = newest_id(daemon)
    early = make_entries(daemon, 2)
    with Sse(daemon) as newest, Sse(daemon, {"Last-Event-ID": str(base)}) as older:
        assert log_ids(older.events(2)) == early     # the older cursor replays first
        made = make_entries(daemon, 2)
        assert log_ids(newest.events(2)) == made
        assert log_ids(older.events(2)) == made
        newest.close()                               # one reader leaving does not move the other
        more = make_entries(daemon, 1)
        assert log_ids(older.events(1)) == more


def test_stream_over_the_unix_socket(daemon):
    with Sse(daemon, unix=True) as stream:
        assert stream.status == 200
        made = make_entries(daemon, 1)
        assert log_ids(stream.events(1)) == made


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "01", "", "0x10", "1 2", "99999999999999999999"])
def test_stream_rejects_a_malformed_last_event_id(daemon, value):
    with Sse(daemon, {"Last-Event-ID": value}) as refused:   # a deadline, should it stream instead
        assert_error(refused.response(), 400)


@pytest.mark.parametrize("query, param", [("cursor=x", "cursor"), ("cursor=-2", "cursor"),
                                          ("limit=5", "limit"), ("after=1", "after")])
def test_stream_rejects_bad_queries(daemon, query, param):
    with Sse(daemon, query=f"?{query}") as refused:
        assert_error(refused.response(), 400, param=param)


def test_stream_rejects_a_cursor_ahead_of_the_journal(daemon):
    newest = newest_id(daemon)
    with Sse(daemon, {"Last-Event-ID": str(newest + 5)}) as refused:
        assert_error(refused.response(), 400, param="Last-Event-ID")
    with Sse(daemon, query=f"?cursor={newest + 1}") as refused:
        assert_error(refused.response(), 400, param="cursor")


def test_a_departed_stream_reader_is_not_a_server_error(daemon):
    """Closing an SSE connection ends its stream quietly: counted once as a 200 (never a
    500), and the server keeps streaming to everyone else."""
    before = request_counts(daemon)
    closed = 3
    for _ in range(closed):
        with Sse(daemon) as stream:
            made = make_entries(daemon, 1)
            assert log_ids(stream.events(1)) == made
    make_entries(daemon, 2)     # writes to the departed readers would fail now
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while True:
        counts = request_counts(daemon)
        done = counts.get(("/logz/stream", "200"), 0) - before.get(("/logz/stream", "200"), 0)
        if done >= closed or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)      # poll interval; the deadline bounds the wait
    assert done >= closed, counts
    assert all(status != "500" for _, status in counts), counts
    with Sse(daemon) as stream:
        made = make_entries(daemon, 1)
        assert log_ids(stream.events(1)) == made


def test_open_stream_ends_when_the_server_stops(tmp_path):
    """SIGTERM with a connected SSE reader: the stream ends (any entries it still carries are
    in order) and the server exits 0 without waiting for the reader. The grace period is far
    longer than the hang guard of `stop`, so a server that waited on the stream would be
    killed there and fail the exit-code check."""
    document = tmp_path / "solo.json"
    document.write_text(mini_document(tmp_path, model="solo"))
    server = Daemon.start(tmp_path, [document], "--grace", "3600")
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "ready" for e in logz(server)[1]):
            assert time.monotonic() < deadline, logz(server)[1]
            time.sleep(POLL_S)  # poll interval; the deadline bounds the wait
        with Sse(server, {"Last-Event-ID": "0"}) as stream:
            first = stream.events(4)
            assert [e["data"]["event"] for e in first] == ["registering", "compiling", "preparing", "ready"]
            code = server.stop(timeout=60)
            rest = stream.read_to_end()
            assert log_ids(rest) == list(range(5, 5 + len(rest)))   # whatever came, in order
    finally:
        if server.process.poll() is None:
            code = server.stop()
    assert code == 0, "".join(server.output)


RETENTION = 8   # `loomd serve --log-retention`: journal entries kept


def test_a_cursor_behind_the_retained_window_gets_an_explicit_gap(tmp_path):
    """A real loomd keeping only RETENTION journal entries: /logz from a cursor that fell out of
    the window starts with a gap record naming exactly what was lost; /logz/stream resumed
    from such a Last-Event-ID first sends an explicit `gap` event (its id is the last lost
    entry), then every retained entry in order, then follows new ones. A resume inside the
    window gets no gap."""
    server = Daemon.start(tmp_path, [write_document(tmp_path, "brief")], "--log-retention", str(RETENTION))
    try:
        assert wait_ready(server, ["brief"]), server.request("GET", "/v1/status").body
        assert newest_id(server) >= 2                    # registering ... ready: ids 1 and 2 were issued
        make_entries(server, RETENTION, model="brief")
        made = make_entries(server, RETENTION, model="brief")   # the first batch (and startup) falls out
        newest, oldest = made[-1], made[0]
        assert made == list(range(newest - RETENTION + 1, newest + 1))
        lost = {"event": "gap", "from": 3, "to": oldest - 1, "missed": oldest - 3}

        _, lines, headers = logz(server, cursor=oldest - 1, limit=1000)     # the window's edge
        assert [e["id"] for e in lines] == made
        _, lines, headers = logz(server, cursor=2, limit=1000)
        assert lines[0] == lost, lines[0]
        assert [e["id"] for e in lines[1:]] == made and headers["x-loom-cursor"] == str(newest)

        with Sse(server, {"Last-Event-ID": "2"}) as stream:
            assert stream.status == 200
            assert stream.next_event() == {"id": oldest - 1, "event": "gap", "data": lost}
            assert log_ids(stream.events(RETENTION)) == made
            following = make_entries(server, 1, model="brief")
            assert log_ids([stream.next_event()]) == following
        with Sse(server, {"Last-Event-ID": str(oldest)}, unix=True) as stream:   # inside the window now
            assert log_ids(stream.events(RETENTION)) == made[1:] + following
    finally:
        code = server.stop()
    assert code == 0, "".join(server.output)


def test_log_retention_must_be_positive():
    result = subprocess.run([sys.executable, "-m", "loomd", "serve", "--listen", "127.0.0.1:0", "--log-retention", "0"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--log-retention" in result.stderr, result.stderr


# ---- /v1/requests and /v1/sessions --------------------------------------------------------------

@pytest.mark.parametrize("query", ["", "?model=mini", "?model=spare", "?limit=1", "?limit=1000",
                                   "?after=5&limit=1", "?model=mini&after=0&limit=10"])
def test_requests_lists_no_live_requests(daemon, query):
    """The daemon's deployments (`mini` packages, kind sequence) have no HTTP inference route
    yet, so nothing is live: an empty, final page."""
    r = daemon.request("GET", "/v1/requests" + query)
    assert r.status == 200, r.body
    assert r.json() == {"object": "list", "data": [], "next_after": None}


@pytest.mark.parametrize("query, param", [
    ("limit=0", "limit"), ("limit=1001", "limit"), ("limit=abc", "limit"), ("limit=1&limit=2", "limit"),
    ("after=-1", "after"), ("after=x", "after"), ("cursor=1", "cursor"), ("model=mini&state=active", "state"),
])
def test_requests_rejects_bad_queries(daemon, query, param):
    assert_error(daemon.request("GET", f"/v1/requests?{query}"), 400, param=param, code="invalid_request")


def test_requests_unknown_model_is_404(daemon):
    assert_error(daemon.request("GET", "/v1/requests?model=nope"), 404, param="model", code="not_found")


def test_sessions_lists_none_without_a_retained_text_service(daemon):
    for query in ("", "?limit=1", "?after=3&limit=1000"):
        r = daemon.request("GET", "/v1/sessions" + query)
        assert r.status == 200, r.body
        assert r.json() == {"object": "list", "data": [], "next_after": None}


def test_sessions_of_a_model_without_retained_text_is_501(daemon):
    assert_error(daemon.request("GET", "/v1/sessions?model=mini"), 501, code="not_implemented")
    assert_error(daemon.request("GET", "/v1/sessions?model=nope"), 404, param="model", code="not_found")


@pytest.mark.parametrize("query, param", [("limit=0", "limit"), ("limit=1001", "limit"), ("after=-1", "after"),
                                          ("session=x", "session")])
def test_sessions_rejects_bad_queries(daemon, query, param):
    assert_error(daemon.request("GET", f"/v1/sessions?{query}"), 400, param=param, code="invalid_request")
