"""`loomd.aiohttp_adapter`: the supported aiohttp range, and what the adapter does to aiohttp.

The version tests read `AIOHTTP_SUPPORTED` (the one constant) and never reinstall aiohttp.
The protocol tests run `JsonErrorRunner` in-process over a Unix socket with a two-route app,
one test per aiohttp internal the adapter relies on, so an aiohttp upgrade that moves one of
them fails here by name (tests/conformance/test_framing.py covers the same over a real
daemon). Every socket read has a deadline."""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from loomd.aiohttp_adapter import (AIOHTTP_REQUIREMENT, AIOHTTP_SUPPORTED, AdapterProtocol, Deadlines,
                                   check_aiohttp_version)
from loomd.app import Settings
from loomd.cli import main, serve
from loomd.framing import JsonErrorRunner, read_body

REPO = Path(__file__).resolve().parents[3]
DEADLINE_S = 10.0
#: aiohttp would linger this long reading an unwanted body; a prompt close is well under it.
LINGER_S = 10.0

(LOW_MAJOR, LOW_MINOR), (HIGH_MAJOR, HIGH_MINOR) = AIOHTTP_SUPPORTED
SUPPORTED_TEXT = f">={LOW_MAJOR}.{LOW_MINOR},<{HIGH_MAJOR}.{HIGH_MINOR}"


# ---- the supported range ---------------------------------------------------------------------------

def test_the_installed_aiohttp_is_supported():
    check_aiohttp_version()
    check_aiohttp_version(aiohttp.__version__)


@pytest.mark.parametrize("version", [f"{LOW_MAJOR}.{LOW_MINOR}.0", f"{LOW_MAJOR}.{LOW_MINOR}",
                                     f"{LOW_MAJOR}.{LOW_MINOR}.99", f"{LOW_MAJOR}.{LOW_MINOR}.1.post1"])
def test_versions_in_the_range_are_accepted(version):
    assert (LOW_MAJOR, LOW_MINOR + 1) <= (HIGH_MAJOR, HIGH_MINOR)  # the cases below stay in range
    check_aiohttp_version(version)


@pytest.mark.parametrize("version", [
    f"{LOW_MAJOR}.{LOW_MINOR - 1}.9" if LOW_MINOR else f"{LOW_MAJOR - 1}.99.0",   # just below
    f"{HIGH_MAJOR}.{HIGH_MINOR}.0",                                             # the excluded bound
    f"{HIGH_MAJOR}.{HIGH_MINOR}.0a1",                                           # its pre-release
    f"{HIGH_MAJOR + 1}.0.0",                                                    # next major
    f"{LOW_MAJOR}.{LOW_MINOR}0.0",                                              # 3.140: not 3.14
    "unknown",
])
def test_versions_outside_the_range_are_refused_naming_both(version):
    with pytest.raises(RuntimeError) as refused:
        check_aiohttp_version(version)
    message = str(refused.value)
    assert f"aiohttp {version} is installed" in message
    assert f"supports only aiohttp{SUPPORTED_TEXT}" in message


def test_pyproject_pins_the_supported_range():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [d for d in dependencies if d.split(">")[0].split("<")[0].split("=")[0].strip() == "aiohttp"]
    assert pinned == [AIOHTTP_REQUIREMENT] == [f"aiohttp{SUPPORTED_TEXT}"]


def test_serve_refuses_an_unsupported_aiohttp_before_starting(monkeypatch, tmp_path):
    monkeypatch.setattr(aiohttp, "__version__", f"{HIGH_MAJOR}.{HIGH_MINOR}.0")
    result = CliRunner().invoke(main, ["serve", "--listen", f"unix:{tmp_path / 'never.sock'}",
                                       str(tmp_path / "absent.json")])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)           # a message, not a traceback
    assert f"aiohttp {HIGH_MAJOR}.{HIGH_MINOR}.0 is installed" in result.output
    assert f"supports only aiohttp{SUPPORTED_TEXT}" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "never.sock").exists()


def test_the_runner_refuses_an_unsupported_aiohttp(monkeypatch):
    monkeypatch.setattr(aiohttp, "__version__", f"{HIGH_MAJOR + 1}.0.0")
    with pytest.raises(RuntimeError, match=rf"supports only aiohttp{SUPPORTED_TEXT.replace('.', '[.]')}"):
        JsonErrorRunner(web.Application())


# ---- the protocol, in-process ----------------------------------------------------------------------

