"""Helpers the conformance modules share (imported by name: `conftest` is ambiguous across
test directories, so nothing imports from it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "loomrt"))

from loomd_process import Daemon  # noqa: E402
from mini_package import mini_document  # noqa: E402


def write_document(directory: Path, name: str, **fields) -> Path:
    path = directory / f"{name}.json"
    path.write_text(mini_document(directory, model=name, **fields))
    return path


def wait_ready(server: Daemon, names: list[str], timeout: float = 120.0) -> bool:
    """Poll /v1/status with a deadline until every named registration is ready."""
    import time

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
