"""Helpers the conformance modules share (imported by name: `conftest` is ambiguous across
test directories, so nothing imports from it)."""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "loomrt"))

from loomd_process import REPO, Daemon  # noqa: E402
from mini_package import mini_document  # noqa: E402


def write_document(directory: Path, name: str, **fields) -> Path:
    path = directory / f"{name}.json"
    path.write_text(mini_document(directory, model=name, **fields))
    return path


@contextlib.contextmanager
def serving(daemon: Daemon, names: list[str], timeout: float = 300.0):
    """A started daemon once `names` are ready; stopped at the end, which must exit 0 (its
    output is the failure message otherwise)."""
    try:
        assert wait_ready(daemon, names, timeout=timeout), daemon.request("GET", "/v1/status").body.decode()
        yield daemon
    finally:
        code = daemon.stop()
        assert code == 0, "".join(daemon.output)


def wait_ready(server: Daemon, names: list[str], timeout: float = 300.0) -> bool:
    """Poll /v1/status with a deadline until every named registration is ready (a hang guard:
    the first daemon of a run compiles every kernel of its models before they are ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = server.request("GET", "/v1/status").json()
        phases = {r["model"]: r["phase"] for r in status["registrations"]}
        if all(phases.get(n) == "ready" for n in names):
            return True
        if any(phases.get(n) == "failed" for n in names):
            raise AssertionError(json.dumps(status, indent=1))
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    return False


# ---- work held in flight: a registration whose preparation waits on its checkpoint ---------------

HOLD_DEADLINE_S = 60.0
HOLD_POLL_S = 0.02


class HeldCheckpoint:
    """A checkpoint path that is a FIFO, so a registration naming it is real work held in flight:
    its build worker compiles the document, then blocks in preparation reading the checkpoint's
    first bytes (`open_checkpoint`) for as long as the test wants.

    `wait_reader()` polls (with a deadline) until the worker has opened the FIFO (a non-blocking
    open for writing succeeds only once a reader has it open) and keeps that writing end, so
    the worker's read blocks on it. `release()` writes a GGUF magic: the worker then maps the
    "file", which a FIFO cannot be, and the preparation fails at once (`checkpoint_error`).
    Keep the writing end until that failure was observed (the mapping reopens the FIFO, which
    must not block for want of a writer); `close()` drops it. Cheap: the mini model compiles in
    well under a second and nothing is loaded."""

    MAGIC = b"GGUF"

    def __init__(self, path: Path):
        os.mkfifo(path)
        self.path = path
        self.fd: int | None = None
        self.released = False

    def wait_reader(self, timeout: float = HOLD_DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:   # ENXIO: nobody has the FIFO open for reading yet
                    raise
                assert time.monotonic() < deadline, f"no worker opened {self.path} for reading"
                time.sleep(HOLD_POLL_S)  # poll interval; the deadline bounds the wait

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:   # never read: take the path away, so a late reader fails instead of blocking
                self.path.unlink(missing_ok=True)
                return
        os.write(self.fd, self.MAGIC)

    def close(self) -> None:
        self.release()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---- known-token sequences: the encoder sample and /v1/sequences SSE over a socket ---------------

ENCODER_DIM = 576  # encoder's chunk rows: f32 final hidden states (samples/encoder/README.md)
SEQUENCE_IO_TIMEOUT_S = 60.0  # per socket operation (as scout_daemon.IO_TIMEOUT_S)


def encoder_document(directory: Path, name: str = "encoder", *, rows: int = 2, context_length: int = 256,
                     step_tokens: int = 16, **fields: Any) -> Path:
    """A samples/encoder document (scout's GGUF) with `rows` rows, a pool of exactly `rows`
    full contexts and `step_tokens` per step (small, so short requests take several steps)."""
    from scout_daemon import GGUF, SCOUT   # scout_daemon imports this module

    encoder = REPO / "samples" / "encoder"
    doc = {"model": name, "kind": "sequence", "control": str(encoder / "control.loom"),
           "prepare": str(encoder / "prepare.loom"), "sources": [str(encoder / "encoder.loom")],
           "checkpoint": GGUF, "rows": rows, "context_length": context_length,
           "pool_capacity": rows * context_length, "config": {"step_tokens": step_tokens}, **fields}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def _request_bytes(body: Any, headers: dict[str, str] | None = None) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = ["POST /v1/sequences HTTP/1.1", "Host: loom", "Connection: close", "Content-Type: application/json",
            f"Content-Length: {len(data)}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


class SseReader:
    """Reads one SSE chat response (HTTP/1.1 chunked) from a socket, event by event."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.text = b""           # de-chunked body so far
        self.data: list[str] = []          # every event's data, in order
        self.chunked = False
        self.eof = False

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def head(self) -> int:
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        for line in lines:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        return self.status

    def _more_body(self) -> bool:
        """Move one more piece of body into `text`; False at the end of the body."""
        if not self.chunked:
            if not self.buf:
                try:
                    self._recv()
                except ConnectionError:
                    return False
            self.text, self.buf = self.text + self.buf, b""
            return True
        while b"\r\n" not in self.buf:
            self._recv()
        size_line, _, rest = self.buf.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        self.buf = rest
        while len(self.buf) < size + 2:
            self._recv()
        self.text += self.buf[:size]
        self.buf = self.buf[size + 2:]
        return size != 0

    def next_event(self) -> str | None:
        """The next event's data, or None at the end of the body."""
        if self.status is None:
            self.head()
        while b"\n\n" not in self.text:
            if not self._more_body():
                return None
        event, _, self.text = self.text.partition(b"\n\n")
        line = event.decode()
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        self.data.append(data)
        return data

    def read_all(self) -> list[str]:
        while self.next_event() is not None:
            pass
        return self.data



class SequenceStream(SseReader):
    """One /v1/sequences response read event by event (HTTP/1.1 chunked SSE, or a JSON error)."""

    def __init__(self, server: Daemon, body: Any, headers: dict[str, str] | None = None):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=SEQUENCE_IO_TIMEOUT_S)
        sock.sendall(_request_bytes(body, headers))
        super().__init__(sock)
        self.head()

    def body(self) -> bytes:
        while self._more_body():
            pass
        return self.text

    def event(self) -> tuple[str, dict[str, Any]] | None:
        while b"\n\n" not in self.text:
            if not self._more_body():
                assert not self.text.strip(), self.text
                return None
            continue
        raw, _, self.text = self.text.partition(b"\n\n")
        fields = dict(line.split(": ", 1) for line in raw.decode().split("\n"))
        assert set(fields) == {"event", "data"}, raw
        return fields["event"], json.loads(fields["data"])

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        while (e := self.event()) is not None:
            out.append(e)
        return out

    def close(self, reset: bool = False) -> None:
        if reset:  # an abortive close: the server's next write fails at once
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        self.sock.close()