class Served:
    """A JsonErrorRunner on a Unix socket; `cancelled` records handlers cancelled by a disconnect."""

    def __init__(self, path: Path, **kwargs) -> None:
        self.path = path
        self.counted: list[int] = []  # statuses of the responses made below the application
        self.kwargs = {"count": self.counted.append, **kwargs}
        self.cancelled: list[str] = []
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def __aenter__(self) -> Served:
        async def echo(request: web.Request) -> web.Response:  # the body's length, read through read_body
            try:
                body = await read_body(request, 1 << 20)
            except Exception as exc:  # the app's error middleware, reduced
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response({"length": len(body)})

        async def hold(request: web.Request) -> web.Response:  # waits until cancelled or released
            self.waiting.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(request.path)
                raise
            return web.json_response({})

        async def stream(request: web.Request) -> web.StreamResponse:  # 64 KiB blocks until cancelled
            response = web.StreamResponse()
            await response.prepare(request)
            try:
                while True:
                    await response.write(b"x" * 65536)
            except asyncio.CancelledError:
                self.cancelled.append(request.path)
                raise

        async def refuse(request: web.Request) -> web.Response:  # answers and closes, body unread
            response = web.json_response({"error": "too large"}, status=413)
            response.force_close()
            return response

        app = web.Application()
        app.router.add_post("/echo", echo)
        app.router.add_post("/hold", hold)
        app.router.add_post("/refuse", refuse)
        app.router.add_get("/stream", stream)
        self.runner = JsonErrorRunner(app, access_log=None, **self.kwargs)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_unix_connection(str(self.path)), DEADLINE_S)


async def read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes the connection."""
    return await asyncio.wait_for(reader.read(), DEADLINE_S)


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in `data`, each (status, lower-cased headers, body) (bodies by Content-Length)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return out


def post(path: str, body: bytes, declared: int | None = None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n").encode() + body


async def wait_phases(served: Served, phases: list[str]) -> None:
    """Wait until the server's open connections are in `phases` (in the order they opened)."""
    for _ in range(int(DEADLINE_S / 0.01)):
        if [c._loom_phase for c in served.runner.server.connections] == phases:
            return
        await asyncio.sleep(0.01)  # poll; bounded by the loop count
    raise AssertionError([c._loom_phase for c in served.runner.server.connections])


def run(scenario, tmp_path: Path, **kwargs) -> None:
    async def main_():
        async with Served(tmp_path / "s.sock", **kwargs) as served:
            await asyncio.wait_for(scenario(served), 3 * DEADLINE_S)
    asyncio.run(main_())


def test_the_servers_protocol_is_the_adapters(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b"abc"))
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
        assert [type(c) for c in served.runner.server.connections] == [AdapterProtocol]
        writer.close()
    run(scenario, tmp_path)


def test_a_parser_error_is_a_json_400_and_closes(tmp_path):
    """RequestHandler.handle_error."""
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(b"GARBAGE\r\nHost: t\r\n\r\n")
        data = await read_all(reader)
        assert data.startswith(b"HTTP/1.1 400 "), data  # not the HTTP/1.0 of aiohttp's ERROR message
        [(status, headers, body)] = responses(data)
        assert status == 400 and headers["content-type"].startswith("application/json")
        assert json.loads(body)["error"]["message"].startswith("malformed HTTP request: ")
        assert served.counted == [400]
        writer.close()
    run(scenario, tmp_path)


# ---- deadlines (AdapterProtocol's phases; each test's bound is generous: "it does not hang")

SHORT = 0.5
PROGRESSING = 1.0


def test_a_request_whose_headers_never_finish_is_closed(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\n")  # no end of headers
        assert await read_all(reader) == b""
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(header_timeout=SHORT))


def test_a_just_opened_connection_that_sent_nothing_is_not_closed_to_make_room(tmp_path):
    """`Deadlines.silent_after`: a burst of new connections is not taken for stalled ones."""
    async def scenario(served):
        _, silent = await served.connect()
        await wait_phases(served, ["new"])
        reader, writer = await served.connect()
        [(status, _, _)] = responses(await read_all(reader))
        assert status == 503
        for w in (writer, silent):
            w.close()
    run(scenario, tmp_path, max_connections=1, deadlines=Deadlines(silent_after=60))


