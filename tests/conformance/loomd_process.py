"""A real `loomd serve` process for conformance tests: TCP on an ephemeral port plus a Unix socket.

`Daemon.start(tmp, documents)` launches `python -m loomd serve ...`, waits (with a deadline)
for the lines that announce its listeners, and `stop()` sends SIGTERM and checks it exits 0.
`request(...)` speaks HTTP/1.1 over a fresh socket (TCP or Unix) and returns status, headers
and body, so tests can also send framing no client library would produce (`raw`).

After every response with status >= 400, `request` and `raw` probe `GET /healthz` on the same
daemon and listener and assert it answers 200 `{"status":"ready"}`: the server keeps serving
after each rejected request, not just at the end of a test. Tests that read responses from
their own sockets call `assert_healthy()` themselves; `check_health=False` skips the probe
where a refusal is expected to outlast the request (the connection bound's 503)."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 120.0
HEALTH_TIMEOUT_S = 30.0    # bound on the /healthz probe after a rejected request


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Daemon:
    process: subprocess.Popen
    port: int
    unix_path: str
    output: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, tmp: Path, documents: list[Path], *extra: str) -> "Daemon":
        unix_path = str(tmp / "loomd.sock")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "loomd", "serve", *map(str, documents), "--listen", "127.0.0.1:0",
               "--listen", f"unix:{unix_path}", *extra]
        process = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        lines: list[str] = []
        port = None
        deadline = time.monotonic() + START_DEADLINE_S
        sel = selectors.DefaultSelector()
        sel.register(process.stdout, selectors.EVENT_READ)
        # Raw reads of the pipe, split here: a buffered readline() could leave lines that already
        # arrived in Python's buffer, where select() does not see them (a slow reader then times out).
        pending = b""
        while port is None or not any(l.startswith("loomd: listening on unix:") for l in lines):
            left = deadline - time.monotonic()
            if left <= 0 or process.poll() is not None:
                process.kill()
                raise RuntimeError("loomd did not start:\n" + "".join(lines) + pending.decode(errors="replace")
                                   + (process.stdout.read() or ""))
            if sel.select(timeout=left):
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    try:
                        process.wait(timeout=max(left, 0.01))
                    except subprocess.TimeoutExpired:
                        pass
                    continue
                *complete, pending = (pending + chunk).split(b"\n")
                for raw_line in complete:
                    line = raw_line.decode(errors="replace") + "\n"
                    lines.append(line)
                    m = re.match(r"loomd: listening on http://127\.0\.0\.1:(\d+)", line)
                    if m:
                        port = int(m.group(1))
        if pending:
            lines.append(pending.decode(errors="replace"))
        sel.close()
        daemon = cls(process, port, unix_path, lines)
        # Keep reading its output while it runs: a full pipe would block the daemon's writes.
        daemon._drainer = threading.Thread(target=daemon._drain, name="loomd-output", daemon=True)
        daemon._drainer.start()
        return daemon

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.process.stdout.fileno(), 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output.append(chunk.decode("utf-8", "replace"))

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None, *, unix: bool = False, timeout: float = 60,
                check_health: bool = True) -> Response:
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        head = {"Host": "loom", "Connection": "close", **(headers or {})}
        if body is not None and "Content-Length" not in head and "Transfer-Encoding" not in head:
            head["Content-Length"] = str(len(body))
        if body is not None and "Content-Type" not in head:
            head["Content-Type"] = "application/json"
        lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")
        return self.raw(raw, unix=unix, timeout=timeout, check_health=check_health)

    def connect(self, *, unix: bool = False, timeout: float = 60) -> socket.socket:
        if unix:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.unix_path)
        else:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return s

    def raw(self, data: bytes | list[bytes], *, unix: bool = False, timeout: float = 60,
            shutdown_write: bool = False, check_health: bool = True) -> Response:
        """Send bytes (a list is sent piece by piece), read until the server closes or the
        response is complete, and parse one HTTP/1.1 response. A rejection (status >= 400)
        is followed by a /healthz probe on the same listener unless `check_health` is False."""
        with self.connect(unix=unix, timeout=timeout) as s:
            for piece in (data if isinstance(data, list) else [data]):
                s.sendall(piece)
            if shutdown_write:
                s.shutdown(socket.SHUT_WR)
            response = read_response(s)
        if check_health and response.status >= 400:
            self.assert_healthy(unix=unix, after=response)
        return response

    def assert_healthy(self, *, unix: bool = False, after: Response | None = None) -> None:
        """`GET /healthz` on a fresh connection to this daemon answers 200 {"status":"ready"}."""
        probe = self.request("GET", "/healthz", unix=unix, timeout=HEALTH_TIMEOUT_S, check_health=False)
        rejected = f" after a {after.status} ({after.body[:200]!r})" if after is not None else ""
        assert probe.status == 200, f"/healthz answered {probe.status}{rejected}: {probe.body!r}"
        assert probe.json() == {"status": "ready"}, f"/healthz{rejected}: {probe.body!r}"

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        drainer = getattr(self, "_drainer", None)
        if drainer is not None:
            drainer.join(timeout=10)
        return self.process.returncode


def read_response(s: socket.socket) -> Response:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response head: {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return Response(status, headers, rest[:n])
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += s.recv(65536)
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                rest += s.recv(65536)
            body, rest = body + rest[:size], rest[size + 2:]
            if size == 0:
                return Response(status, headers, body)
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return Response(status, headers, rest)
        rest += chunk
