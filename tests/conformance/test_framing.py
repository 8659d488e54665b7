"""Request framing, body bounds, Expect, connection bounds and multipart uploads, over real sockets.

Spec: http-profiles.md "Request framing" and "Uploaded source packages". Every refusal is a
JSON error body `{"error": {"message", "type", "code", ...}}` with Content-Type
application/json, and the server keeps serving afterwards: `Daemon.raw`/`request` probe
/healthz after every rejected request, tests that read a refusal from their own socket call
`assert_healthy` after each case, and the autouse fixtures check /healthz after every test,
for the extra daemons of this module too."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loomd_process import REPO, Daemon, Response, read_response
from prometheus_client.parser import text_string_to_metric_families
from mini_package import MINI, mini_document, mini_weights

BODY_LIMIT = 1000
UNDRAIN = b'{"model":"mini"}'
BOUNDARY = "loom-Xq7Rb0undary"
#: How long a test waits for the server to close a connection it must close right after answering
#: (aiohttp's own behaviour would be to linger for 10 s reading the unwanted body).
CLOSE_S = 8.0


# ---------------------------------------------------------------- helpers

def cl_request(path: str, body: bytes, *extra: str, content_type: str = "application/json") -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: loom", "Connection: close", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes, size: int = 7) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def chunked_request(path: str, body: bytes, *extra: str, content_type: str = "application/json") -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: loom", "Connection: close", f"Content-Type: {content_type}",
            "Transfer-Encoding: chunked", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + chunked(body)


def assert_error(response: Response, status: int, code: str | None = None) -> dict:
    assert response.status == status, (response.status, response.body)
    assert response.headers["content-type"].split(";")[0].strip() == "application/json", response.headers
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert isinstance(error["code"], str) and error["code"]
    if code is not None:
        assert error["code"] == code, error
    return error


def read_until_close(s: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk


def parse_one(data: bytes) -> Response:
    """The single complete response in `data` (everything the server sent before closing)."""
    assert data.count(b"HTTP/1.") == 1, data
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Response(int(lines[0].split()[1]), headers, body)


def registered(server: Daemon) -> set[str]:
    return {r["model"] for r in server.request("GET", "/v1/status").json()["registrations"]}


def wait_phase(server: Daemon, name: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        regs = {r["model"]: r for r in server.request("GET", "/v1/status").json()["registrations"]}
        if regs.get(name, {}).get("phase") in ("ready", "failed"):
            return regs[name]
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    raise AssertionError(f"{name} did not settle: {regs.get(name)}")


def healthz_eventually(server: Daemon, timeout: float = 20.0) -> None:
    """/healthz answers 200 (a connection-bounded server may still be counting closed sockets)."""
    deadline = time.monotonic() + timeout
    while True:
        response = server.request("GET", "/healthz", check_health=False)  # this is the probe
        if response.status == 200:
            assert response.json() == {"status": "ready"}
            return
        assert_error(response, 503, "unavailable")
        assert time.monotonic() < deadline, "the server kept refusing new connections"
        time.sleep(0.02)  # poll interval; the deadline bounds the wait


def start_daemon(tmp: Path, *extra: str) -> Daemon:
    doc = tmp / "mini.json"
    doc.write_text(mini_document(tmp, model="mini"))
    return Daemon.start(tmp, [doc], *extra)


@pytest.fixture(scope="module")
def small_daemon(tmp_path_factory):
    """A server whose decoded request bodies are bounded by BODY_LIMIT bytes."""
    server = start_daemon(tmp_path_factory.mktemp("small"), "--request_body_bytes", str(BODY_LIMIT))
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.output)
    # a client's truncated body or refused upload is the client's error, not an unhandled server one
    assert "Unhandled exception" not in "".join(server.output), "".join(server.output)


@pytest.fixture(scope="module")
def narrow_daemon(tmp_path_factory):
    """A server that serves at most two open connections."""
    server = start_daemon(tmp_path_factory.mktemp("narrow"), "--connections", "2")
    try:
        yield server
    finally:
        assert server.stop() == 0, "".join(server.output)


@pytest.fixture(autouse=True)
def extra_daemons_still_healthy(request):
    yield
    if "small_daemon" in request.fixturenames:
        request.getfixturevalue("small_daemon").assert_healthy()
    if "narrow_daemon" in request.fixturenames:
        healthz_eventually(request.getfixturevalue("narrow_daemon"))


# ---------------------------------------------------------------- split requests

@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_request_split_at_every_byte_gets_the_same_answer(daemon, framing, unix):
    raw = (cl_request if framing == "content-length" else chunked_request)("/v1/models/undrain", UNDRAIN)
    whole = daemon.raw(raw, unix=unix)
    assert whole.status == 200, whole.body
    assert whole.json() == {"model": "mini", "admission": "open"}
    for k in range(1, len(raw)):
        with daemon.connect(unix=unix, timeout=30) as s:
            if not unix:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(raw[:k])
            s.sendall(raw[k:])
            response = read_response(s)
        assert (response.status, response.body) == (whole.status, whole.body), (k, raw[:k], response.body)


# ---------------------------------------------------------------- framing refusals

def test_content_length_and_transfer_encoding_together_reject(daemon):
    for extra in (("Transfer-Encoding: chunked",), ("Transfer-Encoding: identity",)):
        raw = cl_request("/v1/models/undrain", UNDRAIN, *extra)
        assert_error(daemon.raw(raw), 400)
    # the same, with a chunked body behind the headers
    raw = chunked_request("/v1/models/undrain", UNDRAIN, f"Content-Length: {len(UNDRAIN)}")
    assert_error(daemon.raw(raw), 400)


def test_conflicting_content_lengths_reject(daemon):
    raw = cl_request("/v1/models/undrain", UNDRAIN, f"Content-Length: {len(UNDRAIN) + 1}")
    assert_error(daemon.raw(raw), 400)


@pytest.mark.parametrize("coding", ["gzip", "gzip, chunked", "identity", "deflate", "chunked, gzip"])
def test_unsupported_transfer_codings_reject_with_400(daemon, coding):
    head = ("POST /v1/models/undrain HTTP/1.1\r\nHost: loom\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nTransfer-Encoding: {coding}\r\n\r\n").encode()
    assert_error(daemon.raw(head + chunked(UNDRAIN)), 400)


def test_two_transfer_encoding_headers_that_add_a_coding_reject(daemon):
    raw = chunked_request("/v1/models/undrain", UNDRAIN, "Transfer-Encoding: gzip")
    assert_error(daemon.raw(raw), 400)


@pytest.mark.parametrize("chunks", [
    b"zz\r\n" + UNDRAIN + b"\r\n0\r\n\r\n",                 # not hex
    b"-10\r\n" + UNDRAIN + b"\r\n0\r\n\r\n",                # signed
    b"10\r\n" + UNDRAIN + b"XX0\r\n\r\n",                    # no CRLF after the chunk data
    b"fffffffffffffffffffff\r\n" + UNDRAIN + b"\r\n0\r\n\r\n",  # overflowing size
], ids=["not-hex", "signed", "no-crlf", "overflow"])
def test_malformed_chunks_reject(daemon, chunks):
    head = chunked_request("/v1/models/undrain", b"").split(b"\r\n\r\n")[0] + b"\r\n\r\n"
    assert_error(daemon.raw(head + chunks), 400)


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_truncated_chunked_body_rejects(daemon, small_daemon, unix):
    raw = chunked_request("/v1/models/undrain", UNDRAIN)
    for server in (daemon, small_daemon):  # small_daemon's log is checked for unhandled errors at its stop
        for cut in (raw.index(b"\r\n\r\n") + 4, raw.index(b"\r\n\r\n") + 9, len(raw) - 5):
            assert_error(server.raw(raw[:cut], shutdown_write=True, unix=unix), 400)


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_truncated_content_length_body_rejects(daemon, small_daemon, unix):
    raw = cl_request("/v1/models/undrain", UNDRAIN)
    for server in (daemon, small_daemon):
        for cut in (len(raw) - len(UNDRAIN), len(raw) - 1):
            assert_error(server.raw(raw[:cut], shutdown_write=True, unix=unix), 400)


@pytest.mark.parametrize("line", [b"GARBAGE", b"GET", b"\x00\x01\x02 / HTTP/1.1", b"GET /healthz HTTP/1.1 x",
                                  b"GET /healthz HTTX/1.1"])
def test_garbage_request_line_is_a_json_400(daemon, line):
    assert_error(daemon.raw(line + b"\r\nHost: loom\r\n\r\n"), 400)


def test_malformed_header_line_is_a_json_400(daemon):
    assert_error(daemon.raw(b"GET /healthz HTTP/1.1\r\nHost loom\r\n\r\n"), 400)


@pytest.mark.parametrize("raw", [
    b"GET /metrics HTTP/1.1\r\nHost: loom\r\nContent-Length: 0\r\nContent-Length: 1\r\n\r\n",
    cl_request("/v1/models/undrain", UNDRAIN, "Transfer-Encoding: chunked"),
    b"GARBAGE\r\nHost: loom\r\n\r\n",
    chunked_request("/v1/models/undrain", b"").split(b"\r\n\r\n")[0] + b"\r\n\r\n1 \r\nx\r\n0\r\n\r\n",
    chunked_request("/v1/models/undrain", UNDRAIN).rsplit(b"0\r\n\r\n", 1)[0] + b"1 \r\na\r\n",
], ids=["two-lengths", "both-framings", "request-line", "chunk-size-space", "bad-chunk-after-a-body"])
@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_refused_request_is_answered_after_a_half_close(daemon, raw, unix):
    """A client that sends its request and closes its side still reads the answer: the
    parser's refusal is a JSON 400, not a silent close (found by bench/fuzz.py)."""
    assert_error(daemon.raw(raw, shutdown_write=True, unix=unix), 400)


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_broken_chunk_framing_under_a_handler_reading_the_body_is_a_400_after_a_half_close(daemon, unix):
    """The handler is already reading the body when its chunk framing breaks and the client
    half-closes: that body fails, so the request gets its 400 (it used to wait with no deadline;
    bench/fuzz.py found it under load, where the body often arrives in two reads)."""
    start = chunked_request("/v1/models/undrain", UNDRAIN).rsplit(b"0\r\n\r\n", 1)[0]
    with daemon.connect(unix=unix, timeout=30) as s:
        s.sendall(start)
        time.sleep(0.5)  # room for the handler to start reading; were it not yet, this is the one-read case
        s.sendall(b"1 \r\na\r\n")
        s.shutdown(socket.SHUT_WR)
        response = read_response(s)
    assert_error(response, 400)