def test_a_connection_silent_for_a_while_is_closed_to_make_room(tmp_path):
    async def scenario(served):
        silent_reader, silent = await served.connect()
        await wait_phases(served, ["new"])
        await asyncio.sleep(SHORT)  # past silent_after (an order, not a bound)
        reader, writer = await served.connect()
        writer.write(post("/echo", b"abc"))
        [(status, _, _)] = responses(await asyncio.wait_for(reader.readuntil(b"}"), DEADLINE_S))
        assert status == 200
        assert await read_all(silent_reader) == b""
        for w in (writer, silent):
            w.close()
    run(scenario, tmp_path, max_connections=1, deadlines=Deadlines(silent_after=SHORT / 2))


def test_a_connection_that_sends_nothing_is_closed_by_the_header_deadline(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        assert await read_all(reader) == b""
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(header_timeout=SHORT))


def test_a_stalled_body_is_closed_and_its_handler_ends(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b"ab", declared=10))
        assert await read_all(reader) == b""
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(body_timeout=SHORT), handler_cancellation=True)


def test_a_body_that_keeps_progressing_outlives_the_body_deadline(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b"", declared=8))
        for _ in range(8):  # one byte every fifth of the deadline (room for a loaded machine): 1.6 deadlines
            await asyncio.sleep(PROGRESSING / 5)
            writer.write(b"x")
        [(status, _, body)] = responses(await asyncio.wait_for(reader.readuntil(b"}"), DEADLINE_S))
        assert (status, json.loads(body)) == (200, {"length": 8})
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(body_timeout=PROGRESSING))


def test_an_idle_kept_alive_connection_is_closed(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b"{}"))
        data = await read_all(reader)  # the answer, then EOF once it stays idle
        assert [status for status, _, _ in responses(data)] == [200]
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(header_timeout=60, keepalive_timeout=SHORT))


def test_a_running_handler_is_not_cut_by_the_read_deadlines(tmp_path):
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/hold", b"{}"))
        await asyncio.wait_for(served.waiting.wait(), DEADLINE_S)
        await asyncio.sleep(SHORT * 4)  # past every deadline
        assert not reader.at_eof() and served.cancelled == []
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(header_timeout=SHORT, body_timeout=SHORT, keepalive_timeout=SHORT),
        handler_cancellation=True)


def test_reading_connections_over_their_bound_close_the_oldest(tmp_path):
    async def scenario(served):
        first_reader, first = await served.connect()
        first.write(post("/echo", b"a", declared=10))
        await wait_phases(served, ["body"])
        _, second = await served.connect()
        await wait_phases(served, ["body", "new"])  # a connection that sent nothing is not reading yet
        second.write(post("/echo", b"b", declared=10))
        assert await read_all(first_reader) == b""  # the oldest progress is the first's
        second.write(b"x" * 9)
        for w in (first, second):
            w.close()
    run(scenario, tmp_path, deadlines=Deadlines(max_reading=1))


def test_a_reader_that_stops_reading_a_stream_is_cut_after_the_write_stall(tmp_path):
    """asyncio's pause_writing/resume_writing."""
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)  # then reads nothing more
        for _ in range(int(3 * DEADLINE_S / 0.05)):
            if served.cancelled:
                break
            await asyncio.sleep(0.05)  # poll; bounded by the loop count
        assert served.cancelled == ["/stream"]
        writer.close()
    run(scenario, tmp_path, deadlines=Deadlines(write_stall_timeout=SHORT), handler_cancellation=True)


def test_serve_defaults_are_the_settings_defaults():
    defaults = {p.name: p.default for p in serve.params}
    settings = Settings()
    for name in ("connections", "reading_connections", "header_timeout", "body_timeout", "keepalive_timeout",
                 "write_stall_timeout", "request_body_bytes", "log_retention"):
        assert defaults[name] == getattr(settings, name), name


@pytest.mark.parametrize("cancellation", [True, False])
def test_connections_over_the_bound_get_503_and_close(tmp_path, cancellation):
    """RequestHandler.connection_made; `Server.connections` counts the served ones. The held
    connection has a handler running, so no room can be made."""
    async def scenario(served):
        _, held = await served.connect()
        held.write(post("/hold", b"{}"))
        await asyncio.wait_for(served.waiting.wait(), DEADLINE_S)
        reader, writer = await served.connect()
        [(status, headers, body)] = responses(await read_all(reader))  # answered without a request
        assert status == 503 and headers["connection"].lower() == "close"
        assert json.loads(body)["error"]["code"] == "unavailable"
        assert served.counted == [503]
        served.release.set()
        writer.close()
        held.close()
    run(scenario, tmp_path, max_connections=1, handler_cancellation=cancellation)


