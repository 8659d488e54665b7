"""Native executable variants through the `Registry` (spec: http-profiles.md, "Native
executable variants" and "Uploaded source packages").

Every test registers the real `mini` package and compiles real candidate provider sets
(modified copies of fixtures/mini/model.loom). Where a candidate must stay "compiling" or a
selection must stay pending, the test holds it with a `threading.Event` (a wrapped
`compile_deployment`, or a job whose `on_step` blocks the service worker), never a sleep.
"""

from __future__ import annotations

import gc
import json
import re
import threading
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file

import loomrt.registry as registry_module
import loomrt.variants as variants_module
from loomrt.compiler import Contract
from loomrt.devices import Devices
from loomrt.errors import (Conflict, Gone, InvalidRequest, NotFound, NotImplementedFeature, TooManyRequests,
                           Unavailable)
from loomrt.package import PackageFiles
from loomrt.registry import Registry
from loomrt.services.base import Job, Step
from mini_package import DIM, MINI, mini_document

TIMEOUT = 60
X = (np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM) - 5.0) / 4.0

ORIGINAL = (MINI / "model.loom").read_text()
USES = ('use "control.loom" { dim }', 'use "prepare.loom" { w, b }')


def absolute_uses(text: str) -> str:
    """model.loom with its `use` strings pointing at the fixture's control/prepare by absolute path."""
    text = text.replace(USES[0], f'use "{MINI / "control.loom"}" {{ dim }}')
    return text.replace(USES[1], f'use "{MINI / "prepare.loom"}" {{ w, b }}')


BASE_TEXT = absolute_uses(ORIGINAL)
#: Keeps the contract, changes the math: affine adds the bias twice.
TWICE_TEXT = BASE_TEXT.replace("    add_bias(y, b)\n", "    add_bias(y, b)\n    add_bias(y, b)\n")
assert TWICE_TEXT != BASE_TEXT


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def weights(directory: Path) -> tuple[np.ndarray, np.ndarray]:
    tensors = load_file(str(directory / "mini.safetensors"))
    return tensors["proj.weight"], tensors["proj.bias"]


def affine(registry: Registry, name: str, x: np.ndarray = X) -> np.ndarray:
    outputs = registry.submit(name, Job([Step("affine", {"x": x})])).result(30)
    return outputs[0]["y"]


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def registry():
    reg = Registry(Devices(cuda={}))
    yield reg
    reg.close(timeout=TIMEOUT)


def register_ready(registry: Registry, directory: Path, name: str = "m1", **fields):
    directory.mkdir(parents=True, exist_ok=True)
    reg = registry.register(mini_document(directory, model=name, **fields))
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT)
    assert reg.phase == "ready", reg.error
    return reg


@pytest.fixture
def m1(registry, tmp_path):
    return register_ready(registry, tmp_path)


def stage(registry: Registry, path: Path, name: str = "m1", base: int | None = None):
    if base is None:
        base = registry.list_variants(name)["selected"]
    v = registry.stage_variant(name, base=base, sources=[str(path)])
    registry.wait_variant(name, v, timeout=TIMEOUT)
    return v


@pytest.fixture
def held(registry, monkeypatch):
    """Candidate compilations block until `gate` is set (registration compiles pass through).
    Depends on `registry` so that the gate opens before the registry closes."""
    real = registry_module.compile_deployment
    gate, entered = threading.Event(), threading.Event()

    def compile_held(doc, package, **kwargs):
        if kwargs.get("sources") is not None:
            entered.set()
            assert gate.wait(TIMEOUT)
        return real(doc, package, **kwargs)

    monkeypatch.setattr(registry_module, "compile_deployment", compile_held)
    yield SimpleNamespace(gate=gate, entered=entered)
    gate.set()


# ---- 1. inventory ------------------------------------------------------------------------------------


