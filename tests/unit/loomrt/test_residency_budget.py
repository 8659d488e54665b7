"""loomrt/residency.py through loomrt/registry.py: params residency against a device budget on the
real `mini` package: LRU eviction of idle unpinned components, pinning, reload on use (prepare runs
once per activation), DeviceMemoryExhausted when nothing can go, trim, activate/deactivate.

The budget is derived from what one `mini` registration is charged (measured once, below), so
it fits two models' params but not three, whatever the exact byte counts. The models here are
`mini` widened to WIDE features: a served step's scratch (the `matmul` motif packs its input
in panels of 16 rows) must stay well below one model's params for "two but not three" to be
a budget at all."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from safetensors.numpy import load_file

from loomrt.devices import CATEGORIES, Devices
from loomrt.errors import (CheckpointError, Conflict, DeviceMemoryExhausted, InvalidRequest, NotFound,
                           Unavailable)
from loomrt.registry import Registry
from loomrt.services.base import Job, Step
from mini_package import DIM, mini_document, mini_image_document, mini_weights

TIMEOUT = 60
WIDE = 64  # features of the residency tests' models (config override of mini's dim)


def wide_document(directory, **fields) -> str:
    return mini_document(directory, config={"dim": WIDE}, **fields)


@pytest.fixture(scope="module")
def footprint(tmp_path_factory, loom_cache_dir):
    """Bytes one freshly registered wide `mini` is charged on the cpu ({"params": ..., "state": ...}),
    and the scratch its first served step adds ("scratch")."""
    registry = Registry(Devices(cuda={}))
    directory = tmp_path_factory.mktemp("probe")
    checkpoint, _, _ = mini_weights(directory, name="probe.safetensors", dim=WIDE)
    try:
        reg = registry.register(wide_document(directory, model="probe", checkpoint=str(checkpoint)))
        assert registry.wait_for(lambda: reg.phase == "ready", TIMEOUT), (reg.phase, reg.error)
        owned = dict(registry.devices.accounting("cpu")[0]["owners"]["probe/primary"])
        x = np.zeros((2, WIDE), np.float32)
        registry.submit("probe", Job([Step("affine", {"x": x})])).result(TIMEOUT)
        scratch = registry.devices.accounting("cpu")[0]["owners"]["probe/primary"]["scratch"]
    finally:
        registry.close(timeout=TIMEOUT)
    assert owned == {"params": 4 * (WIDE * WIDE + WIDE), "state": 2 * WIDE * 4}   # the mini's w, b and acc
    return {**owned, "scratch": scratch}


@pytest.fixture
def budget(footprint):
    """Room for every model's state, two models' params and a served step's scratch, not a
    third model's params."""
    params, state, scratch = footprint["params"], footprint["state"], footprint["scratch"]
    n = 3 * state + 2 * params + params // 2
    assert 2 * (params + state) + params > n >= 3 * state + 2 * params + scratch
    return n


def make_registry(request, budgets=None) -> Registry:
    registry = Registry(Devices(budgets, cuda={}))
    request.addfinalizer(lambda: registry.close(timeout=TIMEOUT))
    return registry


@pytest.fixture
def registry(request, budget):
    return make_registry(request, {"cpu": budget})


@pytest.fixture
def unbudgeted(request):
    return make_registry(request)


class Model:
    """One registration of `mini` with its own weights (seeded by its name), and how to check it."""

    def __init__(self, registry, tmp_path, name, **fields):
        self.registry, self.name = registry, name
        directory = tmp_path / name
        directory.mkdir()
        checkpoint, self.w, self.b = mini_weights(directory, seed=sum(map(ord, name)), name=f"{name}.safetensors",
                                                  dim=WIDE)
        self.reg = registry.register(wide_document(directory, model=name, checkpoint=str(checkpoint), **fields))
        assert registry.wait_for(lambda: self.reg.phase in ("ready", "failed"), TIMEOUT), self.reg.phase

    @property
    def component(self):
        return self.reg.components["primary"]

    def status(self):
        [found] = [r for r in self.registry.status()["registrations"] if r["model"] == self.name]
        [component] = found["components"]
        return component

    def submit(self, seed=0, on_step=None, steps=1):
        xs = [np.random.default_rng(seed + i).standard_normal((2, WIDE)).astype(np.float32) for i in range(steps)]
        future = self.registry.submit(self.name, Job([Step("affine", {"x": x}) for x in xs], on_step=on_step))
        return future, xs

    def serves(self, seed=0):
        future, [x] = self.submit(seed)
        [out] = future.result(TIMEOUT)
        np.testing.assert_allclose(out["y"], x @ self.w.T + self.b, rtol=1e-5, atol=1e-5)