# ---------------------------------------------------------------- rejections below the application

def below_app_counts(server: Daemon) -> dict[str, float]:
    """{status: count} of `loom_http_requests_total{route="below_app"}` from `/metrics`."""
    response = server.request("GET", "/metrics", check_health=False)
    assert response.status == 200, response.body
    counts = {}
    for family in text_string_to_metric_families(response.body.decode()):
        for sample in family.samples:
            if sample.name == "loom_http_requests_total" and sample.labels["route"] == "below_app":
                counts[sample.labels["status"]] = sample.value
    return counts


def route_count(server: Daemon, route: str, status: str) -> float:
    text = server.request("GET", "/metrics").body.decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "loom_http_requests_total" and s.labels == {"route": route, "status": status})


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\nHost: loom\r\n\r\n",                                        # request line
    b"GET /healthz HTTP/1.1\r\nHost loom\r\n\r\n",                           # header line
    chunked_request("/v1/models/undrain", b"").split(b"\r\n\r\n")[0] + b"\r\n\r\nzz\r\n",  # chunk framing
    cl_request("/v1/models/undrain", UNDRAIN, "Transfer-Encoding: chunked"),    # both framings
], ids=["request-line", "header-line", "chunk-framing", "both-framings"])
def test_a_parser_rejection_is_an_http_1_1_json_400_and_is_counted(daemon, raw):
    before = below_app_counts(daemon).get("400", 0)
    with daemon.connect(timeout=CLOSE_S) as s:
        s.sendall(raw)
        data = read_until_close(s)
    assert data.startswith(b"HTTP/1.1 400 "), data
    assert_error(parse_one(data), 400)
    daemon.assert_healthy()
    assert below_app_counts(daemon).get("400", 0) == before + 1