def test_initial_inventory_and_detailed_record(registry, m1):
    inv = registry.list_variants("m1")
    assert {k: inv[k] for k in ("object", "model", "count", "offset", "next_offset")} == {
        "object": "list", "model": "m1", "count": 1, "offset": 0, "next_offset": None}
    [first] = inv["data"]
    assert inv["selected"] == first["id"]
    assert isinstance(first["id"], int) and first["id"] >= 1
    assert {k: first[k] for k in ("object", "base", "phase", "users")} == {
        "object": "variant", "base": None, "phase": "ready", "users": 1}
    assert "error" not in first and "diagnostics" not in first  # the summary record is short

    detail = registry.variant("m1", first["id"])
    assert {k: detail[k] for k in ("object", "id", "base", "phase", "users")} == {
        "object": "variant", "id": first["id"], "base": None, "phase": "ready", "users": 1}
    assert detail["diagnostics"] == []
    assert detail["sources"] == [(MINI / "model.loom").as_posix()]
    assert detail["stages"].keys() == {"affine", "accumulate"}

    # discovery/status report loom.variants {selected, count}
    [status] = registry.status()["registrations"]
    assert status["variants"] == {"selected": first["id"], "count": 1}

    with pytest.raises(NotFound) as exc:
        registry.variant("m1", first["id"] + 1000)
    assert exc.value.status == 404


# ---- 2. staging, selection, removal ---------------------------------------------------------------


def test_stage_select_switches_math_and_frees_previous(registry, m1, tmp_path):
    w, b = weights(tmp_path)
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + b, rtol=1e-5, atol=1e-5)
    base = registry.list_variants("m1")["selected"]

    v = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT))
    assert v.phase == "ready" and v.error is None and v.base == base and v.id > base
    inv = registry.list_variants("m1")
    assert inv["selected"] == base and inv["count"] == 2          # staging never selects
    assert [(r["id"], r["base"], r["phase"], r["users"]) for r in inv["data"]] == [
        (base, None, "ready", 1), (v.id, base, "ready", 0)]
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + b, rtol=1e-5, atol=1e-5)

    assert registry.select_variant("m1", v.id, expected=base).result(30) == v.id
    inv = registry.list_variants("m1")
    assert inv["selected"] == v.id
    assert {r["id"]: r["users"] for r in inv["data"]} == {base: 0, v.id: 1}
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)
    # retained state and the other stage survive the switch
    rows = np.array([0, 1], dtype=np.int32)
    for step in (1, 2):
        total = registry.submit("m1", Job([Step("accumulate", {"x": X, "rows": rows})])).result(30)[0]["total"]
        np.testing.assert_allclose(total, step * X, rtol=1e-6)

    with pytest.raises(Conflict) as exc:
        registry.remove_variant("m1", v.id)                     # the selected one is in use
    assert exc.value.status == 409
    assert registry.remove_variant("m1", base) == base          # the previous one is free now
    inv = registry.list_variants("m1")
    assert [r["id"] for r in inv["data"]] == [v.id] and inv["count"] == 1 and inv["selected"] == v.id
    with pytest.raises(NotFound):
        registry.remove_variant("m1", base)
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


def test_selecting_the_selected_variant_is_a_no_op(registry, m1):
    base = registry.list_variants("m1")["selected"]
    assert registry.select_variant("m1", base, expected=base).result(30) == base
    inv = registry.list_variants("m1")
    assert inv["selected"] == base and inv["data"][0]["users"] == 1


# ---- 3. selection conflicts --------------------------------------------------------------------------


def test_stale_expected_rejects_without_switching(registry, m1, tmp_path):
    w, b = weights(tmp_path)
    base = registry.list_variants("m1")["selected"]
    v = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT))
    for stale in (v.id, base + 10_000):
        with pytest.raises(Conflict) as exc:
            registry.select_variant("m1", v.id, expected=stale)
        assert exc.value.status == 409 and exc.value.param == "expected"
    inv = registry.list_variants("m1")
    assert inv["selected"] == base
    assert {r["id"]: r["users"] for r in inv["data"]} == {base: 1, v.id: 0}
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + b, rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidRequest):
        registry.select_variant("m1", v.id, expected="1")
    with pytest.raises(InvalidRequest):
        registry.select_variant("m1", True, expected=base)