def ready_models(registry, tmp_path, *names):
    models = [Model(registry, tmp_path, name) for name in names]   # one at a time: a deterministic LRU order
    for m in models:
        assert m.reg.phase == "ready", m.reg.error
    return models


def cpu(registry):
    [accounting] = registry.devices.accounting("cpu")
    return accounting


def resident(*models):
    return [m.component.resident for m in models]


# ---- 11. eviction and reload ----------------------------------------------------------------------


def test_third_load_evicts_the_lru_idle_unpinned_component_and_it_reloads_on_use(registry, tmp_path, footprint,
                                                                                  budget):
    params = footprint["params"]
    a, b = ready_models(registry, tmp_path, "a", "b")
    assert resident(a, b) == [True, True] and cpu(registry)["categories"]["params"] == 2 * params

    c, = ready_models(registry, tmp_path, "c")                   # a is the least recently used
    assert resident(a, b, c) == [False, True, True]
    assert a.status()["resident"] is False and a.status()["bytes"] == 0
    accounting = cpu(registry)
    assert accounting["budget_bytes"] == budget and accounting["used_bytes"] <= budget
    assert accounting["categories"]["params"] == 2 * params
    assert "params" not in accounting["owners"]["a/primary"]     # its state stays: only params are evicted
    assert accounting["owners"]["a/primary"]["state"] == footprint["state"]
    assert a.reg.phase == "ready" and a.reg in registry.models()  # evicted, still listed

    registry.pin("b")                                            # b is now the LRU, but pinned
    a.serves(seed=1)                                             # reloads a: evicts c, not b
    assert resident(a, b, c) == [True, True, False]
    assert a.status()["activations"] == 2 and a.component.loads == 2
    assert b.component.loads == 1 and b.status()["pinned"] is True
    a.serves(seed=2)                                             # resident: prepare does not run again
    assert a.component.loads == 2
    c.serves(seed=3)                                             # c reloads in turn, evicting a (b pinned)
    assert resident(a, b, c) == [False, True, True] and c.component.loads == 2
    b.serves(seed=4)
    assert b.component.loads == 1


# ---- 12. nothing to evict -------------------------------------------------------------------------


def test_registration_fails_with_device_memory_exhausted_when_everything_is_pinned(registry, tmp_path, footprint,
                                                                                    budget):
    params, state = footprint["params"], footprint["state"]
    a, b = ready_models(registry, tmp_path, "a", "b")
    registry.pin("a")
    registry.pin("b")
    c = Model(registry, tmp_path, "c")
    assert c.reg.phase == "failed"
    error = c.reg.error
    assert isinstance(error, DeviceMemoryExhausted) and isinstance(error, Unavailable)
    assert error.status == 503 and error.code == "device_memory_exhausted"
    would_use = 2 * (params + state) + params
    assert f"c/primary needs {params} bytes of params on cpu" in error.message
    assert f"{would_use} bytes would be in use against a budget of {budget}" in error.message
    assert c.status()["resident"] is False
    [entry] = [r for r in registry.status()["registrations"] if r["model"] == "c"]
    assert entry["error"] == {"code": "device_memory_exhausted", "message": error.message, "status": 503}
    assert "c/primary" not in cpu(registry)["owners"]            # the failed load was undone
    assert resident(a, b) == [True, True]
    a.serves(seed=5)
    b.serves(seed=6)


def test_reload_fails_the_job_with_device_memory_exhausted_when_everything_else_is_pinned(
        registry, tmp_path, footprint, budget):
    params, state = footprint["params"], footprint["state"]
    a, b, c = ready_models(registry, tmp_path, "a", "b", "c")
    assert resident(a, b, c) == [False, True, True]
    registry.pin("b")
    registry.pin("c")
    future, _ = a.submit(seed=7)
    with pytest.raises(DeviceMemoryExhausted) as caught:
        future.result(TIMEOUT)
    assert caught.value.status == 503
    assert f"a/primary needs {params} bytes" in caught.value.message
    assert f"{3 * state + 3 * params} bytes would be in use against a budget of {budget}" in caught.value.message
    assert resident(a, b, c) == [False, True, True]
    assert cpu(registry)["categories"]["params"] == 2 * params
    assert a.reg.phase == "ready"                                # a failed job, not a failed registration

    registry.unpin("c")                                          # room again: a reloads, c goes
    a.serves(seed=8)
    assert resident(a, b, c) == [True, True, False]


