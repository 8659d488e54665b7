"""Conformance tests talk HTTP to a real `loomd` process over TCP and a Unix socket.

`daemon` is one server per test module, serving the `mini` package (tests/unit/loomrt/fixtures/mini)
under the names `mini` and `spare`; tests that remove or reconfigure deployments register their
own names so they do not disturb each other. The server must still answer `/healthz` after
every rejected request (`Daemon.request`/`raw` probe it after each status >= 400) and after
every test, and must exit 0 on SIGTERM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "loomrt"))

from loomd_process import Daemon  # noqa: E402
from conformance_support import wait_ready, write_document  # noqa: E402


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loomd")
    docs = [write_document(tmp, "mini"), write_document(tmp, "spare", variant_capacity=None)]
    server = Daemon.start(tmp, docs)
    try:
        deadline_ok = wait_ready(server, ["mini", "spare"])
        assert deadline_ok, "deployments did not become ready: " + server.request("GET", "/v1/status").body.decode()
        yield server
    finally:
        code = server.stop()
        assert code == 0, "".join(server.output)


@pytest.fixture(autouse=True)
def still_healthy(request):
    """After every conformance test the server still answers /healthz."""
    yield
    if "daemon" in request.fixturenames:
        request.getfixturevalue("daemon").assert_healthy()