def test_compiling_candidate_cannot_be_selected_or_removed(registry, m1, tmp_path, held):
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=[str(write(tmp_path, "twice.loom", TWICE_TEXT))])
    assert held.entered.wait(TIMEOUT)
    assert v.phase == "compiling"
    assert registry.variant("m1", v.id)["phase"] == "compiling"
    with pytest.raises(Unavailable):                            # a waiter with a deadline gives up
        registry.wait_variant("m1", v, timeout=0.05)
    with pytest.raises(Conflict) as exc:
        registry.select_variant("m1", v.id, expected=base)
    assert "compiling" in exc.value.message
    with pytest.raises(Conflict) as exc:
        registry.remove_variant("m1", v.id)
    assert "compiling" in exc.value.message
    assert registry.list_variants("m1")["selected"] == base

    held.gate.set()
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "ready"
    assert registry.list_variants("m1")["selected"] == base     # finishing never selects either
    assert registry.remove_variant("m1", v.id) == v.id


def test_pending_selection_rejects_a_second_one(registry, m1, tmp_path):
    """A selection waits for the service's safe boundary; a job whose step callback blocks
    keeps the worker inside a pass, so the selection stays pending deterministically."""
    w, b = weights(tmp_path)
    base = registry.list_variants("m1")["selected"]
    v1 = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT))
    v2 = stage(registry, write(tmp_path, "twice2.loom", TWICE_TEXT))
    entered, release = threading.Event(), threading.Event()

    def block(index, outputs):
        entered.set()
        assert release.wait(TIMEOUT)

    first = registry.submit("m1", Job([Step("affine", {"x": X}), Step("affine", {"x": X})], on_step=block))
    try:
        assert entered.wait(TIMEOUT)
        switching = registry.select_variant("m1", v1.id, expected=base)
        assert not switching.done()
        with pytest.raises(Conflict) as exc:
            registry.select_variant("m1", v2.id, expected=base)
        assert "switching" in exc.value.message
        with pytest.raises(Conflict):                           # reserved by the pending selection
            registry.remove_variant("m1", v1.id)
        assert registry.list_variants("m1")["selected"] == base
    finally:
        release.set()
    assert switching.result(30) == v1.id
    steps = first.result(30)
    np.testing.assert_allclose(steps[0]["y"], X @ w.T + b, rtol=1e-5, atol=1e-5)       # before the boundary
    np.testing.assert_allclose(steps[1]["y"], X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)   # after it
    inv = registry.list_variants("m1")
    assert inv["selected"] == v1.id
    assert {r["id"]: r["users"] for r in inv["data"]} == {base: 0, v1.id: 1, v2.id: 0}


def test_failed_candidate_keeps_diagnostics_cannot_be_selected_can_be_removed(registry, m1, tmp_path):
    base = registry.list_variants("m1")["selected"]
    broken = TWICE_TEXT.replace("matmul(x, w, y)", "matmul(x, w, y")
    lines = broken.splitlines()
    bad_line = next(i for i, line in enumerate(lines, 1) if "matmul(x, w, y" in line) + 1  # the parser trips here
    v = stage(registry, write(tmp_path, "cand_syntax.loom", broken))
    assert v.phase == "failed"
    assert v.error.code == "compile_error" and v.error.status == 422

    record = registry.list_variants("m1")["data"][1]
    assert record["id"] == v.id and record["phase"] == "failed" and record["users"] == 0
    assert record["error"]["code"] == "compile_error"
    assert "cand_syntax.loom" in record["error"]["message"]
    detail = registry.variant("m1", v.id)
    assert detail["error"] == record["error"]
    positions = [re.search(r"cand_syntax\.loom:(\d+):(\d+)", d) for d in detail["diagnostics"]]
    assert positions[0] is not None, detail["diagnostics"]
    assert int(positions[0].group(1)) == bad_line and int(positions[0].group(2)) >= 1
    assert "stages" not in detail
    assert registry.list_variants("m1")["selected"] == base     # a failed JIT never selects

    with pytest.raises(Conflict) as exc:
        registry.select_variant("m1", v.id, expected=base)
    assert "failed" in exc.value.message
    assert registry.list_variants("m1")["selected"] == base
    assert registry.remove_variant("m1", v.id) == v.id
    assert [r["id"] for r in registry.list_variants("m1")["data"]] == [base]


def test_failed_base_cannot_be_staged_against(registry, m1, tmp_path):
    bad = stage(registry, write(tmp_path, "bad.loom", "this is not loom"))
    assert bad.phase == "failed"
    with pytest.raises(Conflict) as exc:
        registry.stage_variant("m1", base=bad.id, sources=[str(write(tmp_path, "ok.loom", TWICE_TEXT))])
    assert exc.value.param == "base"
    with pytest.raises(NotFound):
        registry.stage_variant("m1", base=bad.id + 1000, sources=[str(tmp_path / "ok.loom")])
    assert registry.list_variants("m1")["count"] == 2


