"""Slow and stalled peers against a real `loomd` serving scout, over real sockets.

docs/operations.md "Slow and stalled clients": the request headers must arrive within
`--header-timeout`, a body that stops progressing is cut after `--body-timeout`, a kept-alive
connection idle for `--keepalive-timeout` is closed (each without an answer), a response the
client stops reading is cut after `--write-stall-timeout`, and connections still reading a
request never lock out new ones. The daemon runs with 2 s deadlines and the
default connection bounds (256 open, 64 reading), as in issue 23's report: 300 connections
that send headers and part of a body, then stall. Every wait has a generous bound
(`CLOSED_WITHIN_S`): the tests check that nothing hangs, not how fast it goes."""

from __future__ import annotations

import json
import select
import socket

import pytest
from scout_daemon import Daemon, chat, start_scout

DEADLINE_S = 2.0
STALLED = 300
#: How long a test waits for the server to close a stalled connection: the deadline plus slack
#: for a loaded machine.
CLOSED_WITHIN_S = DEADLINE_S + 30.0
#: Bound on a normal chat completion while the stalled connections are open (a loaded CI machine).
CHAT_WITHIN_S = 120.0
HI = {"model": "scout", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
PARTIAL_UPLOAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n" + b'{"model": "scout", "messages": [')


@pytest.fixture(scope="module")
def scout(tmp_path_factory):
    """Scout sized as test_chat_scout's (its compiled kernels are reused), with 2 s deadlines."""
    server = start_scout(tmp_path_factory.mktemp("slow"), rows=4, context_length=512, max_output_tokens=64,
                         extra_args=("--header-timeout", str(DEADLINE_S), "--body-timeout", str(DEADLINE_S),
                                     "--keepalive-timeout", str(DEADLINE_S), "--write-stall-timeout", str(DEADLINE_S)))
    try:
        # the first completions compile their kernels: not what these tests are about
        assert chat(server, HI, timeout=CHAT_WITHIN_S).status == 200
        yield server
    finally:
        assert server.stop() == 0, "".join(server.output)
    assert "Unhandled exception" not in "".join(server.output), "".join(server.output)


def closed_by_server(s: socket.socket) -> bytes:
    """What the server sent before it closed `s` (a reset counts as closed); fails if it is
    still open after CLOSED_WITHIN_S."""
    s.settimeout(CLOSED_WITHIN_S)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server did not close the connection within {CLOSED_WITHIN_S} s") from None
    return data


def test_stalled_partial_uploads_leave_health_and_chat_answering_and_are_closed(scout: Daemon):
    stalled: list[socket.socket] = []
    try:
        for _ in range(STALLED):
            s = scout.connect(timeout=CLOSED_WITHIN_S)
            stalled.append(s)
            s.sendall(PARTIAL_UPLOAD)  # headers and part of the declared body, then nothing
        health = scout.request("GET", "/healthz", timeout=CLOSED_WITHIN_S, check_health=False)
        assert (health.status, health.json()) == (200, {"status": "ready"})
        answer = chat(scout, HI, timeout=CHAT_WITHIN_S)
        assert answer.status == 200, answer.body
        assert answer.json()["object"] == "chat.completion"
        for s in stalled:  # each was closed: to make room, or by the body deadline; never answered
            assert closed_by_server(s) == b""
    finally:
        for s in stalled:
            s.close()
    scout.assert_healthy()


def test_a_request_whose_headers_never_finish_is_closed(scout: Daemon):
    with scout.connect(timeout=CLOSED_WITHIN_S) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: loom\r\nContent-Le")  # and nothing more
        assert closed_by_server(s) == b""
    scout.assert_healthy()


def test_an_idle_kept_alive_connection_is_closed(scout: Daemon):
    with scout.connect(timeout=CLOSED_WITHIN_S) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: loom\r\n\r\n")  # keep-alive: HTTP/1.1's default
        data = closed_by_server(s)  # the answer, then the close once idle
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), data
    assert body == b'{"status": "ready"}', data
    scout.assert_healthy()


def test_a_client_that_stops_reading_a_response_is_cut_after_the_write_stall(scout: Daemon):
    """A 1 MB answer (the tokens of 1 MB of text) to a client that reads none of it. Over the Unix
    listener the kernel buffers about 200 KB, so the rest waits in the server, which aborts the
    connection once nothing has drained for `--write-stall-timeout` (over TCP on loopback the
    kernel may buffer megabytes first: the same deadline starts later)."""
    text = "hello world " * 87_000  # under /tokenize's bounds (1 MiB of text, 262,144 tokens)
    body = json.dumps({"model": "scout", "content": text}).encode()
    with scout.connect(unix=True, timeout=CLOSED_WITHIN_S) as s:
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        poll = select.poll()
        poll.register(s, select.POLLRDHUP)  # the server's end closed, seen without reading
        assert poll.poll(CLOSED_WITHIN_S * 1000), f"the connection was not cut within {CLOSED_WITHIN_S} s"
        data = closed_by_server(s)
    head, _, received = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    declared = int(headers[b"Content-Length"])
    assert len(received) < declared, (len(received), declared)  # cut, not completed
    scout.assert_healthy(unix=True)