# ---- 13. trim ---------------------------------------------------------------------------------------


def test_trim_evicts_idle_unpinned_components_and_returns_the_accounting(unbudgeted, tmp_path, footprint):
    registry = unbudgeted
    params, state = footprint["params"], footprint["state"]
    a, b, c = ready_models(registry, tmp_path, "a", "b", "c")
    registry.pin("b")
    reached, release = threading.Event(), threading.Event()

    def hold(index, outputs):
        if index == 0:
            reached.set()
            release.wait(TIMEOUT)

    held, xs = c.submit(seed=9, on_step=hold, steps=2)           # c's params are in use while it is held
    try:
        assert reached.wait(TIMEOUT)
        out = registry.trim("cpu", 0)
    finally:
        release.set()
    assert resident(a, b, c) == [False, True, True]              # pinned b and busy c survive
    assert isinstance(out, list) and len(out) == 1
    [accounting] = out
    assert accounting["device"] == "cpu" and accounting["name"] == "cpu"
    assert set(accounting["categories"]) == set(CATEGORIES)
    assert accounting["categories"]["params"] == 2 * params
    assert accounting["categories"]["state"] == 3 * state
    assert accounting["used_bytes"] == sum(accounting["categories"].values())
    assert set(accounting["owners"]) == {"a/primary", "b/primary", "c/primary"}
    assert accounting["owners"]["a/primary"] == {"state": state}
    assert accounting["owners"]["b/primary"]["params"] == params

    for out_step, x in zip(held.result(TIMEOUT), xs):
        np.testing.assert_allclose(out_step["y"], x @ c.w.T + c.b, rtol=1e-5, atol=1e-5)
    [accounting] = registry.trim("cpu", 0)                       # c is idle now
    assert resident(a, b, c) == [False, True, False]
    assert accounting["categories"]["params"] == params and set(accounting["owners"]["b/primary"]) >= {"params"}

    before = cpu(registry)["used_bytes"]
    registry.trim("cpu", before)                                 # already within the target: nothing goes
    assert resident(a, b, c) == [False, True, False]
    a.serves(seed=10)                                            # trimmed models reload on use
    assert a.component.loads == 2 and c.component.loads == 1

    for bad in (-1, "0", 1.5, True, None):
        with pytest.raises(InvalidRequest) as caught:
            registry.trim("cpu", bad)
        assert caught.value.status == 400 and caught.value.param == "target_bytes"
    for device in ("gpu", -1, None, True):
        with pytest.raises(InvalidRequest) as caught:
            registry.trim(device, 0)
        assert caught.value.param == "device"
    for device in (3, "3"):
        with pytest.raises(NotFound) as caught:
            registry.trim(device, 0)
        assert caught.value.status == 404 and "device 3 is not available" in caught.value.message
    assert resident(a, b) == [True, True]


# ---- 14. activate / deactivate / pin ------------------------------------------------------------------


def test_activate_and_deactivate_need_a_drained_healthy_registration(unbudgeted, tmp_path, footprint):
    registry = unbudgeted
    params = footprint["params"]
    m, = ready_models(registry, tmp_path, "m")
    for op in (registry.activate, registry.deactivate):
        with pytest.raises(Conflict) as caught:
            op("m")
        assert caught.value.status == 409 and "drain it" in caught.value.message
    with pytest.raises(NotFound):
        registry.activate("nobody")

    registry.drain("m")
    before = cpu(registry)
    registry.deactivate("m").result(TIMEOUT)
    after = cpu(registry)
    assert m.status()["resident"] is False and m.component.params is None
    assert after["used_bytes"] == before["used_bytes"] - params
    assert after["categories"]["params"] == before["categories"]["params"] - params
    assert [e["event"] for e in registry.events if e["model"] == "m"][-1] == "deactivated"

    registry.activate("m").result(TIMEOUT)
    assert m.status()["resident"] is True and m.status()["activations"] == 2
    assert cpu(registry)["used_bytes"] == before["used_bytes"]
    registry.activate("m").result(TIMEOUT)                      # already resident: prepare does not run
    assert m.component.loads == 2

    registry.deactivate("m").result(TIMEOUT)
    registry.undrain("m")
    m.serves(seed=11)                                            # a deactivated component reloads on use
    assert m.component.loads == 3 and m.status()["resident"] is True