# ---- 4. the base's contract -----------------------------------------------------------------------------


STATE_TEXT = BASE_TEXT.replace("state acc: f32[dim] per row", "state acc: f32[dim, 2] per row").replace(
    "running_sum(x, rows, acc, total)", "running_sum2(x, rows, acc, total)") + """
kernel running_sum2(x: f32[R, D], rows: i32[R], inout sums: f32[N, D, K], out total: f32[R, D]) {
    for r in 0..R {
        let row = i64(rows[r])
        for d in 0..D {
            sums[row, d, 0] = sums[row, d, 0] + x[r, d]
            total[r, d] = sums[row, d, 0]
        }
    }
}
"""


def test_candidate_changing_a_stage_signature_fails(registry, m1, tmp_path):
    text = BASE_TEXT.replace("command affine(x: f32[T, dim]) -> (y: f32[T, dim])",
                             "command affine(x: f32[T, dim]) -> (y: f32[T, dim, 1])")
    assert text != BASE_TEXT
    base = registry.list_variants("m1")["selected"]
    v = stage(registry, write(tmp_path, "shape.loom", text))
    assert v.phase == "failed" and v.error.code == "compile_error"
    detail = registry.variant("m1", v.id)
    assert any("stage 'affine'" in d for d in detail["diagnostics"]), detail["diagnostics"]
    assert registry.list_variants("m1")["selected"] == base


def test_candidate_changing_the_state_layout_fails(registry, m1, tmp_path):
    base = registry.list_variants("m1")["selected"]
    v = stage(registry, write(tmp_path, "state.loom", STATE_TEXT))
    assert v.phase == "failed" and v.error.code == "compile_error"
    assert f"base variant {base}'s contract" in v.error.message
    assert "state 'acc'" in v.error.message and "f32[<rows>, 8, 2]" in v.error.message
    assert any("state 'acc'" in d for d in registry.variant("m1", v.id)["diagnostics"])


def test_candidate_binding_a_param_with_another_shape_fails(registry, m1, tmp_path):
    prepare = (MINI / "prepare.loom").read_text().replace(
        'use "control.loom"', f'use "{MINI / "control.loom"}"').replace("param b: f32[dim]", "param b: f32[1, dim]")
    other = write(tmp_path, "prepare2.loom", prepare)
    text = BASE_TEXT.replace(f'use "{MINI / "prepare.loom"}"', f'use "{other}"').replace(
        "bias: f32[D]) {", "bias: f32[O, D]) {").replace("+ bias[d]", "+ bias[0, d]")
    v = stage(registry, write(tmp_path, "param.loom", text))
    assert v.phase == "failed" and v.error.code == "compile_error"
    assert "param 'b'" in v.error.message
    assert "f32[8]" in v.error.message and "f32[1, 8]" in v.error.message


def test_contract_differences_name_the_stage():
    base = Contract({"affine": "stage affine(x: f32[T, dim]) -> (y: f32[T, dim])"},
                    {"w": ("f32", ("8", "8"), None)}, {"acc": "f32[<rows>, 8]"})
    assert base.differences(base) == []
    other = Contract({"affine": "stage affine(x: f32[T, dim]) -> (y: f32[T, 4])", "extra": "stage extra()"},
                     {"w": ("f32", ("8", "8"), None), "u": ("f32", ("8",), None)}, {})
    problems = base.differences(other)
    assert problems == [
        "stage 'affine': the base declares stage affine(x: f32[T, dim]) -> (y: f32[T, dim]), "
        "the candidate stage affine(x: f32[T, dim]) -> (y: f32[T, 4])",
        "stage 'extra': the base declares nothing, the candidate stage extra()",
        "param 'u' is bound by the candidate but not prepared for the base",
        "state 'acc': the base retains f32[<rows>, 8], the candidate nothing",
    ]


# ---- 5. ownership --------------------------------------------------------------------------------------