def sequence(server: Daemon, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(200, events) for a stream read to its end, or (status, error JSON)."""
    s = SequenceStream(server, body, headers)
    try:
        if s.status != 200:
            error = json.loads(s.body())
            if s.status >= 400:
                server.assert_healthy()   # still serving after the rejection (same TCP listener)
            return s.status, error
        assert s.headers["content-type"].startswith("text/event-stream")
        return 200, s.events()
    finally:
        s.close()


def checked_sequence(events: list[tuple[str, dict[str, Any]]], ids: list[int], position: int = 0,
            session: str | None = None, dim: int = ENCODER_DIM) -> tuple[str, np.ndarray, list[int]]:
    """Check one complete stream's framing; (handle, f32 rows [len(ids), dim], chunk sizes)."""
    kinds = [k for k, _ in events]
    assert kinds[0] == "attached" and kinds[-1] == "done" and set(kinds[1:-1]) == {"chunk"}, kinds
    handle = events[0][1]["session"]
    assert events[0][1] == {"session": handle, "position": position}
    assert len(handle) == 32 and all(c in "0123456789abcdef" for c in handle)
    if session is not None:
        assert handle == session
    at, got, rows, sizes = position, [], [], []
    for _, chunk in events[1:-1]:
        assert set(chunk) == {"session", "position", "next_position", "token_ids", "encoding", "data"}
        assert chunk["session"] == handle and chunk["encoding"] == "base64"
        assert chunk["position"] == at and chunk["next_position"] == at + len(chunk["token_ids"]) > at
        data = base64.b64decode(chunk["data"], validate=True)
        assert len(data) == 4 * dim * len(chunk["token_ids"])
        rows.append(np.frombuffer(data, "<f4").reshape(len(chunk["token_ids"]), dim))
        got += chunk["token_ids"]
        sizes.append(len(chunk["token_ids"]))
        at = chunk["next_position"]
    assert got == ids
    assert events[-1][1] == {"session": handle, "position": position + len(ids)}
    hidden = np.concatenate(rows)
    assert np.isfinite(hidden).all()
    return handle, hidden, sizes