def test_an_expect_refusal_is_counted_for_its_route(daemon):
    before = route_count(daemon, "/healthz", "417")
    raw = b"GET /healthz HTTP/1.1\r\nHost: loom\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    assert_error(daemon.raw(raw), 417, "expectation_failed")
    assert route_count(daemon, "/healthz", "417") == before + 1


# ---------------------------------------------------------------- Expect

@pytest.mark.parametrize("case", [
    ("POST", "/v1/models/undrain", True, False),    # known route, body announced and held back
    ("POST", "/v1/models/undrain", True, True),     # known route, body sent anyway
    ("POST", "/no/such/route", True, False),        # unknown route
    ("GET", "/healthz", False, False),               # known route, no body
    ("GET", "/no/such/route", False, False),         # unknown route, no body
    ("DELETE", "/v1/status", False, False),          # wrong method
    ("CONNECT", "example.com:443", False, False),    # authority form: no route can match it
    ("OPTIONS", "*", False, False),                  # asterisk form
], ids=["known-held", "known-sent", "unknown-held", "known-nobody", "unknown-nobody", "wrong-method", "connect",
        "asterisk"])
@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_expect_is_refused_with_417_and_no_100_continue(daemon, case, unix):
    method, path, body, send_body = case
    head = [f"{method} {path} HTTP/1.1", "Host: loom", "Expect: 100-continue"]
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(UNDRAIN)}"]
    else:
        head += ["Connection: close"]
    raw = ("\r\n".join(head) + "\r\n\r\n").encode() + (UNDRAIN if send_body else b"")
    with daemon.connect(unix=unix, timeout=CLOSE_S) as s:
        s.sendall(raw)
        data = read_until_close(s)  # the server answers and closes without waiting for the body
    assert b"100 Continue" not in data and b" 100 " not in data.split(b"\r\n")[0], data
    assert_error(parse_one(data), 417, "expectation_failed")
    daemon.assert_healthy(unix=unix)


