"""HTTP helpers shared by the administration, variant, upload and curl conformance tests:
the spec's error shape, registration over HTTP, and polling `/v1/status` with a deadline."""

from __future__ import annotations

import json
import time
from pathlib import Path

from loomd_process import Daemon, Response
from mini_package import MINI, mini_document

DEADLINE_S = 60.0
ORIGINAL = (MINI / "model.loom").read_text()
USES = ('use "control.loom" { dim }', 'use "prepare.loom" { w, b }')


def absolute_uses(text: str) -> str:
    text = text.replace(USES[0], f'use "{MINI / "control.loom"}" {{ dim }}')
    return text.replace(USES[1], f'use "{MINI / "prepare.loom"}" {{ w, b }}')


def assert_error(response: Response, status: int, *needles: str) -> dict:
    """The response is `status` with the one error shape; its message contains every needle."""
    assert response.status == status, (response.status, response.body)
    assert response.headers.get("content-type", "").startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "code"} <= set(error), error
    assert all(isinstance(error[k], str) and error[k] for k in ("message", "type", "code")), error
    if status < 500:                                   # client errors are the client's type
        assert error["type"] == "invalid_request_error", error
    for needle in needles:
        assert needle in error["message"], (needle, error)
    return error


def post(daemon: Daemon, path: str, body) -> Response:
    return daemon.request("POST", path, body)


def registrations(daemon: Daemon) -> dict[str, dict]:
    response = daemon.request("GET", "/v1/status")
    assert response.status == 200, response.body
    return {r["model"]: r for r in response.json()["registrations"]}


def listed(daemon: Daemon) -> dict[str, dict]:
    response = daemon.request("GET", "/v1/models")
    assert response.status == 200, response.body
    body = response.json()
    assert body["object"] == "list"
    return {m["id"]: m for m in body["data"]}


def poll(daemon: Daemon, predicate, what: str, timeout: float = DEADLINE_S) -> dict[str, dict]:
    """Poll /v1/status until `predicate(registrations)` holds; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        regs = registrations(daemon)
        if predicate(regs):
            return regs
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {json.dumps(regs, indent=1)}")
        time.sleep(0.05)  # poll interval; the deadline bounds the wait


def wait_phase(daemon: Daemon, name: str, *phases: str) -> dict:
    regs = poll(daemon, lambda r: name in r and r[name]["phase"] in phases, f"{name} in {phases}")
    return regs[name]


def wait_gone(daemon: Daemon, name: str) -> None:
    poll(daemon, lambda r: name not in r, f"{name} to be removed")


def register(daemon: Daemon, directory: Path, name: str, **fields) -> Response:
    directory.mkdir(parents=True, exist_ok=True)
    return post(daemon, "/v1/models/register", mini_document(directory, model=name, **fields))


def register_ready(daemon: Daemon, directory: Path, name: str, **fields) -> dict:
    response = register(daemon, directory, name, **fields)
    assert response.status == 202, response.body
    reg = wait_phase(daemon, name, "ready", "failed")
    assert reg["phase"] == "ready", reg
    return reg


def component(daemon: Daemon, name: str, which: str = "primary") -> dict:
    [found] = [c for c in registrations(daemon)[name]["components"] if c["component"] == which]
    return found


def component_of(regs: dict, name: str, which: str = "primary") -> dict:
    [found] = [c for c in regs[name]["components"] if c["component"] == which]
    return found