def test_variant_of_another_registration_conflicts_unknown_is_not_found(registry, m1, tmp_path):
    register_ready(registry, tmp_path / "m2", "m2")
    base1 = registry.list_variants("m1")["selected"]
    base2 = registry.list_variants("m2")["selected"]
    assert base1 != base2
    other = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT), name="m2")
    assert other.phase == "ready"

    for foreign in (base2, other.id):
        with pytest.raises(Conflict) as exc:
            registry.select_variant("m1", foreign, expected=base1)
        assert "m2" in exc.value.message and exc.value.param == "variant"
        with pytest.raises(Conflict):                           # nor as a base
            registry.stage_variant("m1", base=foreign, sources=[str(tmp_path / "twice.loom")])
        with pytest.raises(NotFound):                           # not m1's entry
            registry.variant("m1", foreign)
    unknown = other.id + 1000
    with pytest.raises(NotFound) as exc:
        registry.select_variant("m1", unknown, expected=base1)
    assert exc.value.status == 404
    with pytest.raises(NotFound):
        registry.remove_variant("m1", unknown)
    with pytest.raises(NotFound):
        registry.remove_variant("m1", other.id)
    assert registry.list_variants("m1")["selected"] == base1
    assert registry.list_variants("m2")["count"] == 2           # m2's entry was not touched


# ---- 6. capacity and capability ------------------------------------------------------------------------


def test_capacity_is_a_bounded_pool(registry, tmp_path):
    register_ready(registry, tmp_path, variant_capacity=2)
    path = write(tmp_path, "twice.loom", TWICE_TEXT)
    base = registry.list_variants("m1")["selected"]
    v = stage(registry, path)
    assert v.phase == "ready"
    with pytest.raises(TooManyRequests) as exc:
        registry.stage_variant("m1", base=base, sources=[str(path)])
    assert exc.value.status == 429
    assert registry.list_variants("m1")["count"] == 2
    assert registry.remove_variant("m1", v.id) == v.id           # room again
    again = stage(registry, path)
    assert again.phase == "ready" and again.id > v.id


@pytest.mark.parametrize("capacity", [None, 0])
def test_disabled_capability_is_501(registry, tmp_path, capacity):
    reg = register_ready(registry, tmp_path, variant_capacity=capacity)
    assert reg.variants is None
    assert "variants" not in registry.status()["registrations"][0]
    path = write(tmp_path, "twice.loom", TWICE_TEXT)
    calls = [lambda: registry.list_variants("m1"), lambda: registry.variant("m1", 1),
             lambda: registry.stage_variant("m1", base=1, sources=[str(path)]),
             lambda: registry.select_variant("m1", 1, expected=1), lambda: registry.remove_variant("m1", 1)]
    for call in calls:
        with pytest.raises(NotImplementedFeature) as exc:
            call()
        assert exc.value.status == 501


# ---- 7. paging -------------------------------------------------------------------------------------------


def test_pages_in_creation_order(registry, tmp_path, monkeypatch):
    assert variants_module.PAGE_SIZE == 64
    monkeypatch.setattr(variants_module, "PAGE_SIZE", 2)
    register_ready(registry, tmp_path, variant_capacity=6)
    path = write(tmp_path, "twice.loom", TWICE_TEXT)
    ids = [registry.list_variants("m1")["selected"]] + [stage(registry, path).id for _ in range(4)]
    assert ids == sorted(ids)

    pages, offset = [], 0
    while offset is not None:
        page = registry.list_variants("m1", offset)
        assert page["offset"] == offset and page["count"] == 5 and page["selected"] == ids[0]
        pages.append([r["id"] for r in page["data"]])
        offset = page["next_offset"]
    assert pages == [ids[0:2], ids[2:4], ids[4:5]]
    assert registry.list_variants("m1", 2)["next_offset"] == 4
    past = registry.list_variants("m1", 10)
    assert past["data"] == [] and past["next_offset"] is None and past["count"] == 5

    # live inventory: a removal shifts later entries, the order stays creation order
    registry.remove_variant("m1", ids[2])
    assert [r["id"] for r in registry.list_variants("m1", 2)["data"]] == [ids[3], ids[4]]
    assert registry.list_variants("m1", 2)["next_offset"] is None

    for bad in (-1, True, "2", 1.0):
        with pytest.raises(InvalidRequest) as exc:
            registry.list_variants("m1", bad)
        assert exc.value.param == "offset"