def test_a_connection_over_the_bound_closes_the_idle_kept_alive_one(tmp_path):
    """`AdapterServer.make_room`: the kept-alive connection (phase `idle`) makes room."""
    async def scenario(served):
        held_reader, held = await served.connect()
        held.write(post("/echo", b"{}"))
        await asyncio.wait_for(held_reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
        reader, writer = await served.connect()
        writer.write(post("/echo", b"abc") )
        [(status, _, body)] = responses(await asyncio.wait_for(reader.readuntil(b"}"), DEADLINE_S))
        assert (status, json.loads(body)) == (200, {"length": 3})
        await asyncio.wait_for(held_reader.read(), DEADLINE_S)  # the rest of its answer, then EOF
        assert held_reader.at_eof()
        writer.close()
        held.close()
    run(scenario, tmp_path, max_connections=1)


def test_a_connection_over_the_bound_closes_the_stalled_reading_one(tmp_path):
    """`AdapterServer.make_room` prefers a connection still reading its request over an idle one."""
    async def scenario(served):
        idle_reader, idle = await served.connect()
        idle.write(post("/echo", b"{}"))
        await asyncio.wait_for(idle_reader.readuntil(b"}"), DEADLINE_S)  # its whole answer
        stalled_reader, stalled = await served.connect()
        stalled.write(post("/echo", b"ab", declared=10))   # the rest never comes
        await wait_phases(served, ["idle", "body"])
        reader, writer = await served.connect()
        writer.write(post("/echo", b"abc"))
        [(status, _, _)] = responses(await asyncio.wait_for(reader.readuntil(b"}"), DEADLINE_S))
        assert status == 200
        assert await read_all(stalled_reader) == b""
        idle.write(post("/echo", b"x"))  # the idle one was kept
        assert b"200 OK" in await asyncio.wait_for(idle_reader.readuntil(b"}"), DEADLINE_S)
        for w in (writer, stalled, idle):
            w.close()
    run(scenario, tmp_path, max_connections=2)


@pytest.mark.parametrize("cut", [0, 2])
def test_a_body_cut_short_by_a_half_close_is_answered(tmp_path, cut):
    """RequestHandler.eof_received with the body of the request in progress (the request factory)."""
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b'{"a": 1}', declared=100)[:len(post("/echo", b"", declared=100)) + cut])
        await writer.drain()
        writer.write_eof()
        [(status, _, body)] = responses(await read_all(reader))
        assert status == 400 and "before the body was complete" in json.loads(body)["error"]
        writer.close()
    run(scenario, tmp_path, handler_cancellation=True)


def test_a_pipelined_body_cut_short_is_answered_after_the_request_before_it(tmp_path):
    """RequestHandler.eof_received with a body aiohttp parsed but has not started (`_messages`)."""
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/echo", b"x" * 300) + post("/echo", b"yy", declared=50))
        await writer.drain()
        writer.write_eof()
        answers = responses(await read_all(reader))
        assert [(status, json.loads(body)) for status, _, body in answers][0] == (200, {"length": 300})
        assert [status for status, _, _ in answers] == [200, 400], answers
        writer.close()
    run(scenario, tmp_path, handler_cancellation=True)


def test_a_client_that_half_closes_after_a_complete_request_has_left(tmp_path):
    """RequestHandler.eof_received: every body complete, so the handler is cancelled."""
    async def scenario(served):
        reader, writer = await served.connect()
        writer.write(post("/hold", b"{}"))
        await asyncio.wait_for(served.waiting.wait(), DEADLINE_S)
        writer.write_eof()
        assert await read_all(reader) == b""  # closed, nothing answered
        for _ in range(100):
            if served.cancelled:
                break
            await asyncio.sleep(0.01)  # poll; bounded by the loop count
        assert served.cancelled == ["/hold"]
        writer.close()
    run(scenario, tmp_path, handler_cancellation=True)


def test_a_closing_answer_to_an_unread_body_closes_without_lingering(tmp_path):
    """RequestHandler.finish_response: 413 with most of the body still to come closes at once."""
    async def scenario(served):
        reader, writer = await served.connect()
        started = asyncio.get_running_loop().time()
        writer.write(post("/refuse", b"x" * 10, declared=1 << 20))  # the rest never comes
        [(status, _, _)] = responses(await read_all(reader))
        assert status == 413
        assert asyncio.get_running_loop().time() - started < LINGER_S / 2
        writer.close()
    run(scenario, tmp_path)
