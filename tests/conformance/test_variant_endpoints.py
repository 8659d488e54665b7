"""Native executable variants over HTTP (spec: http-profiles.md, "Native executable variants").

Each test registers its own `mini` deployment (variant_capacity 3) on the module's `loomd`
process and stages real candidate provider sets: modified copies of fixtures/mini/model.loom
whose `use` lines name the fixture's control/prepare files by absolute path. Stages cannot
be called over HTTP yet, so a selection's effect is asserted through the inventory (the
preference and each record's `users`) and discovery.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from loomd_process import Daemon, Response
from mini_package import MINI, mini_document
from admin_http import (DEADLINE_S, absolute_uses, assert_error, listed, post, register_ready,
                                  registrations, wait_gone)

ORIGINAL = (MINI / "model.loom").read_text()
BASE_TEXT = absolute_uses(ORIGINAL)
#: keeps the base's contract, changes the math (affine adds the bias twice)
TWICE_TEXT = BASE_TEXT.replace("    add_bias(y, b)\n", "    add_bias(y, b)\n    add_bias(y, b)\n")
SYNTAX_TEXT = TWICE_TEXT.replace("matmul(x, w, y)", "matmul(x, w, y")
VARIANTS = "/v1/models/variants"


def inventory(daemon: Daemon, model: str, **headers: str) -> Response:
    return daemon.request("GET", VARIANTS, headers={"X-Loom-Model": model, **headers})


def selected(daemon: Daemon, model: str) -> int:
    response = inventory(daemon, model)
    assert response.status == 200, response.body
    return response.json()["selected"]


def record(daemon: Daemon, model: str, variant: int) -> dict:
    response = inventory(daemon, model, **{"X-Loom-Variant": str(variant)})
    assert response.status == 200, response.body
    return response.json()


def wait_terminal(daemon: Daemon, model: str, variant: int) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = record(daemon, model, variant)
        if found["phase"] != "compiling":
            return found
        assert time.monotonic() < deadline, f"variant {variant} still compiling: {found}"
        time.sleep(0.05)  # poll interval; the deadline bounds the wait


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def stage(daemon: Daemon, model: str, sources: list[str], base: int | None = None, **fields) -> Response:
    if base is None:
        base = selected(daemon, model)
    return post(daemon, VARIANTS, {"model": model, "base": base, "sources": sources, **fields})


@pytest.fixture
def model(daemon, tmp_path, request):
    """A fresh registration with variant_capacity 3, removed after the test."""
    name = "v_" + re.sub(r"[^a-z0-9]", "", request.node.name.lower())[-40:]
    register_ready(daemon, tmp_path / "model", name)
    yield name
    assert post(daemon, "/v1/models/unregister", {"model": name, "mode": "abort"}).status == 202
    wait_gone(daemon, name)


# ---- inventory ------------------------------------------------------------------------------------------


def test_inventory_lists_the_documents_own_sources(daemon, model):
    response = inventory(daemon, model)
    assert response.status == 200, response.body
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert {k: body[k] for k in ("object", "model", "count", "offset", "next_offset")} == {
        "object": "list", "model": model, "count": 1, "offset": 0, "next_offset": None}
    [first] = body["data"]
    assert body["selected"] == first["id"] and isinstance(first["id"], int)
    assert {k: first[k] for k in ("object", "id", "base", "phase", "users")} == {
        "object": "variant", "id": first["id"], "base": None, "phase": "ready", "users": 1}
    assert "diagnostics" not in first                        # the page holds short records
    assert listed(daemon)[model]["loom"]["variants"] == {"selected": first["id"], "count": 1}

    detail = record(daemon, model, first["id"])
    assert {k: detail[k] for k in ("object", "id", "base", "phase", "users")} == {
        "object": "variant", "id": first["id"], "base": None, "phase": "ready", "users": 1}
    assert detail["diagnostics"] == []
    assert detail["sources"] == [(MINI / "model.loom").as_posix()]
    assert set(detail["stages"]) == {"affine", "accumulate"}

    # X-Loom-Offset selects a zero-based index into the creation order
    past = inventory(daemon, model, **{"X-Loom-Offset": "1"}).json()
    assert past["offset"] == 1 and past["data"] == [] and past["count"] == 1 and past["next_offset"] is None
    assert inventory(daemon, model, **{"X-Loom-Offset": "0"}).json()["data"] == body["data"]


def test_inventory_header_and_body_validation(daemon, model):
    first = selected(daemon, model)
    assert_error(daemon.request("GET", VARIANTS), 400, "X-Loom-Model")
    assert_error(daemon.request("GET", VARIANTS, headers={"X-Loom-Model": ""}), 400, "X-Loom-Model")
    assert_error(inventory(daemon, model, **{"X-Loom-Offset": "0", "X-Loom-Variant": str(first)}), 400,
                 "mutually exclusive")
    for bad in ("-1", "x", "1.0", " "):
        assert_error(inventory(daemon, model, **{"X-Loom-Offset": bad}), 400, "X-Loom-Offset")
        assert_error(inventory(daemon, model, **{"X-Loom-Variant": bad}), 400, "X-Loom-Variant")
    response = daemon.request("GET", VARIANTS, b'{"model":"x"}', headers={"X-Loom-Model": model})
    assert_error(response, 400, "body")
    assert inventory(daemon, model).status == 200


def test_inventory_unknown_model_variant_and_disabled_capability(daemon, model):
    error = assert_error(inventory(daemon, "nosuch"), 404, "nosuch")
    assert error["code"] == "not_found"
    assert_error(inventory(daemon, model, **{"X-Loom-Variant": str(selected(daemon, model) + 100000)}), 404)
    error = assert_error(inventory(daemon, "spare"), 501, "variant")   # registered without variant_capacity
    assert error["code"] == "not_implemented"
    assert_error(stage(daemon, "spare", [str(MINI / "model.loom")], base=1), 501)


# ---- staging ------------------------------------------------------------------------------------------


def test_stage_wait_true_is_200_with_a_ready_record(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = write(tmp_path, "twice.loom", TWICE_TEXT)
    response = stage(daemon, model, [str(source)], base=base, wait=True)
    assert response.status == 200, response.body
    body = response.json()
    assert set(body) == {"selected", "variant"}
    assert body["selected"] == base                                   # staging never selects
    v = body["variant"]
    assert v["object"] == "variant" and v["phase"] == "ready" and v["base"] == base and v["users"] == 0
    assert v["id"] > base and "error" not in v
    assert v["sources"] == [source.as_posix()]
    inv = inventory(daemon, model).json()
    assert inv["selected"] == base and inv["count"] == 2
    assert [r["id"] for r in inv["data"]] == [base, v["id"]]         # creation order
    assert listed(daemon)[model]["loom"]["variants"] == {"selected": base, "count": 2}
    # omitted wait means wait
    again = stage(daemon, model, [str(source)], base=base)
    assert again.status == 200 and again.json()["variant"]["phase"] == "ready"


def test_stage_syntax_error_is_422_with_diagnostics(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = write(tmp_path, "cand_syntax.loom", SYNTAX_TEXT)
    response = stage(daemon, model, [str(source)], base=base)
    assert response.status == 422, response.body
    body = response.json()
    assert body["selected"] == base
    v = body["variant"]
    assert v["phase"] == "failed" and v["base"] == base
    assert v["error"]["code"] == "compile_error" and "cand_syntax.loom" in v["error"]["message"]
    bad_line = next(i for i, line in enumerate(SYNTAX_TEXT.splitlines(), 1) if "matmul(x, w, y" in line)
    position = re.search(re.escape(source.as_posix()) + r":(\d+):(\d+)", "\n".join(v["diagnostics"]))
    assert position, v["diagnostics"]
    assert bad_line <= int(position.group(1)) <= bad_line + 1 and int(position.group(2)) >= 1
    # the detailed record retains the same evidence; the preference is unchanged
    detail = record(daemon, model, v["id"])
    assert detail["error"] == v["error"] and detail["diagnostics"] == v["diagnostics"]
    assert "stages" not in detail
    assert selected(daemon, model) == base
    # a failed candidate cannot be selected, but can be removed
    assert_error(post(daemon, f"{VARIANTS}/select", {"model": model, "variant": v["id"], "expected": base}), 409,
                 "failed")
    assert post(daemon, f"{VARIANTS}/remove", {"model": model, "variant": v["id"]}).json() == {"removed": v["id"]}


def test_stage_wait_false_is_202_then_poll(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = write(tmp_path, "twice.loom", TWICE_TEXT)
    response = stage(daemon, model, [str(source)], base=base, wait=False)
    assert response.status == 202, response.body
    body = response.json()
    assert body["selected"] == base
    v = body["variant"]
    assert v["object"] == "variant" and v["base"] == base and v["phase"] in ("compiling", "ready")
    done = wait_terminal(daemon, model, v["id"])
    assert done["phase"] == "ready", done
    assert selected(daemon, model) == base


def test_stage_relative_sources_and_base_directory(daemon, model, tmp_path):
    base = selected(daemon, model)
    write(tmp_path / "cand", "model.loom", TWICE_TEXT)
    error = assert_error(stage(daemon, model, ["model.loom"], base=base), 400, "base_directory")
    assert error["param"] == "sources[0]"
    assert_error(stage(daemon, model, ["model.loom"], base=base, base_directory="cand"), 400, "base_directory")
    response = stage(daemon, model, ["model.loom"], base=base, base_directory=str(tmp_path / "cand"))
    assert response.status == 200, response.body
    v = response.json()["variant"]
    assert v["phase"] == "ready" and v["sources"] == ["model.loom"]     # the record keeps the authored path


def test_stage_field_validation(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = str(write(tmp_path, "twice.loom", TWICE_TEXT))
    for field in ("prepare", "control", "checkpoint", "kind", "variant_capacity"):
        error = assert_error(stage(daemon, model, [source], base=base, **{field: str(MINI / "control.loom")}),
                             400, field)
        assert error["param"] == field
    assert_error(stage(daemon, model, [source], base=base, wait="yes"), 400, "wait")
    assert_error(stage(daemon, model, source, base=base), 400, "sources")
    assert_error(stage(daemon, model, [], base=base), 400, "sources")
    assert_error(stage(daemon, model, [source], base=str(base)), 400, "base")
    assert_error(post(daemon, VARIANTS, {"model": model, "sources": [source]}), 400, "base")
    assert_error(post(daemon, VARIANTS, '{"model":"%s","base":%d,"base":%d,"sources":[]}' % (model, base, base)),
                 400, "base")
    assert_error(stage(daemon, model, [source], base=base + 100000), 404)
    assert_error(stage(daemon, "nosuch", [source], base=base), 404, "nosuch")
    assert inventory(daemon, model).json()["count"] == 1               # nothing was staged


def test_capacity_exhausted_is_429(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = str(write(tmp_path, "twice.loom", TWICE_TEXT))
    ids = []
    for _ in range(2):                                                  # capacity 3 counts the selected one
        response = stage(daemon, model, [source], base=base)
        assert response.status == 200, response.body
        ids.append(response.json()["variant"]["id"])
    error = assert_error(stage(daemon, model, [source], base=base), 429, "variant_capacity")
    assert error["code"] == "capacity_exhausted"
    assert inventory(daemon, model).json()["count"] == 3
    assert post(daemon, f"{VARIANTS}/remove", {"model": model, "variant": ids[0]}).status == 200
    assert stage(daemon, model, [source], base=base).status == 200    # room again


# ---- selection and removal ------------------------------------------------------------------------------


def test_select_then_remove(daemon, model, tmp_path):
    base = selected(daemon, model)
    source = str(write(tmp_path, "twice.loom", TWICE_TEXT))
    candidate = stage(daemon, model, [source], base=base).json()["variant"]["id"]
    select = f"{VARIANTS}/select"

    # a stale expected ID rejects without switching
    error = assert_error(post(daemon, select, {"model": model, "variant": candidate, "expected": candidate}), 409,
                         "stale")
    assert error["param"] == "expected"
    assert selected(daemon, model) == base
    assert_error(post(daemon, select, {"model": model, "variant": candidate + 100000, "expected": base}), 404)
    assert_error(post(daemon, select, {"model": model, "variant": candidate}), 400, "expected")
    assert_error(post(daemon, select, {"model": model, "variant": str(candidate), "expected": base}), 400,
                 "variant")
    assert_error(post(daemon, select, {"model": model, "variant": candidate, "expected": base, "x": 1}), 400, "x")

    response = post(daemon, select, {"model": model, "variant": candidate, "expected": base})
    assert response.status == 200, response.body
    assert response.json() == {"selected": candidate}
    # the model now runs the candidate: the preference and its consumer moved
    inv = inventory(daemon, model).json()
    assert inv["selected"] == candidate
    assert {r["id"]: r["users"] for r in inv["data"]} == {base: 0, candidate: 1}
    assert listed(daemon)[model]["loom"]["variants"] == {"selected": candidate, "count": 2}
    assert registrations(daemon)[model]["variants"] == {"selected": candidate, "count": 2}
    # the old expected is stale now
    assert_error(post(daemon, select, {"model": model, "variant": base, "expected": base}), 409, "stale")

    remove = f"{VARIANTS}/remove"
    error = assert_error(post(daemon, remove, {"model": model, "variant": candidate}), 409, "in use")
    assert error["code"] == "conflict"
    assert_error(post(daemon, remove, {"model": model, "variant": candidate + 100000}), 404)
    assert_error(post(daemon, remove, {"model": model, "variant": -1}), 400, "variant")
    assert_error(post(daemon, remove, {"model": model, "variant": base, "expected": base}), 400, "expected")
    response = post(daemon, remove, {"model": model, "variant": base})
    assert response.status == 200, response.body
    assert response.json() == {"removed": base}
    assert_error(post(daemon, remove, {"model": model, "variant": base}), 404)
    inv = inventory(daemon, model).json()
    assert [r["id"] for r in inv["data"]] == [candidate] and inv["selected"] == candidate
    # switching back to a new build of the original sources works against the selected base
    back = stage(daemon, model, [str(MINI / "model.loom")], base=candidate).json()["variant"]
    assert back["phase"] == "ready"
    assert post(daemon, select, {"model": model, "variant": back["id"], "expected": candidate}).json() == {
        "selected": back["id"]}


def test_variant_of_another_registration_conflicts(daemon, model, tmp_path):
    other_base = selected(daemon, "mini")
    mine = selected(daemon, model)
    assert_error(post(daemon, f"{VARIANTS}/select", {"model": model, "variant": other_base, "expected": mine}), 409,
                 "mini")
    assert selected(daemon, model) == mine and selected(daemon, "mini") == other_base
    assert_error(stage(daemon, model, [str(MINI / "model.loom")], base=other_base), 409, "mini")


def test_ids_never_recycle_after_unregister(daemon, tmp_path):
    register_ready(daemon, tmp_path / "a", "recycle")
    first = selected(daemon, "recycle")
    assert post(daemon, "/v1/models/unregister", {"model": "recycle"}).status == 202
    wait_gone(daemon, "recycle")
    register_ready(daemon, tmp_path / "b", "recycle")
    try:
        assert selected(daemon, "recycle") > first
    finally:
        assert post(daemon, "/v1/models/unregister", {"model": "recycle"}).status == 202
        wait_gone(daemon, "recycle")


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/models/variants", {"model": "nosuch", "base": 1, "sources": ["/x.loom"]}),
    ("/v1/models/variants/select", {"model": "nosuch", "variant": 1, "expected": 1}),
    ("/v1/models/variants/remove", {"model": "nosuch", "variant": 1}),
])
def test_unknown_model_is_404(daemon, path, body):
    error = assert_error(post(daemon, path, body), 404, "nosuch")
    assert error["code"] == "not_found"


def test_drained_admission_permits_staging_and_selection(daemon, model, tmp_path):
    base = selected(daemon, model)
    assert post(daemon, "/v1/models/drain", {"model": model}).status == 200
    source = str(write(tmp_path, "twice.loom", TWICE_TEXT))
    response = stage(daemon, model, [source], base=base)
    assert response.status == 200, response.body
    candidate = response.json()["variant"]["id"]
    response = post(daemon, f"{VARIANTS}/select", {"model": model, "variant": candidate, "expected": base})
    assert response.status == 200 and response.json() == {"selected": candidate}
    assert inventory(daemon, model).json()["selected"] == candidate


def test_staging_needs_a_prepared_registration(daemon, tmp_path):
    response = post(daemon, "/v1/models/register", mini_document(tmp_path, model="vdeferred", admission="drained"))
    assert response.status == 202
    deadline = time.monotonic() + DEADLINE_S
    while registrations(daemon)["vdeferred"]["phase"] != "deferred":
        assert time.monotonic() < deadline
        time.sleep(0.05)  # poll interval; the deadline bounds the wait
    try:
        assert_error(inventory(daemon, "vdeferred"), 409, "deferred")
        assert_error(stage(daemon, "vdeferred", [str(MINI / "model.loom")], base=1), 409, "deferred")
    finally:
        assert post(daemon, "/v1/models/unregister", {"model": "vdeferred"}).status == 202
        wait_gone(daemon, "vdeferred")
