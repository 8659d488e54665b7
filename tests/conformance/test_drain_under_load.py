"""Drain, then unregister, a scout registration with 16 requests in flight, in both modes.

The module's daemon (conftest: `mini` and `spare`) gets its own scout registration per mode
over HTTP (4 rows, a queue of 16), so no other test's daemon is touched. 16 chats, half
streamed, are accepted (4 running, 12 queued: `/v1/status` counts them) before
`POST /v1/models/drain` closes the gate (a new chat then gets 503) and
`POST /v1/models/unregister` removes the registration (docs/operations.md, "Lifecycle"):

* `mode: "drain"` lets every accepted request finish: all 16 complete (200; streams end
  with a finish_reason chunk and `[DONE]`);
* `mode: "abort"` fails what is left at the next step boundary with 410 `model_removed`:
  each request completes or gets that error (as a JSON 410, or, once a stream has begun, as
  an SSE error event followed by `[DONE]`), and the queued ones cannot have finished.

Nothing hangs (every read has a deadline), nothing answers >= 500, the registration leaves
`/v1/status` and `/v1/models`, and the device's memory accounting returns to what it was
before the registration.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from admin_http import assert_error, listed, post, registrations, wait_gone, wait_phase
from conformance_support import SseReader
from loomd_process import Daemon
from scout_daemon import IO_TIMEOUT_S, READY_DEADLINE_S, chat, open_stream, scout_document, wait_until

IN_FLIGHT = 16
ROWS = 4
REQUEST_DEADLINE_S = 300.0   # bound on each in-flight request (a cold kernel cache compiles first)
PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and the sea."}]


def devices(daemon: Daemon) -> list[dict[str, Any]]:
    response = daemon.request("GET", "/v1/status")
    assert response.status == 200, response.body
    return response.json()["devices"]


def scheduler(daemon: Daemon, name: str) -> dict[str, Any]:
    return registrations(daemon)[name]["scheduler"]


def run_chat(daemon: Daemon, name: str, stream: bool) -> dict[str, Any]:
    """One in-flight request's outcome: {"status", and "events" (streamed) or "body"}."""
    body = {"model": name, "messages": PROMPT, "max_tokens": 8, "temperature": 0}
    if not stream:
        response = chat(daemon, body, timeout=REQUEST_DEADLINE_S)
        return {"status": response.status, "body": response.json()}
    with open_stream(daemon, {**body, "stream": True}, timeout=REQUEST_DEADLINE_S) as s:
        reader = SseReader(s)
        status = reader.head()
        if status != 200:
            return {"status": status, "body": json.loads(reader.buf or b"{}")}
        return {"status": status, "events": reader.read_all()}


def outcome(result: dict[str, Any]) -> str:
    """'completed' or 'removed' (the spec's clean error); anything else fails the test."""
    if "events" in result:
        events = result["events"]
        assert events and events[-1] == "[DONE]", events[-3:]
        last = json.loads(events[-2])
        if "error" in last:
            assert last["error"]["code"] == "model_removed" and last["error"]["message"], last
            return "removed"
        assert last["object"] == "chat.completion.chunk" and last["choices"][0]["finish_reason"], last
        return "completed"
    if result["status"] == 200:
        assert result["body"]["choices"][0]["finish_reason"] in ("stop", "length"), result
        return "completed"
    assert result["status"] == 410, result
    error = result["body"]["error"]
    assert error["code"] == "model_removed" and error["type"] == "invalid_request_error", error
    return "removed"


@pytest.mark.parametrize("mode", ["drain", "abort"])
def test_drain_then_unregister_with_requests_in_flight(daemon, tmp_path, mode):
    name = f"busy-{mode}"
    before = devices(daemon)
    document = json.loads(scout_document(tmp_path, name, rows=ROWS, max_output_tokens=64,
                                         pending_capacity=IN_FLIGHT).read_text())
    response = post(daemon, "/v1/models/register", document)
    assert response.status == 202, response.body
    reg = wait_phase(daemon, name, "ready", "failed")
    assert reg["phase"] == "ready", reg
    warm = chat(daemon, {"model": name, "messages": PROMPT, "max_tokens": 1}, timeout=READY_DEADLINE_S)
    assert warm.status == 200, warm.body

    results: list[dict[str, Any] | None] = [None] * IN_FLIGHT
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            results[i] = run_chat(daemon, name, stream=i % 2 == 0)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    def accepted() -> bool:   # running, queued or already answered (one may finish meanwhile)
        s = scheduler(daemon, name)
        return s["active"] + s["pending"] + sum(r is not None for r in results) >= IN_FLIGHT

    wait_until(accepted, f"{IN_FLIGHT} requests accepted", timeout=IO_TIMEOUT_S)

    drained = post(daemon, "/v1/models/drain", {"model": name})
    assert drained.status == 200 and drained.json()["admission"] == "drained", drained.body
    assert_error(chat(daemon, {"model": name, "messages": PROMPT, "max_tokens": 1}), 503)
    removing = post(daemon, "/v1/models/unregister", {"model": name, "mode": mode})
    assert removing.status == 202 and removing.json() == {"model": name, "removing": mode}, removing.body

    for t in threads:
        t.join(REQUEST_DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "an accepted request hung after unregister"
    assert not errors, errors
    outcomes = [outcome(r) for r in results]
    if mode == "drain":
        assert outcomes == ["completed"] * IN_FLIGHT, outcomes
    else:
        assert "removed" in outcomes, outcomes   # the queued requests could not have finished first

    wait_gone(daemon, name)
    assert name not in listed(daemon)
    after = devices(daemon)
    assert [d["categories"] for d in after] == [d["categories"] for d in before], (after, before)
    assert all(not any(owner.startswith(f"{name}/") for owner in d["owners"]) for d in after), after