def test_expect_with_chunked_body_is_refused(daemon):
    raw = chunked_request("/v1/models/undrain", UNDRAIN, "Expect: 100-continue")
    head = raw[:raw.index(b"\r\n\r\n") + 4]
    with daemon.connect(timeout=CLOSE_S) as s:
        s.sendall(head)
        data = read_until_close(s)
    assert b"100 Continue" not in data
    assert_error(parse_one(data), 417)
    daemon.assert_healthy()


# ---------------------------------------------------------------- body bound

def test_body_at_the_limit_is_served_and_one_byte_more_is_413(small_daemon):
    exact = UNDRAIN + b" " * (BODY_LIMIT - len(UNDRAIN))
    assert small_daemon.raw(cl_request("/v1/models/undrain", exact)).status == 200
    assert small_daemon.raw(chunked_request("/v1/models/undrain", exact)).status == 200
    assert_error(small_daemon.raw(cl_request("/v1/models/undrain", exact + b" ")), 413, "request_too_large")
    assert_error(small_daemon.raw(chunked_request("/v1/models/undrain", exact + b" ")), 413, "request_too_large")


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_declared_length_over_the_limit_is_413_before_the_body(small_daemon, unix):
    head = (f"POST /v1/models/undrain HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
            f"Content-Length: {BODY_LIMIT * 50}\r\n\r\n").encode()
    with small_daemon.connect(unix=unix, timeout=CLOSE_S) as s:
        s.sendall(head)  # no body: the answer must not wait for it, and the connection closes
        data = read_until_close(s)
    assert_error(parse_one(data), 413, "request_too_large")
    small_daemon.assert_healthy(unix=unix)


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_chunked_body_growing_past_the_limit_is_413(small_daemon, unix):
    head = (b"POST /v1/models/undrain HTTP/1.1\r\nHost: loom\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    with small_daemon.connect(unix=unix, timeout=CLOSE_S) as s:
        s.sendall(head)
        try:
            for _ in range(3):  # 1536 bytes, never terminated: the server stops at the bound and closes
                s.sendall(b"200\r\n" + b" " * 512 + b"\r\n")
        except BrokenPipeError:
            pass  # it answered and closed before the last chunk went out: its 413 is already here to read
        data = read_until_close(s)
    assert_error(parse_one(data), 413, "request_too_large")
    small_daemon.assert_healthy(unix=unix)


def test_multipart_upload_has_no_exception_from_the_limit(small_daemon, tmp_path):
    parts = [request_part(registration_document("oversized", tmp_path, "model/")),
             file_part("model/pad.loom", b"//" + b"x" * BODY_LIMIT)]
    before = registered(small_daemon)
    response = small_daemon.raw(cl_request("/v1/models/register", multipart(parts), content_type=MULTIPART))
    assert_error(response, 413, "request_too_large")
    assert registered(small_daemon) == before


# ---------------------------------------------------------------- connection bound

def open_log_stream(server: Daemon, unix: bool) -> socket.socket:
    """A `GET /logz/stream` whose head was read: its handler keeps running until the socket closes."""
    s = server.connect(unix=unix, timeout=30)
    s.sendall(b"GET /logz/stream HTTP/1.1\r\nHost: loom\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(65536)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 200 "), head
    return s


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_connections_over_the_bound_get_503_and_close(narrow_daemon, unix):
    """Every open connection has a handler running (two log streams): no room can be made."""
    healthz_eventually(narrow_daemon)  # earlier tests' sockets are gone
    before = below_app_counts(narrow_daemon).get("503", 0)
    held = []
    try:
        for _ in range(2):
            held.append(open_log_stream(narrow_daemon, unix))
        with narrow_daemon.connect(unix=unix, timeout=CLOSE_S) as third:
            data = read_until_close(third)  # answered without a request, then closed
        assert_error(parse_one(data), 503, "unavailable")
    finally:
        for s in held:
            s.close()
    healthz_eventually(narrow_daemon)  # once the server sees them closed, a new connection is served
    # counted (so may be refusals of healthz_eventually's probes while the streams were closing)
    assert below_app_counts(narrow_daemon).get("503", 0) >= before + 1


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_new_connection_over_the_bound_closes_the_longest_idle_one(narrow_daemon, unix):
    """Two kept-alive connections, each served once and left idle: a third is served, and the
    one idle the longest is closed to make room (its client would reconnect)."""
    healthz_eventually(narrow_daemon)
    held = []
    try:
        for _ in range(2):
            s = narrow_daemon.connect(unix=unix, timeout=30)
            held.append(s)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: loom\r\n\r\n")
            assert read_response(s).status == 200
        assert narrow_daemon.request("GET", "/healthz", unix=unix, check_health=False).status == 200
        held[0].settimeout(CLOSE_S)
        assert read_until_close(held[0]) == b""          # the longest idle was closed
        held[1].sendall(b"GET /healthz HTTP/1.1\r\nHost: loom\r\n\r\n")
        assert read_response(held[1]).status == 200     # the other one is still served
    finally:
        for s in held:
            s.close()
    healthz_eventually(narrow_daemon)


# ---------------------------------------------------------------- multipart uploads

MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def part(headers: list[str] | list[bytes], data: bytes) -> bytes:
    lines = [h if isinstance(h, bytes) else h.encode() for h in headers]
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n" + data


def request_part(document: dict, filename: str | None = None) -> bytes:
    disposition = 'Content-Disposition: form-data; name="request"' + (f'; filename="{filename}"' if filename else "")
    return part([disposition, "Content-Type: application/json"], json.dumps(document).encode())


def file_part(filename: str, data: bytes) -> bytes:
    return part([f'Content-Disposition: form-data; name="file"; filename="{filename}"',
                 "Content-Type: application/octet-stream"], data)


def multipart(parts: list[bytes], *, close: bool = True, boundary: str = BOUNDARY) -> bytes:
    delimiter = b"--" + boundary.encode()
    body = b"".join(delimiter + b"\r\n" + p + b"\r\n" for p in parts)
    return body + (delimiter + b"--\r\n" if close else b"")


def registration_document(name: str, directory: Path, prefix: str = "", sources: list[str] | None = None) -> dict:
    checkpoint, _, _ = mini_weights(directory, name=f"{name}.safetensors")
    return {"model": name, "kind": "sequence", "control": prefix + "control.loom", "prepare": prefix + "prepare.loom",
            "sources": sources or [prefix + "model.loom"], "rows": 2, "context_length": 16,
            "checkpoint": str(checkpoint)}


def package_files(prefix: str = "model/") -> list[bytes]:
    return [file_part(prefix + name, (MINI / name).read_bytes()) for name in ("control.loom", "prepare.loom",
                                                                              "model.loom")]


def register(server: Daemon, parts: list[bytes], *, framing: str = "content-length", **kw) -> Response:
    build = cl_request if framing == "content-length" else chunked_request
    return server.raw(build("/v1/models/register", multipart(parts, **kw), content_type=MULTIPART))


def test_multipart_registration_becomes_ready(daemon, tmp_path):
    doc = registration_document("upload-first", tmp_path)
    response = register(daemon, [request_part(doc, "model/request.json"), *package_files()])
    assert response.status == 202, response.body
    assert response.json()["model"] == "upload-first"
    assert wait_phase(daemon, "upload-first")["phase"] == "ready"
    assert "upload-first" in {m["id"] for m in daemon.request("GET", "/v1/models").json()["data"]}


def test_multipart_parts_in_any_order_and_chunked(daemon, tmp_path):
    """The request part last, with the default request.json name (paths relative to the package
    root), the files shuffled, the body chunked, over the Unix socket."""
    doc = registration_document("upload-last", tmp_path, "model/")
    files = package_files()
    parts = [files[2], files[0], files[1], request_part(doc)]
    raw = chunked_request("/v1/models/register", multipart(parts), content_type=MULTIPART)
    response = daemon.raw(raw, unix=True)
    assert response.status == 202, response.body
    assert wait_phase(daemon, "upload-last")["phase"] == "ready"


def test_multipart_binary_bytecode_survives_the_upload(daemon, tmp_path):
    built = tmp_path / "model.loombc"
    subprocess.run([sys.executable, "-m", "loomc", "build", str(MINI / "model.loom"), "-o", str(built)],
                   cwd=REPO, check=True, capture_output=True)
    bytecode = built.read_bytes()
    assert any(b >= 0x80 for b in bytecode) or b"\x00" in bytecode  # really binary
    doc = registration_document("upload-bytecode", tmp_path, sources=["model.loombc"])
    files = package_files()[:2] + [file_part("model/model.loombc", bytecode)]
    response = register(daemon, [files[0], request_part(doc, "model/request.json"), *files[1:]])
    assert response.status == 202, response.body
    assert wait_phase(daemon, "upload-bytecode")["phase"] == "ready"


def test_multipart_with_a_corrupted_bytecode_fails_to_prepare(daemon, tmp_path):
    """The uploaded bytes are what the compiler sees: one flipped byte is not silently accepted."""
    built = tmp_path / "model.loombc"
    subprocess.run([sys.executable, "-m", "loomc", "build", str(MINI / "model.loom"), "-o", str(built)],
                   cwd=REPO, check=True, capture_output=True)
    bytecode = bytearray(built.read_bytes())
    bytecode[len(bytecode) // 2] ^= 0xFF
    doc = registration_document("upload-corrupt", tmp_path, sources=["model.loombc"])
    files = package_files()[:2] + [file_part("model/model.loombc", bytes(bytecode))]
    response = register(daemon, [request_part(doc, "model/request.json"), *files])
    assert response.status == 202, response.body
    failed = wait_phase(daemon, "upload-corrupt")
    assert failed["phase"] == "failed" and "checksum mismatch" in failed["error"]["message"], failed


def _malformed_bodies(tmp: Path) -> dict[str, tuple[str, bytes]]:
    """name -> (Content-Type, body): each a multipart registration that must be refused."""
    def doc(name: str) -> dict:
        return registration_document(name, tmp)

    files = package_files()
    ok = [request_part(doc("bad-ok"), "model/request.json"), *files]
    no_disposition = part(["Content-Type: application/octet-stream"], b"data")
    bodies = {
        "no-boundary": ("multipart/form-data", multipart(ok)),
        "empty-boundary": ('multipart/form-data; boundary=""', multipart(ok)),
        "wrong-boundary": ("multipart/form-data; boundary=other", multipart(ok)),
        "no-closing-boundary": (MULTIPART, multipart(ok, close=False)),
        "truncated-in-a-part": (MULTIPART, multipart(ok)[:-200]),
        "no-content-disposition": (MULTIPART, multipart([*ok, no_disposition])),
        "not-form-data": (MULTIPART, multipart([*ok, part(['Content-Disposition: attachment; name="file"; '
                                                          'filename="model/x.loom"'], b"x")])),
        "two-request-parts": (MULTIPART, multipart([*ok, request_part(doc("bad-two"))])),
        "no-request-part": (MULTIPART, multipart(files)),
        "duplicate-filename": (MULTIPART, multipart([*ok, file_part("model/control.loom", b"// again")])),
        "unknown-part-name": (MULTIPART, multipart([*ok, part(['Content-Disposition: form-data; name="extra"'],
                                                              b"x")])),
        "file-without-filename": (MULTIPART, multipart([*ok, part(['Content-Disposition: form-data; name="file"'],
                                                                  b"x")])),
        "non-utf8-headers": (MULTIPART, multipart([*ok, part([b'Content-Disposition: form-data; name="file"; '
                                                              b'filename="model/\xff\xfe.loom"'], b"x")])),
        "encoded-filename": (MULTIPART, multipart([*ok, part(["Content-Disposition: form-data; name=\"file\"; "
                                                              "filename*=UTF-8''model%2Fx.loom"], b"x")])),
        "data-after-closing": (MULTIPART, multipart(ok)[:-2] + b"--" + BOUNDARY.encode() + b"\r\nmore"),
        "escaping-filename": (MULTIPART, multipart([*ok, file_part("../outside.loom", b"x")])),
        "request-filename-is-a-file": (MULTIPART, multipart([request_part(doc("bad-clash"), "model/control.loom"),
                                                             *files])),
        "not-json-request": (MULTIPART, multipart([part(['Content-Disposition: form-data; name="request"'],
                                                        b"{not json"), *files])),
    }
    return bodies


MALFORMED = ["no-boundary", "empty-boundary", "wrong-boundary", "no-closing-boundary", "truncated-in-a-part",
             "no-content-disposition", "not-form-data", "two-request-parts", "no-request-part", "duplicate-filename",
             "unknown-part-name", "file-without-filename", "non-utf8-headers", "encoded-filename",
             "data-after-closing", "escaping-filename", "request-filename-is-a-file", "not-json-request"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_malformed_multipart_rejects_before_registration(daemon, tmp_path, framing):
    bodies = _malformed_bodies(tmp_path)
    assert sorted(bodies) == sorted(MALFORMED)
    before = registered(daemon)
    build = cl_request if framing == "content-length" else chunked_request
    for name in MALFORMED:
        content_type, body = bodies[name]
        try:
            response = daemon.raw(build("/v1/models/register", body, content_type=content_type))  # probes /healthz
            assert_error(response, 400)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert registered(daemon) == before


def test_the_malformed_bodies_differ_from_a_valid_one_only_by_their_defect(daemon, tmp_path):
    """The control for the test above: the same valid parts, correctly framed, register."""
    doc = registration_document("bad-ok", tmp_path)
    response = register(daemon, [request_part(doc, "model/request.json"), *package_files()])
    assert response.status == 202, response.body
    assert wait_phase(daemon, "bad-ok")["phase"] == "ready"