# ---- 8. IDs ---------------------------------------------------------------------------------------------


def test_ids_are_monotonic_and_never_recycled(registry, tmp_path):
    register_ready(registry, tmp_path / "a")
    seen = [registry.list_variants("m1")["selected"]]
    v = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT))
    seen.append(v.id)
    assert registry.remove_variant("m1", v.id) == v.id           # a removed ID is not reused either
    seen.append(stage(registry, tmp_path / "twice.loom").id)
    assert seen == sorted(set(seen))

    assert registry.unregister("m1").result(TIMEOUT) == "m1"
    with pytest.raises(NotFound):
        registry.list_variants("m1")
    register_ready(registry, tmp_path / "b")
    again = registry.list_variants("m1")["selected"]
    assert again > max(seen)
    register_ready(registry, tmp_path / "c", "m3")
    assert registry.list_variants("m3")["selected"] > again
    with pytest.raises(NotFound):                                # the old registration's IDs are gone
        registry.variant("m1", seen[0])
    with pytest.raises(NotFound):
        registry.select_variant("m1", seen[0], expected=again)


# ---- 9. unregister withdraws waiting readers --------------------------------------------------------


def test_unregister_withdraws_waiters_with_gone_and_joins_the_compile(registry, m1, tmp_path, held):
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=[str(write(tmp_path, "twice.loom", TWICE_TEXT))])
    assert held.entered.wait(TIMEOUT)
    outcome: dict[str, BaseException | None] = {}

    def reader():
        try:
            registry.wait_variant("m1", v, timeout=TIMEOUT)
            outcome["error"] = None
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=reader)
    thread.start()
    removed = registry.unregister("m1")
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert isinstance(outcome["error"], Gone) and outcome["error"].status == 410
    assert v.phase == "compiling"
    assert not removed.done()                                   # removal joins the compiler's work
    with pytest.raises(Conflict):                               # removal is not a healthy registration
        registry.list_variants("m1")
    with pytest.raises(Gone):                                   # a late reader is withdrawn too
        registry.wait_variant("m1", v, timeout=TIMEOUT)

    held.gate.set()
    assert removed.result(TIMEOUT) == "m1"
    assert v.done.result(TIMEOUT) is v and v.phase == "ready"  # accepted compilation ran to its end
    with pytest.raises(NotFound):
        registry.list_variants("m1")


# ---- 10. sources ---------------------------------------------------------------------------------------


def test_relative_sources_need_an_absolute_base_directory(registry, m1, tmp_path):
    w, b = weights(tmp_path)
    write(tmp_path, "twice.loom", TWICE_TEXT)
    base = registry.list_variants("m1")["selected"]
    with pytest.raises(InvalidRequest) as exc:
        registry.stage_variant("m1", base=base, sources=["twice.loom"])
    assert "base_directory" in exc.value.message
    with pytest.raises(InvalidRequest) as exc:
        registry.stage_variant("m1", base=base, sources=["twice.loom"], base_directory="relative/dir")
    assert exc.value.param == "base_directory"
    assert registry.list_variants("m1")["count"] == 1           # nothing was staged

    v = registry.stage_variant("m1", base=base, sources=["twice.loom"], base_directory=str(tmp_path))
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "ready", v.error
    assert registry.variant("m1", v.id)["sources"] == ["twice.loom"]
    registry.select_variant("m1", v.id, expected=base).result(30)
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


KERNELS = ORIGINAL[ORIGINAL.index("kernel add_bias"):ORIGINAL.index("command affine")]
COMMANDS = TWICE_TEXT[TWICE_TEXT.index("command affine"):]


