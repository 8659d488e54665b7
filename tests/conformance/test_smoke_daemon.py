"""The daemon starts, serves both listeners and lists its deployments; the command line's
memory budgets reach the device ledger; SIGINT stops it like SIGTERM."""

from __future__ import annotations

import signal

from prometheus_client.parser import text_string_to_metric_families

from conformance_support import wait_ready, write_document
from loomd_process import Daemon

BUDGET = 987_654_321


def test_both_listeners_serve_the_same_catalog(daemon):
    tcp = daemon.request("GET", "/v1/models").json()
    unix = daemon.request("GET", "/v1/models", unix=True).json()
    assert tcp == unix
    assert sorted(m["id"] for m in tcp["data"]) == ["mini", "spare"]


def test_device_memory_option_sets_the_budget_and_sigint_exits_0(tmp_path):
    server = Daemon.start(tmp_path, [write_document(tmp_path, "solo")], "--device-memory", f"cpu={BUDGET}")
    try:
        assert wait_ready(server, ["solo"]), server.request("GET", "/v1/status").body.decode()
        trimmed = server.request("POST", "/v1/devices/trim", {"device": "cpu", "target_bytes": BUDGET}).json()
        assert [d["budget_bytes"] for d in trimmed["data"] if d["device"] == "cpu"] == [BUDGET]
        families = {f.name: f for f in text_string_to_metric_families(server.request("GET", "/metrics").body.decode())}
        budgets = {s.labels["device"]: s.value for s in families["loom_device_budget_bytes"].samples}
        assert budgets == {"cpu": BUDGET}
        server.process.send_signal(signal.SIGINT)
        code = server.process.wait(timeout=60)   # a hang guard
    finally:
        if server.process.poll() is None:
            server.stop()
    assert code == 0, "".join(server.output)
    assert "loomd: stopped\n" in server.output, "".join(server.output)   # the orderly path, not a crash
