"""Discovery and administration over HTTP (spec: http-profiles.md, "Discovery and administration").

Every test talks to the module's real `loomd` process (`daemon`, serving `mini` and `spare`).
Tests that drain, evict, fail or remove a deployment register their own names, so `mini` and
`spare` stay open and resident for the others (a test that drains `mini` reopens it).
State changes are observed by polling `/v1/status` with a deadline. The shutdown test starts
and stops its own `loomd`.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from safetensors.numpy import save_file

from admin_http import (DEADLINE_S, ORIGINAL, absolute_uses, assert_error, component, component_of, listed, poll,
                        post, register, register_ready, registrations, wait_gone, wait_phase)
from conformance_support import HeldCheckpoint, write_document
from loomd_process import Daemon
from mini_package import mini_document, mini_weights

MODEL_ROUTES = ("drain", "undrain", "unregister", "activate", "deactivate", "pin", "unpin")


# ---- health ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
@pytest.mark.parametrize("unix", [False, True])
def test_health_endpoints(daemon, path, unix):
    response = daemon.request("GET", path, unix=unix)
    assert response.status == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"status": "ready"}


def test_readyz_is_503_while_the_server_stops_with_work_in_flight(tmp_path):
    """SIGTERM closes admission but lets accepted work finish: while a registration's preparation
    is still running (held reading its checkpoint, see `HeldCheckpoint`), loomd keeps listening,
    `/readyz` answers 503 on both listeners while `/healthz` answers 200; once that work ends,
    loomd exits 0."""
    held = HeldCheckpoint(tmp_path / "held.gguf")
    server = Daemon.start(tmp_path, [write_document(tmp_path, "held", checkpoint=str(held.path))])
    try:
        held.wait_reader()                     # its build worker is inside preparation, blocked
        assert wait_phase(server, "held", "preparing", "ready", "failed")["phase"] == "preparing"
        assert server.request("GET", "/readyz").json() == {"status": "ready"}
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DEADLINE_S
        while (response := server.request("GET", "/readyz")).status == 200:   # until the signal is handled
            assert time.monotonic() < deadline, "/readyz still answers 200 after SIGTERM"
            time.sleep(0.05)  # poll interval; the deadline bounds the wait
        for unix in (False, True):
            error = assert_error(server.request("GET", "/readyz", unix=unix), 503, "shutting down")
            assert error["code"] == "unavailable" and error["type"] == "internal_error", error
            health = server.request("GET", "/healthz", unix=unix)
            assert health.status == 200 and health.json() == {"status": "ready"}
        assert server.request("GET", "/v1/status").json()["server"]["stopping"] is True
        assert server.process.poll() is None, "".join(server.output)   # the held work keeps it running
        held.release()                         # the preparation fails at once, so the work ends
        assert server.process.wait(timeout=DEADLINE_S) == 0, "".join(server.output)
    finally:
        held.release()
        code = server.stop()
        held.close()
    assert code == 0, "".join(server.output)
    assert "loomd: stopped" in "".join(server.output)


# ---- discovery ------------------------------------------------------------------------------------


def test_models_lists_prepared_deployments_with_capabilities(daemon):
    models = listed(daemon)
    regs = registrations(daemon)
    for name in ("mini", "spare"):
        m = models[name]
        assert set(m) == {"id", "object", "created", "owned_by", "input_modalities", "output_modalities", "loom"}
        assert m["object"] == "model" and m["owned_by"] == "local"
        assert isinstance(m["created"], int) and not isinstance(m["created"], bool)
        assert m["created"] == regs[name]["created"]            # the registration timestamp
        assert abs(m["created"] - time.time()) < 3600
        assert m["input_modalities"] == ["text"] and m["output_modalities"] == ["bytes"]
        loom = m["loom"]
        assert loom["kind"] == "sequence"
        assert "endpoint" not in loom      # mini declares no `consume` stage: a native-only sequence model
        assert loom["tokenize"] is False                         # the mini document has no tokenizer
        assert loom["input_tokens"] is False                     # not a chat deployment
        assert "context_length" not in loom                      # text only
    # variants {selected, count} only where variant_capacity > 0
    variants = models["mini"]["loom"]["variants"]
    assert set(variants) == {"selected", "count"}
    assert isinstance(variants["selected"], int) and variants["count"] >= 1
    inventory = daemon.request("GET", "/v1/models/variants", headers={"X-Loom-Model": "mini"}).json()
    assert variants == {"selected": inventory["selected"], "count": inventory["count"]}
    assert regs["mini"]["variants"] == variants
    assert "variants" not in models["spare"]["loom"]
    assert "variants" not in regs["spare"]


def test_created_is_the_registration_time(daemon, tmp_path):
    before = int(time.time())
    register_ready(daemon, tmp_path, "stamped")
    after = int(time.time()) + 1
    created = listed(daemon)["stamped"]["created"]
    assert before <= created <= after
    assert registrations(daemon)["stamped"]["created"] == created
    assert listed(daemon)["mini"]["created"] <= created      # registered at startup, before this one
    # the timestamp is the registration's, not the listing's: list again once the clock (whole
    # seconds, as `created` counts them) has moved past it
    deadline = time.monotonic() + 10
    while int(time.time()) <= created:
        assert time.monotonic() < deadline, "the clock did not advance"
        time.sleep(0.02)  # poll interval; the deadline bounds the wait
    assert listed(daemon)["stamped"]["created"] == created
    assert post(daemon, "/v1/models/unregister", {"model": "stamped"}).status == 202
    wait_gone(daemon, "stamped")


def test_drained_and_evicted_models_stay_listed(daemon, tmp_path):
    register_ready(daemon, tmp_path, "evicted")
    assert post(daemon, "/v1/models/drain", {"model": "evicted"}).status == 200
    assert "evicted" in listed(daemon)
    assert listed(daemon)["evicted"]["loom"]["admission"] == "drained"
    response = post(daemon, "/v1/models/deactivate", {"model": "evicted"})
    assert response.status == 202, response.body
    poll(daemon, lambda r: not component_of(r, "evicted")["resident"], "evicted's params to be released")
    models = listed(daemon)
    assert "evicted" in models
    assert models["evicted"]["loom"]["resident"] is False
    assert post(daemon, "/v1/models/unregister", {"model": "evicted", "mode": "abort"}).status == 202
    wait_gone(daemon, "evicted")


def test_deferred_failed_and_removing_models_are_not_listed(daemon, tmp_path):
    # drained admission: compiled, preparation deferred -> not prepared, not listed
    assert register(daemon, tmp_path / "d", "deferred1", admission="drained").status == 202
    reg = wait_phase(daemon, "deferred1", "deferred", "failed")
    assert reg["phase"] == "deferred"
    assert "deferred1" not in listed(daemon)
    # checkpoint controls on an unprepared registration: 404, and the model is not prepared by them
    pin = daemon.request("POST", "/v1/checkpoints/x", None, {"X-Loom-Model": "deferred1", "X-Loom-Session": "s"})
    assert pin.status == 404, pin.body
    assert registrations(daemon)["deferred1"]["phase"] == "deferred"
    # failed: listed in status, not in discovery
    broken = tmp_path / "broken.loom"
    broken.write_text(absolute_uses(ORIGINAL).replace("matmul(x, w, y)", "matmul(x, w, y"))
    assert register(daemon, tmp_path / "f", "failed1", sources=[str(broken)]).status == 202
    assert wait_phase(daemon, "failed1", "ready", "failed")["phase"] == "failed"
    assert "failed1" not in listed(daemon)
    # once removal is accepted the model is no longer listed, whether it is removing or gone
    register_ready(daemon, tmp_path / "r", "removing1")
    assert "removing1" in listed(daemon)
    assert post(daemon, "/v1/models/unregister", {"model": "removing1"}).status == 202
    assert "removing1" not in listed(daemon)
    regs = registrations(daemon)
    assert "removing1" not in regs or regs["removing1"]["phase"] == "removing"
    for name in ("deferred1", "failed1"):
        assert post(daemon, "/v1/models/unregister", {"model": name, "mode": "abort"}).status == 202
    for name in ("deferred1", "failed1", "removing1"):
        wait_gone(daemon, name)


# ---- status and failed registrations -------------------------------------------------------------------


def test_status_shows_every_registration_and_server_resources(daemon):
    response = daemon.request("GET", "/v1/status")
    assert response.status == 200
    body = response.json()
    assert body["object"] == "status"
    regs = {r["model"]: r for r in body["registrations"]}
    for name in ("mini", "spare"):
        r = regs[name]
        assert r["phase"] == "ready" and r["admission"] == "open" and r["removing"] is None
        assert r["error"] is None and r["kind"] == "sequence"
        assert isinstance(r["scheduler"], dict)
        assert [c["component"] for c in r["components"]] == ["primary"]
    [cpu] = [d for d in body["devices"] if d["device"] == "cpu"]
    assert {"total_bytes", "budget_bytes", "used_bytes", "categories", "owners"} <= set(cpu)
    assert cpu["owners"]["mini/primary"]["params"] > 0
    assert body["server"]["request_body_bytes"] > 0


def test_missing_checkpoint_tensor_fails_the_registration_visibly(daemon, tmp_path):
    _, w, _ = mini_weights(tmp_path)
    partial = tmp_path / "partial.safetensors"
    save_file({"proj.weight": w}, str(partial))          # proj.bias is missing
    response = register(daemon, tmp_path, "notensor", checkpoint=str(partial))
    assert response.status == 202, response.body
    body = response.json()
    assert body["model"] == "notensor" and body["object"] == "registration"
    reg = wait_phase(daemon, "notensor", "ready", "failed")
    assert reg["phase"] == "failed"
    assert reg["error"]["code"] and "proj.bias" in reg["error"]["message"], reg["error"]
    assert "notensor" not in listed(daemon)
    # a failed registration is not healthy: residency operations conflict even when drained
    assert post(daemon, "/v1/models/drain", {"model": "notensor"}).status == 200
    for op in ("activate", "deactivate"):
        assert_error(post(daemon, f"/v1/models/{op}", {"model": "notensor"}), 409, "failed")
    assert post(daemon, "/v1/models/unregister", {"model": "notensor"}).status == 202
    wait_gone(daemon, "notensor")


def test_typo_in_a_loom_file_fails_with_its_position(daemon, tmp_path):
    text = absolute_uses(ORIGINAL).replace("running_sum(x, rows, acc, total)", "running_sum(x, rows, acc, total")
    broken = tmp_path / "typo.loom"
    broken.write_text(text)
    response = register(daemon, tmp_path, "typo", sources=[str(broken)])
    assert response.status == 202, response.body
    reg = wait_phase(daemon, "typo", "ready", "failed")
    assert reg["phase"] == "failed"
    assert reg["error"]["code"] == "compile_error"
    found = re.search(re.escape(str(broken)) + r":(\d+):(\d+)", reg["error"]["message"])
    assert found, reg["error"]["message"]
    typo_line = next(i for i, line in enumerate(text.splitlines(), 1) if "running_sum(x, rows, acc, total" in line)
    assert typo_line <= int(found.group(1)) <= typo_line + 1 and int(found.group(2)) >= 1
    # the name stays taken by the failed registration until it is removed
    assert_error(register(daemon, tmp_path, "typo"), 409, "typo")
    assert post(daemon, "/v1/models/unregister", {"model": "typo"}).status == 202
    wait_gone(daemon, "typo")


# ---- register ---------------------------------------------------------------------------------------


def test_register_validation(daemon, tmp_path):
    doc = json.loads(mini_document(tmp_path, model="valid1"))
    # a duplicate name
    assert_error(post(daemon, "/v1/models/register", dict(doc, model="mini")), 409, "mini")
    # a typo'd field is named (with a suggestion)
    typo = {("kidn" if k == "kind" else k): v for k, v in doc.items()}
    error = assert_error(post(daemon, "/v1/models/register", typo), 400, "kidn")
    assert error["param"] == "kidn"
    # a wrongly typed field is named
    error = assert_error(post(daemon, "/v1/models/register", dict(doc, rows="2")), 400, "rows")
    assert error["param"] == "rows"
    assert_error(post(daemon, "/v1/models/register", dict(doc, model=7)), 400, "model")
    assert_error(post(daemon, "/v1/models/register", "[]"), 400)
    assert_error(post(daemon, "/v1/models/register", "{"), 400)
    assert "valid1" not in registrations(daemon)


def test_unregister_then_register_again(daemon, tmp_path):
    for mode in ("drain", "abort"):
        register_ready(daemon, tmp_path / mode, "again")
        response = post(daemon, "/v1/models/unregister", {"model": "again", "mode": mode})
        assert response.status == 202, response.body
        assert response.json()["model"] == "again"
        wait_gone(daemon, "again")
        assert "again" not in listed(daemon)
        assert_error(post(daemon, "/v1/models/drain", {"model": "again"}), 404, "again")
    register_ready(daemon, tmp_path / "third", "again")        # the name is free again
    assert "again" in listed(daemon)
    assert post(daemon, "/v1/models/unregister", {"model": "again"}).status == 202
    wait_gone(daemon, "again")


def test_unregister_validation(daemon):
    assert_error(post(daemon, "/v1/models/unregister", {"model": "mini", "mode": "later"}), 400, "mode")
    assert_error(post(daemon, "/v1/models/unregister", {"model": "mini", "mode": 1}), 400, "mode")
    assert_error(post(daemon, "/v1/models/unregister", {"model": "mini", "component": "primary"}), 400,
                 "component")
    assert_error(post(daemon, "/v1/models/unregister", {"mode": "drain"}), 400, "model")
    assert registrations(daemon)["mini"]["phase"] == "ready" and "mini" in listed(daemon)


# ---- drain / undrain ------------------------------------------------------------------------------------


def test_drain_and_undrain_move_the_gate(daemon):
    try:
        response = post(daemon, "/v1/models/drain", {"model": "mini"})
        assert response.status == 200, response.body
        assert response.json() == {"model": "mini", "admission": "drained"}
        assert registrations(daemon)["mini"]["admission"] == "drained"
        assert "mini" in listed(daemon)
        response = post(daemon, "/v1/models/undrain", {"model": "mini"})
        assert response.status == 200, response.body
        assert response.json() == {"model": "mini", "admission": "open"}
        assert registrations(daemon)["mini"]["admission"] == "open"
    finally:
        post(daemon, "/v1/models/undrain", {"model": "mini"})


@pytest.mark.parametrize("route", ["drain", "undrain"])
def test_drain_validation(daemon, route):
    assert_error(post(daemon, f"/v1/models/{route}", {"model": "mini", "component": "primary"}), 400,
                 "component")
    assert_error(post(daemon, f"/v1/models/{route}", {}), 400, "model")
    assert_error(post(daemon, f"/v1/models/{route}", {"model": ["mini"]}), 400, "model")
    assert_error(post(daemon, f"/v1/models/{route}", '{"model":"mini","model":"mini"}'), 400, "model")
    assert registrations(daemon)["mini"]["admission"] == "open"


def test_undrain_prepares_a_deferred_registration(daemon, tmp_path):
    assert register(daemon, tmp_path, "later", admission="drained").status == 202
    assert wait_phase(daemon, "later", "deferred", "failed")["phase"] == "deferred"
    assert post(daemon, "/v1/models/undrain", {"model": "later"}).status == 200
    assert wait_phase(daemon, "later", "ready", "failed")["phase"] == "ready"
    assert listed(daemon)["later"]["loom"]["admission"] == "open"
    assert post(daemon, "/v1/models/unregister", {"model": "later"}).status == 202
    wait_gone(daemon, "later")


# ---- residency --------------------------------------------------------------------------------------


def test_activate_and_deactivate(daemon, tmp_path):
    register_ready(daemon, tmp_path, "resid")
    try:
        # an open model: drain first
        for op in ("activate", "deactivate"):
            assert_error(post(daemon, f"/v1/models/{op}", {"model": "resid"}), 409, "drain")
        assert post(daemon, "/v1/models/drain", {"model": "resid"}).status == 200
        for op in ("activate", "deactivate"):
            error = assert_error(post(daemon, f"/v1/models/{op}", {"model": "resid", "component": "image"}), 404,
                                 "image")
            assert error["param"] == "component"
            for bad in (7, None, "", "Primary", ["primary"]):
                error = assert_error(post(daemon, f"/v1/models/{op}", {"model": "resid", "component": bad}), 400,
                                     "component")
            assert_error(post(daemon, f"/v1/models/{op}", {"model": "resid", "mode": "drain"}), 400, "mode")

        activations = component(daemon, "resid")["activations"]
        response = post(daemon, "/v1/models/deactivate", {"model": "resid", "component": "primary"})
        assert response.status == 202, response.body
        assert response.json() == {"model": "resid", "component": "primary", "operation": "deactivate"}
        poll(daemon, lambda r: not component_of(r, "resid")["resident"], "resid to be evicted")
        [cpu] = [d for d in daemon.request("GET", "/v1/status").json()["devices"] if d["device"] == "cpu"]
        assert cpu["owners"].get("resid/primary", {}).get("params", 0) == 0
        assert "resid" in listed(daemon)

        response = post(daemon, "/v1/models/activate", {"model": "resid"})     # component defaults to primary
        assert response.status == 202, response.body
        assert response.json() == {"model": "resid", "component": "primary", "operation": "activate"}
        poll(daemon, lambda r: component_of(r, "resid")["resident"]
             and component_of(r, "resid")["activations"] > activations, "resid to be reloaded")
        assert registrations(daemon)["resid"]["phase"] == "ready"
        assert registrations(daemon)["resid"]["admission"] == "drained"   # activation does not open admission
    finally:
        post(daemon, "/v1/models/unregister", {"model": "resid", "mode": "abort"})
        wait_gone(daemon, "resid")


def test_activate_prepares_a_deferred_registration_without_opening_it(daemon, tmp_path):
    assert register(daemon, tmp_path, "deferred2", admission="drained").status == 202
    assert wait_phase(daemon, "deferred2", "deferred", "failed")["phase"] == "deferred"
    assert post(daemon, "/v1/models/activate", {"model": "deferred2"}).status == 202
    reg = wait_phase(daemon, "deferred2", "ready", "failed")
    assert reg["phase"] == "ready" and reg["admission"] == "drained"
    assert "deferred2" in listed(daemon)
    assert post(daemon, "/v1/models/unregister", {"model": "deferred2"}).status == 202
    wait_gone(daemon, "deferred2")


def test_pin_unpin_and_trim(daemon, tmp_path):
    register_ready(daemon, tmp_path, "pinned")
    try:
        for op in ("pin", "unpin"):
            assert_error(post(daemon, f"/v1/models/{op}", {"model": "pinned", "component": "image"}), 404, "image")
            assert_error(post(daemon, f"/v1/models/{op}", {"model": "pinned", "component": 7}), 400, "component")
            assert_error(post(daemon, f"/v1/models/{op}", {"model": "pinned", "extra": 1}), 400, "extra")
        response = post(daemon, "/v1/models/pin", {"model": "pinned", "component": "primary"})
        assert response.status == 200, response.body
        assert response.json() == {"model": "pinned", "component": "primary", "pinned": True}
        assert component(daemon, "pinned")["pinned"] is True

        # trim: everything idle and unpinned goes, the pinned component stays
        response = post(daemon, "/v1/devices/trim", {"device": "cpu", "target_bytes": 0})
        assert response.status == 200, response.body
        body = response.json()
        [cpu] = body["data"]
        assert cpu["device"] == "cpu"
        assert {"total_bytes", "budget_bytes", "used_bytes", "categories", "owners"} <= set(cpu)
        assert cpu["used_bytes"] == sum(cpu["categories"].values())
        assert cpu["owners"]["pinned/primary"]["params"] > 0
        assert cpu["owners"].get("spare/primary", {}).get("params", 0) == 0
        regs = registrations(daemon)
        assert component_of(regs, "pinned")["resident"] is True
        assert component_of(regs, "spare")["resident"] is False
        assert {"mini", "spare", "pinned"} <= set(listed(daemon))     # evicted models stay listed

        response = post(daemon, "/v1/models/unpin", {"model": "pinned"})
        assert response.status == 200, response.body
        assert response.json() == {"model": "pinned", "component": "primary", "pinned": False}
        assert component(daemon, "pinned")["pinned"] is False
        [cpu] = post(daemon, "/v1/devices/trim", {"device": "cpu", "target_bytes": 0}).json()["data"]
        assert cpu["owners"].get("pinned/primary", {}).get("params", 0) == 0
        assert component(daemon, "pinned")["resident"] is False
    finally:
        post(daemon, "/v1/models/unregister", {"model": "pinned", "mode": "abort"})
        wait_gone(daemon, "pinned")


def test_trim_validation(daemon):
    error = assert_error(post(daemon, "/v1/devices/trim", {"device": 9, "target_bytes": 0}), 404, "9")
    assert error["param"] == "device"
    for bad in (-1, 1.5, "0", True, None):
        error = assert_error(post(daemon, "/v1/devices/trim", {"device": "cpu", "target_bytes": bad}), 400,
                             "target_bytes")
        assert error["param"] == "target_bytes"
    for bad in (-1, "gpu", None, True):
        assert_error(post(daemon, "/v1/devices/trim", {"device": bad, "target_bytes": 0}), 400, "device")
    assert_error(post(daemon, "/v1/devices/trim", {"device": "cpu", "target_bytes": 0, "model": "mini"}), 400,
                 "model")
    assert_error(post(daemon, "/v1/devices/trim", {"device": "cpu"}), 400, "target_bytes")
    # the spec's example names ordinal 0: served where the server has that device, 404 where it does not
    ordinals = {d["device"] for d in daemon.request("GET", "/v1/status").json()["devices"]}
    response = post(daemon, "/v1/devices/trim", {"device": 0, "target_bytes": 2**62})
    if 0 in ordinals:
        assert response.status == 200 and response.json()["data"][0]["device"] == 0
    else:
        assert_error(response, 404, "device 0")
    assert_error(post(daemon, "/v1/devices/trim", {"target_bytes": 0}), 400, "device")


# ---- routing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("route", MODEL_ROUTES)
def test_unknown_model_is_404_on_every_model_route(daemon, route):
    error = assert_error(post(daemon, f"/v1/models/{route}", {"model": "nosuch"}), 404, "nosuch")
    assert error["code"] == "not_found" and error["param"] == "model"


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("POST", "/healthz", "GET"), ("POST", "/readyz", "GET"), ("DELETE", "/v1/models", "GET"),
    ("PUT", "/v1/status", "GET"), ("GET", "/v1/models/register", "POST"), ("GET", "/v1/models/drain", "POST"),
    ("GET", "/v1/models/unregister", "POST"), ("GET", "/v1/models/pin", "POST"),
    ("GET", "/v1/devices/trim", "POST"), ("DELETE", "/v1/models/variants", "GET, POST"),
])
def test_wrong_method_is_405(daemon, method, path, allowed):
    body = b"" if method in ("POST", "PUT") else None
    response = daemon.request(method, path, body)
    error = assert_error(response, 405, method)
    assert error["code"] == "method_not_allowed"
    assert response.headers["allow"] == allowed


@pytest.mark.parametrize("path", ["/v1/nothing", "/v1/models/mini", "/healthz/", "/v1/models/variants/list", "/"])
def test_unknown_path_is_404(daemon, path):
    for method in ("GET", "POST"):
        error = assert_error(daemon.request(method, path, b"" if method == "POST" else None), 404)
        assert error["code"] == "not_found"