def test_uploaded_package_compiles_from_its_members(registry, m1, tmp_path):
    """The candidate's commands and kernels live only in the package (a shared kernel file
    reached with `..`); control/prepare are the registration's, named by absolute path."""
    w, b = weights(tmp_path)
    model = "\n".join([f'use "{MINI / "control.loom"}" {{ dim }}', f'use "{MINI / "prepare.loom"}" {{ w, b }}',
                       'use "../lib/kernels.loom" { add_bias, running_sum }', "",
                       "state acc: f32[dim] per row", "", COMMANDS])
    package = PackageFiles({"cand/model.loom": model.encode(), "lib/kernels.loom": KERNELS.encode(),
                            "cand/request.json": b"{}"})
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=["model.loom"], package=package,
                               origin="cand/request.json")
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "ready", v.error and v.error.message
    assert registry.variant("m1", v.id)["sources"] == ["cand/model.loom"]
    assert registry.select_variant("m1", v.id, expected=base).result(30) == v.id
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["ready", "syntax", "contract"])
def test_staging_releases_the_uploaded_package(registry, m1, tmp_path, kind):
    """"Native staging releases its source ownership after constructing independent
    executables and copied diagnostics": nothing the variant keeps refers to the upload."""
    text = {"ready": TWICE_TEXT, "syntax": TWICE_TEXT.replace("matmul(x, w, y)", "matmul(x, w, y"),
            "contract": STATE_TEXT}[kind]
    package = PackageFiles({"cand/model.loom": text.encode()})
    alive = weakref.ref(package)
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=["model.loom"], package=package, origin="cand/request.json")
    del package
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == ("ready" if kind == "ready" else "failed")
    detail = registry.variant("m1", v.id)                      # the copied evidence stays
    if kind == "syntax":
        assert any(d.startswith("cand/model.loom:") for d in detail["diagnostics"]), detail["diagnostics"]
    # the pool's worker drops its work item (the staging arguments) just after resolving it
    assert registry.wait_for(lambda: gc.collect() >= 0 and alive() is None, 10)
    if kind == "ready":
        w, b = weights(tmp_path)
        registry.select_variant("m1", v.id, expected=base).result(30)
        np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


def test_package_registration_with_an_uploaded_candidate(registry, tmp_path):
    """The spec's flow: a model registered from a package, a candidate uploaded with its own
    copies of the shared providers (relative `use` inside the candidate package)."""
    checkpoint = tmp_path / "mini.safetensors"
    document = json.loads(mini_document(tmp_path, model="p1"))
    document.update(control="control.loom", prepare="prepare.loom", sources=["model.loom"],
                    checkpoint=str(checkpoint))
    shared = {name: (MINI / name).read_bytes() for name in ("control.loom", "prepare.loom", "model.loom")}
    reg = registry.register(json.dumps(document), package=PackageFiles({f"model/{k}": v for k, v in shared.items()}),
                            origin="model/model.json")
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT)
    assert reg.phase == "ready", reg.error
    base = registry.list_variants("p1")["selected"]
    assert registry.variant("p1", base)["sources"] == ["model/model.loom"]

    twice = ORIGINAL.replace("    add_bias(y, b)\n", "    add_bias(y, b)\n    add_bias(y, b)\n")
    upload = {"cand/model.loom": twice.encode(), "cand/control.loom": shared["control.loom"],
              "cand/prepare.loom": shared["prepare.loom"]}
    v = registry.stage_variant("p1", base=base, sources=["model.loom"], package=PackageFiles(upload),
                               origin="cand/candidate.json")
    registry.wait_variant("p1", v, timeout=TIMEOUT)
    assert v.phase == "ready", v.error and v.error.message
    w, b = weights(tmp_path)
    np.testing.assert_allclose(affine(registry, "p1"), X @ w.T + b, rtol=1e-5, atol=1e-5)
    assert registry.select_variant("p1", v.id, expected=base).result(30) == v.id
    np.testing.assert_allclose(affine(registry, "p1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)
    # the registration's package still serves the next candidate (it is retained until retirement)
    again = stage(registry, write(tmp_path, "base.loom", BASE_TEXT), name="p1", base=v.id)
    assert again.phase == "ready"


def test_upload_combines_members_with_absolute_server_providers(registry, m1, tmp_path):
    """"Explicit absolute source paths still name server-local providers": the commands are a
    package member, the kernels an existing server file it `use`s by absolute path."""
    kernels = write(tmp_path, "kernels.loom", KERNELS)
    model = "\n".join([f'use "{MINI / "control.loom"}" {{ dim }}', f'use "{MINI / "prepare.loom"}" {{ w, b }}',
                       f'use "{kernels}" {{ add_bias, running_sum }}', "",
                       "state acc: f32[dim] per row", "", COMMANDS])
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=["model.loom"],
                               package=PackageFiles({"c/model.loom": model.encode()}), origin="c/request.json")
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "ready", v.error and v.error.message
    w, b = weights(tmp_path)
    registry.select_variant("m1", v.id, expected=base).result(30)
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)