def test_component_names_are_validated_and_pin_toggles(unbudgeted, tmp_path):
    registry = unbudgeted
    m, = ready_models(registry, tmp_path, "m")
    registry.drain("m")
    for op in (registry.activate, registry.deactivate, registry.pin):
        with pytest.raises(NotFound) as caught:
            op("m", "image")
        assert caught.value.status == 404 and "declares no component 'image'" in caught.value.message
        for bad in (7, "", None, "Primary"):
            with pytest.raises(InvalidRequest) as caught:
                op("m", bad)
            assert caught.value.status == 400 and caught.value.param == "component"

    assert m.status()["pinned"] is False
    registry.pin("m")
    assert m.status()["pinned"] is True and m.component.pinned
    registry.pin("m", "primary")                                 # idempotent
    assert m.status()["pinned"] is True
    registry.unpin("m")
    assert m.status()["pinned"] is False
    assert [e["event"] for e in registry.events if e["model"] == "m"][-3:] == ["pinned", "pinned", "unpinned"]


def test_residency_operations_refuse_a_failed_registration(unbudgeted, tmp_path):
    registry = unbudgeted
    reg = registry.register(mini_document(tmp_path, model="f", checkpoint=str(tmp_path / "absent.safetensors")))
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT)
    assert reg.phase == "failed" and isinstance(reg.error, CheckpointError)
    assert "absent.safetensors" in reg.error.message
    registry.drain("f")
    for op in (registry.activate, registry.deactivate):
        with pytest.raises(Conflict) as caught:
            op("f")
        assert "failed" in caught.value.message and "healthy" in caught.value.message


def test_a_declared_image_component_activates_deactivates_and_pins_on_its_own(unbudgeted, tmp_path):
    """`image` is its own resident unit: its own prepare program and checkpoint, its own ledger
    owner (`model/image`), pinned, trimmed and (de)activated independently of `primary`."""
    registry = unbudgeted
    document, scale = mini_image_document(tmp_path, model="v", admission="drained")
    reg = registry.register(document)
    assert registry.wait_for(lambda: reg.phase in ("deferred", "failed"), TIMEOUT), reg.phase
    assert reg.phase == "deferred", reg.error
    primary, image = reg.components["primary"], reg.components["image"]

    def described():
        [found] = [r for r in registry.status()["registrations"] if r["model"] == "v"]
        return {c["component"]: c for c in found["components"]}

    assert list(described()) == ["primary", "image"]
    assert [c["resident"] for c in described().values()] == [False, False]

    registry.activate("v", "image").result(TIMEOUT)
    assert image.resident and image.loads == 1 and image.nbytes == scale.nbytes
    np.testing.assert_array_equal(image.params["v"], scale)     # prepared from its own checkpoint
    assert reg.phase == "deferred" and not primary.resident      # the primary is not prepared with it
    assert described()["image"] == {"component": "image", "device": "cpu", "resident": True, "pinned": False,
                                    "bytes": scale.nbytes, "in_use": False, "activations": 1}
    owners = cpu(registry)["owners"]
    assert owners["v/image"] == {"params": scale.nbytes} and "v/primary" not in owners

    registry.pin("v", "image")
    assert described()["image"]["pinned"] is True and described()["primary"]["pinned"] is False
    registry.trim("cpu", 0)
    assert image.resident                                        # pinned: trim leaves it
    registry.unpin("v", "image")
    [accounting] = registry.trim("cpu", 0)
    assert not image.resident and "v/image" not in accounting["owners"]
    assert [(e["event"], e["component"]) for e in registry.events
            if e["model"] == "v" and "component" in e] == [("activated", "image"), ("pinned", "image"),
                                                            ("unpinned", "image")]

    registry.activate("v", "image").result(TIMEOUT)              # once per activation
    assert image.resident and image.loads == 2
    registry.deactivate("v", "image").result(TIMEOUT)
    assert not image.resident and image.loads == 2 and "v/image" not in cpu(registry)["owners"]
    assert [e["event"] for e in registry.events if e["model"] == "v"][-1] == "deactivated"

    registry.activate("v").result(TIMEOUT)                       # the primary prepares its service
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT)
    assert reg.phase == "ready" and primary.resident and primary.loads == 1 and not image.resident
    registry.undrain("v")
    with pytest.raises(Conflict, match="drain it"):              # the drained precondition holds for image too
        registry.activate("v", "image")
    weights = load_file(str(tmp_path / "mini.safetensors"))     # what mini_document wrote for the primary
    w, b = weights["proj.weight"], weights["proj.bias"]
    x = np.random.default_rng(12).standard_normal((2, DIM)).astype(np.float32)
    [out] = registry.submit("v", Job([Step("affine", {"x": x})])).result(TIMEOUT)
    np.testing.assert_allclose(out["y"], x @ w.T + b, rtol=1e-5, atol=1e-5)