def test_package_use_escaping_the_root_fails(registry, m1, tmp_path):
    write(tmp_path, "x.loom", KERNELS)  # exists on the server: it still must not be reached
    first, rest = TWICE_TEXT.replace(KERNELS, "").split("\n", 1)
    model = f'{first}\nuse "../../x.loom" {{ add_bias, running_sum }}\n{rest}'
    package = PackageFiles({"cand/model.loom": model.encode()})
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=["model.loom"], package=package, origin="cand/request.json")
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "failed" and v.error.code == "compile_error"
    diagnostics = registry.variant("m1", v.id)["diagnostics"]
    assert any(re.match(r"cand/model\.loom:2:\d+: error\[L0203\]: \"\.\./\.\./x\.loom\" escapes", d)
               for d in diagnostics), diagnostics
    assert registry.list_variants("m1")["selected"] == base


def test_package_missing_use_does_not_fall_back_to_server_files(registry, m1, tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    write(lib, "kernels.loom", KERNELS)  # a server file where the member would be: never read
    model = "\n".join([f'use "{MINI / "control.loom"}" {{ dim }}', f'use "{MINI / "prepare.loom"}" {{ w, b }}',
                       'use "../lib/kernels.loom" { add_bias, running_sum }', "",
                       "state acc: f32[dim] per row", "", COMMANDS])
    package = PackageFiles({"cand/model.loom": model.encode()})
    base = registry.list_variants("m1")["selected"]
    v = registry.stage_variant("m1", base=base, sources=["model.loom"], package=package,
                               origin="cand/request.json", base_directory=str(tmp_path))
    registry.wait_variant("m1", v, timeout=TIMEOUT)
    assert v.phase == "failed"
    assert "cannot find module \"../lib/kernels.loom\"" in v.error.message


def test_package_missing_member_rejects_at_staging(registry, m1):
    package = PackageFiles({"cand/model.loom": TWICE_TEXT.encode()})
    base = registry.list_variants("m1")["selected"]
    with pytest.raises(InvalidRequest) as exc:
        registry.stage_variant("m1", base=base, sources=["other.loom"], package=package, origin="cand/request.json")
    assert "cand/other.loom" in exc.value.message
    with pytest.raises(InvalidRequest):
        registry.stage_variant("m1", base=base, sources=["../../model.loom"], package=package,
                               origin="cand/request.json")
    assert registry.list_variants("m1")["count"] == 1


# ---- 11. registration state ------------------------------------------------------------------------


def test_staging_needs_a_prepared_registration(registry, tmp_path):
    path = write(tmp_path, "twice.loom", TWICE_TEXT)
    with pytest.raises(NotFound):
        registry.stage_variant("nope", base=1, sources=[str(path)])
    with pytest.raises(NotFound):
        registry.list_variants("nope")

    (tmp_path / "d").mkdir()
    reg = registry.register(mini_document(tmp_path / "d", model="m1", admission="drained"))
    assert registry.wait_for(lambda: reg.phase in ("deferred", "failed"), TIMEOUT)
    assert reg.phase == "deferred"
    initial = reg.variants.selected
    assert initial is not None
    for call in (lambda: registry.stage_variant("m1", base=initial, sources=[str(path)]),
                 lambda: registry.list_variants("m1"),
                 lambda: registry.select_variant("m1", initial, expected=initial)):
        with pytest.raises(Conflict) as exc:
            call()
        assert "deferred" in exc.value.message


def test_drained_admission_of_a_prepared_model_is_permitted(registry, m1, tmp_path):
    w, b = weights(tmp_path)
    registry.drain("m1")
    base = registry.list_variants("m1")["selected"]
    v = stage(registry, write(tmp_path, "twice.loom", TWICE_TEXT))
    assert v.phase == "ready"
    assert registry.select_variant("m1", v.id, expected=base).result(30) == v.id
    registry.undrain("m1")
    np.testing.assert_allclose(affine(registry, "m1"), X @ w.T + 2 * b, rtol=1e-5, atol=1e-5)
