"""loomrt/registry.py and loomrt/services/base.py: a registration's lifecycle on the real `mini`
package (tests/unit/loomrt/fixtures/mini): phases and events, failures kept on the registration,
admission (drained / open), removal by drain and by abort, the bounded queue, retained per-row
state, and step failures confined to their job.

Jobs are held "in flight" deterministically with `Gate`: its `on_step` callback runs on the
service's worker after a job's first step, signals `reached`, and blocks until the test sets
`release`. A registration is held in a phase the same way by `PhaseGate`, a registry listener
that blocks the worker emitting that phase's event. Nothing here sleeps to wait for state."""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from loomrt.devices import Devices
from loomc.run.compile import compile_kernels
from loomrt.errors import (CompileError, Conflict, Gone, InvalidRequest, LoomError, NotFound, NotImplementedFeature,
                           PrepareError, QueueFull, StageInputError, Unavailable, run_errors)
from loomrt.registry import Registry
from loomrt.services.base import Job, Step
from mini_package import DIM, MINI, mini_document, mini_weights

TIMEOUT = 60


@pytest.fixture
def registry():
    reg = Registry(Devices(cuda={}))
    yield reg
    reg.close(timeout=TIMEOUT)


class Gate:
    """An `on_step` that holds its job on the worker after the job's first step."""

    def __init__(self):
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, index, outputs):
        if index == 0:
            self.hold()

    def hold(self):
        """Signal `reached`, then block the calling (worker) thread until `release`."""
        self.reached.set()
        if not self.release.wait(TIMEOUT):
            raise RuntimeError(f"the test never released the {type(self).__name__}")


@pytest.fixture
def gates(registry):
    """Gates released at teardown (before the registry closes), so a failing test never hangs."""
    made: list[Gate] = []

    def make() -> Gate:
        made.append(Gate())
        return made[-1]

    yield make
    for gate in made:
        gate.release.set()


class PhaseGate(Gate):
    """A registry listener that holds the worker thread emitting `event` for `model` (the first
    time only): listeners run on the thread that changed the phase, after the change, so the
    registration stays in that phase, with its work not yet done, until the test sets `release`."""

    def __init__(self, model, event):
        super().__init__()
        self.model, self.event = model, event

    def __call__(self, record):
        if record["model"] == self.model and record["event"] == self.event and not self.reached.is_set():
            self.hold()


@pytest.fixture
def phase_gates(registry):
    """PhaseGates listening on the registry, released at teardown (before the registry closes)."""
    made: list[PhaseGate] = []

    def make(model, event) -> PhaseGate:
        made.append(PhaseGate(model, event))
        registry.listeners.append(made[-1])
        return made[-1]

    yield make
    for gate in made:
        gate.release.set()
        registry.listeners.remove(gate)


def ready(registry, reg):
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT), reg.phase
    assert reg.phase == "ready", reg.error
    return reg


def settled(registry, reg):
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed", "deferred"), TIMEOUT), reg.phase
    return reg


def register_ready(registry, tmp_path, model, **fields):
    return ready(registry, registry.register(mini_document(tmp_path, model=model, **fields)))


def weights(tmp_path):
    _, w, b = mini_weights(tmp_path)   # the same seed mini_document writes
    return w, b


def inputs(seed, rows=2):
    return np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)


def affine_job(*xs, on_step=None):
    return Job([Step("affine", {"x": x}) for x in xs], on_step=on_step)


def assert_affine(outputs, xs, w, b):
    assert len(outputs) == len(xs)
    for out, x in zip(outputs, xs):
        np.testing.assert_allclose(out["y"], x @ w.T + b, rtol=1e-5, atol=1e-5)


def entry(registry, name):
    found = [r for r in registry.status()["registrations"] if r["model"] == name]
    assert len(found) == 1
    return found[0]


def phases(registry, name):
    return [e["event"] for e in list(registry.events) if e["model"] == name]


# ---- 1. the happy path ------------------------------------------------------------------------


def test_registration_goes_registering_compiling_preparing_ready(registry, tmp_path):
    reg = registry.register(mini_document(tmp_path, model="m1"))
    assert reg.phase in ("registering", "compiling", "preparing", "ready")   # register() returns at once
    ready(registry, reg)
    assert phases(registry, "m1") == ["registering", "compiling", "preparing", "ready"]

    status = entry(registry, "m1")
    assert status["phase"] == "ready" and status["admission"] == "open" and status["removing"] is None
    assert status["error"] is None and status["kind"] == "sequence" and status["device"] == "cpu"
    # progress: the two stages' kernels (add_bias, running_sum) and the matmul motif compiled
    # ahead of the first request; both params (w, b) prepared
    assert status["progress"] == {"stages": 2, "kernels": {"compiled": 3, "total": 3},
                                  "weights": {"component": "primary", "prepared": 2, "total": 2}}
    [component] = status["components"]
    assert component["component"] == "primary" and component["resident"] is True
    assert component["pinned"] is False and component["activations"] == 1
    assert component["bytes"] == 4 * (DIM * DIM + DIM)        # proj.weight + proj.bias, f32
    assert status["variants"]["count"] == 1 and isinstance(status["variants"]["selected"], int)
    assert status["scheduler"] == {"pending": 0, "active": 0, "steps": 0}
    assert status["state_bytes"] == 2 * DIM * 4                  # acc: f32[dim] per row, rows=2
    assert registry.models() == [reg]

    w, b = weights(tmp_path)
    x = inputs(1)
    assert_affine(registry.submit("m1", affine_job(x)).result(TIMEOUT), [x], w, b)


# ---- 2. failures ------------------------------------------------------------------------------


def failed(registry, reg):
    assert registry.wait_for(lambda: reg.phase in ("ready", "failed"), TIMEOUT), reg.phase
    assert reg.phase == "failed"
    assert registry.models() == []
    status = entry(registry, reg.name)
    assert status["phase"] == "failed"
    assert status["error"] == {"code": reg.error.code, "message": reg.error.message, "status": reg.error.status}
    assert phases(registry, reg.name)[-1] == "failed"
    with pytest.raises(Unavailable, match="failed to load"):
        registry.submit(reg.name, affine_job(inputs(0)))
    return reg.error


def test_missing_tensor_fails_the_registration_and_keeps_the_error(registry, tmp_path):
    w, _ = weights(tmp_path)
    save_file({"proj.weight": w}, str(tmp_path / "nobias.safetensors"))
    reg = registry.register(mini_document(tmp_path, model="nobias",
                                          checkpoint=str(tmp_path / "nobias.safetensors")))
    error = failed(registry, reg)
    assert isinstance(error, PrepareError) and error.status == 500 and error.code == "prepare_error"
    assert error.param == "b"
    assert "param 'b'" in error.message and "'proj.bias'" in error.message
    assert "nobias.safetensors" in error.message


def test_wrong_shape_tensor_fails_the_registration_naming_tensor_and_shape(registry, tmp_path):
    w, b = weights(tmp_path)
    save_file({"proj.weight": np.zeros((DIM, DIM + 1), np.float32), "proj.bias": b},
              str(tmp_path / "wide.safetensors"))
    reg = registry.register(mini_document(tmp_path, model="wide", checkpoint=str(tmp_path / "wide.safetensors")))
    error = failed(registry, reg)
    assert isinstance(error, PrepareError) and error.param == "w"
    assert "proj.weight" in error.message
    assert f"f32[{DIM}, {DIM}]" in error.message and f"[{DIM}, {DIM + 1}]" in error.message


def test_source_compile_error_fails_the_registration_with_its_position(registry, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(MINI, broken)
    source = (broken / "model.loom").read_text()
    assert "add_bias(y, b)" in source
    source = source.replace("add_bias(y, b)", "add_bias(y, no_such_bias)")
    (broken / "model.loom").write_text(source)
    line_no = next(i for i, line in enumerate(source.splitlines(), 1) if "no_such_bias" in line)
    column = source.splitlines()[line_no - 1].index("no_such_bias") + 1

    reg = registry.register(mini_document(tmp_path, model="broken", control=str(broken / "control.loom"),
                                          prepare=str(broken / "prepare.loom"),
                                          sources=[str(broken / "model.loom")]))
    error = failed(registry, reg)
    assert isinstance(error, CompileError) and error.status == 422 and error.code == "compile_error"
    assert f"model.loom:{line_no}:{column}" in error.message
    assert "no_such_bias" in error.message
    assert phases(registry, "broken") == ["registering", "compiling", "failed"]


@pytest.mark.parametrize("mode", ["drain", "abort"])
def test_an_unknown_device_fails_the_registration_while_registering(registry, tmp_path, mode):
    reg = registry.register(mini_document(tmp_path, model="far", device=3))   # this registry has only the cpu
    error = failed(registry, reg)
    assert isinstance(error, NotFound) and error.status == 404 and error.param == "device"
    assert "device 3 is not available (this server has: cpu;" in error.message
    assert phases(registry, "far") == ["registering", "failed"]        # it never got to compile
    assert reg.executables is None and reg.components == {}

    # unregistering a failed registration frees its name (nothing was accepted, so either mode)
    assert registry.unregister("far", mode).result(TIMEOUT) == "far"
    assert phases(registry, "far")[-2:] == ["removing", "removed"]
    with pytest.raises(NotFound):
        registry.get("far")
    again = register_ready(registry, tmp_path, "far")                  # the same name, on the cpu
    w, b = weights(tmp_path)
    x = inputs(3)
    assert_affine(registry.submit("far", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert again.error is None and entry(registry, "far")["error"] is None


def test_a_compile_failure_is_unregistered_and_the_name_registers_again(registry, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(MINI, broken)
    (broken / "model.loom").write_text((MINI / "model.loom").read_text().replace("add_bias(y, b)",
                                                                                 "add_bias(y, nothing)"))
    reg = registry.register(mini_document(tmp_path, model="m", sources=[str(broken / "model.loom")]))
    assert isinstance(failed(registry, reg), CompileError)
    assert registry.unregister("m", "abort").result(TIMEOUT) == "m"
    assert phases(registry, "m") == ["registering", "compiling", "failed", "removing", "removed"]
    register_ready(registry, tmp_path, "m")
    w, b = weights(tmp_path)
    x = inputs(4)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)


def test_cuda_target_is_not_implemented_by_the_command_compiler():
    """No GPU needed: the refusal comes from compiling, before anything would launch."""
    with pytest.raises(NotImplementedFeature) as caught, run_errors():
        compile_kernels({}, "cuda")
    assert caught.value.status == 501 and caught.value.code == "not_implemented"
    assert "target 'cuda' is not built yet" in caught.value.message
    assert "command programs" in caught.value.message and "'cpu'" in caught.value.message
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        compile_kernels({}, "tpu")
    assert compile_kernels({}, "cpu") == {}


def test_a_registration_on_a_cuda_device_fails_naming_what_is_not_built(tmp_path):
    """A listed CUDA ordinal (as CuPy would report it; no GPU is touched): compiling for its
    target fails the registration with 501 not_implemented, kept on the registration."""
    registry = Registry(Devices(cuda={0: 1 << 30}))
    try:
        reg = registry.register(mini_document(tmp_path, model="g", device=0))
        error = failed(registry, reg)
        assert isinstance(error, NotImplementedFeature) and error.status == 501
        assert error.code == "not_implemented" and error.param == "device"
        assert error.message.startswith("model 'g' cannot run on cuda:0: target 'cuda' is not built yet")
        assert phases(registry, "g") == ["registering", "compiling", "failed"]
        assert "g/primary" not in registry.devices.accounting(0)[0]["owners"]
    finally:
        registry.close(timeout=TIMEOUT)


@pytest.mark.parametrize("fields, fragment, param", [
    ({"rowz": 2}, "unknown field 'rowz' (did you mean 'rows'?)", "rowz"),
    ({"rows": "2"}, 'rows: expected integer, got "2"', "rows"),
])
def test_bad_document_field_raises_synchronously(registry, tmp_path, fields, fragment, param):
    with pytest.raises(InvalidRequest) as caught:
        registry.register(mini_document(tmp_path, model="bad", **fields))
    assert caught.value.status == 400 and fragment in caught.value.message and caught.value.param == param
    assert registry.registrations() == [] and list(registry.events) == []
    with pytest.raises(NotFound):
        registry.get("bad")


# ---- 3, 4. admission ------------------------------------------------------------------------------


def test_drained_registration_defers_preparation_until_undrain(registry, tmp_path):
    reg = settled(registry, registry.register(mini_document(tmp_path, model="d", admission="drained")))
    assert reg.phase == "deferred" and reg.admission == "drained"
    status = entry(registry, "d")
    assert [c["resident"] for c in status["components"]] == [False]
    assert status["components"][0]["activations"] == 0
    assert registry.devices.accounting("cpu")[0]["owners"].get("d/primary") is None   # nothing loaded
    assert registry.models() == []
    with pytest.raises(Unavailable) as caught:
        registry.submit("d", affine_job(inputs(0)))
    assert caught.value.status == 503 and "drained" in caught.value.message

    registry.undrain("d")
    ready(registry, reg)
    assert phases(registry, "d") == ["registering", "compiling", "deferred", "open", "preparing", "ready"]
    w, b = weights(tmp_path)
    x = inputs(2)
    assert_affine(registry.submit("d", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert reg.components["primary"].loads == 1


def test_activate_prepares_a_deferred_registration_but_keeps_it_drained(registry, tmp_path):
    reg = settled(registry, registry.register(mini_document(tmp_path, model="d", admission="drained")))
    assert reg.phase == "deferred"
    registry.activate("d", "primary").result(TIMEOUT)
    ready(registry, reg)
    assert reg.admission == "drained" and reg.components["primary"].resident
    assert entry(registry, "d")["admission"] == "drained"
    assert registry.models() == [reg]          # discovery lists drained deployments
    with pytest.raises(Unavailable, match="drained"):
        registry.submit("d", affine_job(inputs(0)))

    registry.undrain("d")
    w, b = weights(tmp_path)
    x = inputs(3)
    assert_affine(registry.submit("d", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert reg.components["primary"].loads == 1      # undrain of a ready model prepares nothing again


def test_drain_refuses_new_work_but_finishes_work_in_flight(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m")
    w, b = weights(tmp_path)
    gate = gates()
    xs = [inputs(10), inputs(11)]
    held = registry.submit("m", affine_job(*xs, on_step=gate))
    assert gate.reached.wait(TIMEOUT)

    registry.drain("m")
    with pytest.raises(Unavailable) as caught:
        registry.submit("m", affine_job(inputs(0)))
    assert caught.value.status == 503 and "drained" in caught.value.message
    assert not held.done()
    gate.release.set()
    assert_affine(held.result(TIMEOUT), xs, w, b)

    registry.undrain("m")
    x = inputs(12)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert phases(registry, "m")[-2:] == ["drained", "open"]


# ---- 5-7. removal -------------------------------------------------------------------------------


def test_unregister_drain_finishes_accepted_jobs_then_frees_the_name(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m")
    w, b = weights(tmp_path)
    gate = gates()
    xs1, xs2 = [inputs(20), inputs(21), inputs(22)], [inputs(23)]
    first = registry.submit("m", affine_job(*xs1, on_step=gate))
    assert gate.reached.wait(TIMEOUT)
    second = registry.submit("m", affine_job(*xs2))          # queued behind the held pass

    removed = registry.unregister("m", "drain")
    assert entry(registry, "m")["removing"] == "drain" and entry(registry, "m")["phase"] == "removing"
    assert registry.models() == []
    with pytest.raises(Unavailable) as caught:
        registry.submit("m", affine_job(inputs(0)))
    assert caught.value.status == 503 and "being removed" in caught.value.message
    assert not removed.done()

    gate.release.set()
    assert_affine(first.result(TIMEOUT), xs1, w, b)
    assert_affine(second.result(TIMEOUT), xs2, w, b)
    assert removed.result(TIMEOUT) == "m"
    with pytest.raises(NotFound):
        registry.get("m")
    assert [e for e in phases(registry, "m")][-2:] == ["removing", "removed"]
    assert "m/primary" not in registry.devices.accounting("cpu")[0]["owners"]

    again = register_ready(registry, tmp_path, "m")
    x = inputs(24)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert again.components["primary"].loads == 1


def test_unregister_abort_fails_jobs_at_the_next_step_boundary(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m")
    w, b = weights(tmp_path)
    gate = gates()
    held_job = affine_job(inputs(30), inputs(31), inputs(32), on_step=gate)
    held = registry.submit("m", held_job)
    assert gate.reached.wait(TIMEOUT)
    queued_job = affine_job(inputs(33))
    queued = registry.submit("m", queued_job)

    removed = registry.unregister("m", "abort")
    gate.release.set()
    for future in (held, queued):
        with pytest.raises(Gone) as caught:
            future.result(TIMEOUT)
        assert caught.value.status == 410 and "abort" in caught.value.message
    assert held_job.done_steps == 1 < len(held_job.steps)   # stopped at the boundary after its first step
    assert queued_job.done_steps == 0
    assert removed.result(TIMEOUT) == "m"

    register_ready(registry, tmp_path, "m")
    x = inputs(34)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)


def test_abort_applies_at_the_next_boundary_while_a_residency_task_is_pending(registry, tmp_path, gates):
    """Removal joins the registration's pending tasks before releasing it; the abort itself must
    not wait for them (here a deactivate that waits for the held step's params to go idle)."""
    reg = register_ready(registry, tmp_path, "m")
    gate = gates()
    job = affine_job(*[inputs(35 + i) for i in range(5)], on_step=gate)
    held = registry.submit("m", job)
    assert gate.reached.wait(TIMEOUT)
    registry.drain("m")
    deactivated = registry.deactivate("m")          # waits until the held pass releases the params
    removed = registry.unregister("m", "abort")
    gate.release.set()
    with pytest.raises(Gone):
        held.result(TIMEOUT)
    assert job.done_steps == 1
    deactivated.result(TIMEOUT)
    assert removed.result(TIMEOUT) == "m"
    assert not reg.components["primary"].resident


def test_abort_after_drain_upgrades_the_removal(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m")
    gate = gates()
    job = affine_job(inputs(40), inputs(41), inputs(42), on_step=gate)
    held = registry.submit("m", job)
    assert gate.reached.wait(TIMEOUT)

    removed = registry.unregister("m", "drain")
    assert registry.unregister("m", "drain") is removed          # repeating the same removal is a no-op
    with pytest.raises(Conflict) as caught:
        registry.register(mini_document(tmp_path, model="m"))
    assert caught.value.status == 409 and "being removed" in caught.value.message
    with pytest.raises(Conflict, match="being removed"):
        registry.drain("m")

    assert registry.unregister("m", "abort") is removed
    assert entry(registry, "m")["removing"] == "abort"
    gate.release.set()
    with pytest.raises(Gone):
        held.result(TIMEOUT)
    assert job.done_steps == 1
    assert removed.result(TIMEOUT) == "m"
    assert [e["mode"] for e in registry.events if e["model"] == "m" and e["event"] == "removing"] == \
        ["drain", "abort"]


@pytest.mark.parametrize("mode", ["drain", "abort"])
@pytest.mark.parametrize("held", ["compiling", "preparing"])
def test_unregister_while_compiling_or_preparing_removes_it_once_the_work_returns(registry, tmp_path, phase_gates,
                                                                                   held, mode):
    gate = phase_gates("m", held)
    document = mini_document(tmp_path, model="m")
    reg = registry.register(document)
    assert gate.reached.wait(TIMEOUT)
    assert reg.phase == held

    removed = registry.unregister("m", mode)
    status = entry(registry, "m")
    assert status["phase"] == "removing" and status["removing"] == mode
    assert registry.models() == []
    with pytest.raises(Unavailable, match="being removed"):
        registry.submit("m", affine_job(inputs(0)))
    with pytest.raises(Conflict, match="being removed"):
        registry.register(document)
    assert not removed.done()            # removal joins the held compile/prepare work first

    gate.release.set()
    assert removed.result(TIMEOUT) == "m"
    before = ["registering", "compiling"] + (["preparing"] if held == "preparing" else [])
    assert phases(registry, "m") == before + ["removing", "removed"]    # never ready, never failed
    assert reg.service is None and reg.error is None
    assert all(c.retired and not c.resident for c in reg.components.values())
    assert "m/primary" not in registry.devices.accounting("cpu")[0]["owners"]
    with pytest.raises(NotFound):
        registry.get("m")

    again = ready(registry, registry.register(document))
    w, b = weights(tmp_path)
    x = inputs(25)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert again.components["primary"].loads == 1


@pytest.mark.parametrize("mode", ["drain", "abort"])
def test_unregister_of_a_deferred_registration_frees_the_name(registry, tmp_path, mode):
    document = mini_document(tmp_path, model="d", admission="drained")
    reg = settled(registry, registry.register(document))
    assert reg.phase == "deferred"
    assert registry.unregister("d", mode).result(TIMEOUT) == "d"
    assert phases(registry, "d") == ["registering", "compiling", "deferred", "removing", "removed"]
    assert reg.components["primary"].loads == 0 and reg.components["primary"].retired
    assert "d/primary" not in registry.devices.accounting("cpu")[0]["owners"]
    with pytest.raises(NotFound):
        registry.get("d")

    again = settled(registry, registry.register(document))     # drained again: deferred again
    assert again.phase == "deferred" and again is not reg
    registry.undrain("d")
    ready(registry, again)
    w, b = weights(tmp_path)
    x = inputs(26)
    assert_affine(registry.submit("d", affine_job(x)).result(TIMEOUT), [x], w, b)


def test_unregister_rejects_unknown_names_and_modes(registry, tmp_path):
    with pytest.raises(NotFound) as caught:
        registry.unregister("nobody")
    assert caught.value.status == 404 and "'nobody' is not registered" in caught.value.message
    register_ready(registry, tmp_path, "m")
    with pytest.raises(InvalidRequest) as bad:
        registry.unregister("m", "later")
    assert bad.value.status == 400 and bad.value.param == "mode" and "'later'" in bad.value.message
    assert registry.get("m").removing is None and registry.get("m").phase == "ready"


# ---- 8-10. the service ----------------------------------------------------------------------------


def test_full_pending_queue_raises_queue_full(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m", pending_capacity=1, rows=1)
    w, b = weights(tmp_path)
    gate = gates()
    xs1, xs2 = [inputs(50), inputs(51)], [inputs(52)]
    first = registry.submit("m", affine_job(*xs1, on_step=gate))
    assert gate.reached.wait(TIMEOUT)                            # active now; the queue is empty
    second = registry.submit("m", affine_job(*xs2))              # fills the queue
    assert entry(registry, "m")["scheduler"]["pending"] == 1
    with pytest.raises(QueueFull) as caught:
        registry.submit("m", affine_job(inputs(53)))
    assert caught.value.status == 503 and caught.value.code == "queue_full"
    assert "pending queue is full (1 requests" in caught.value.message

    gate.release.set()
    assert_affine(first.result(TIMEOUT), xs1, w, b)
    assert_affine(second.result(TIMEOUT), xs2, w, b)
    x = inputs(54)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)


def test_pending_capacity_zero_admits_only_what_can_start_now(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m", pending_capacity=0, rows=2)
    w, b = weights(tmp_path)
    gate = gates()
    xs1, xs2 = [inputs(70), inputs(71)], [inputs(72)]
    first = registry.submit("m", affine_job(*xs1, on_step=gate))
    assert gate.reached.wait(TIMEOUT)                            # one row busy, one free
    second = registry.submit("m", affine_job(*xs2))              # starts at the next boundary
    with pytest.raises(QueueFull):
        registry.submit("m", affine_job(inputs(73)))             # both rows taken, no queue
    gate.release.set()
    assert_affine(first.result(TIMEOUT), xs1, w, b)
    assert_affine(second.result(TIMEOUT), xs2, w, b)


def test_per_row_state_is_retained_between_calls(registry, tmp_path):
    register_ready(registry, tmp_path, "m")
    rows = np.array([0, 1], np.int32)
    a, b = inputs(60), inputs(61)
    [first] = registry.submit("m", Job([Step("accumulate", {"x": a, "rows": rows})])).result(TIMEOUT)
    np.testing.assert_allclose(first["total"], a, rtol=1e-6)
    [second] = registry.submit("m", Job([Step("accumulate", {"x": b, "rows": rows})])).result(TIMEOUT)
    np.testing.assert_allclose(second["total"], a + b, rtol=1e-6)
    # rows are independent: adding to row 1 only leaves row 0's sum alone
    c = inputs(62, rows=1)
    [third] = registry.submit("m", Job([Step("accumulate", {"x": c, "rows": np.array([1], np.int32)})])).result(TIMEOUT)
    np.testing.assert_allclose(third["total"], (a + b)[1:] + c, rtol=1e-6)
    [fourth] = registry.submit("m", Job([Step("accumulate", {"x": np.zeros((2, DIM), np.float32),
                                                               "rows": rows})])).result(TIMEOUT)
    np.testing.assert_allclose(fourth["total"], np.stack([(a + b)[0], (a + b)[1] + c[0]]), rtol=1e-6)


def test_a_failing_step_fails_only_its_job(registry, tmp_path, gates):
    register_ready(registry, tmp_path, "m")
    w, b = weights(tmp_path)
    gate = gates()
    xs = [inputs(70), inputs(71)]
    good = registry.submit("m", affine_job(*xs, on_step=gate))
    assert gate.reached.wait(TIMEOUT)
    bad = registry.submit("m", affine_job(inputs(72).astype(np.float64)))   # runs in the same pass
    gate.release.set()
    with pytest.raises(StageInputError) as caught:
        bad.result(TIMEOUT)
    assert isinstance(caught.value, LoomError) and caught.value.status == 500
    assert "'x' is f32" in caught.value.message and "float64" in caught.value.message
    assert_affine(good.result(TIMEOUT), xs, w, b)

    with pytest.raises(NotFound, match="no stage 'nope'"):
        registry.submit("m", Job([Step("nope", {})]))
    x = inputs(73)
    assert_affine(registry.submit("m", affine_job(x)).result(TIMEOUT), [x], w, b)
    assert registry.get("m").phase == "ready"


def test_the_count_queue_holds_one_running_plus_pending_capacity(registry, tmp_path):
    """CPU utility requests (input-token counts) have their own bound per deployment: one
    running plus `pending_capacity` waiting; beyond it QueueFull (503); a released slot
    admits again."""
    reg = register_ready(registry, tmp_path, "m", pending_capacity=2)
    for _ in range(3):
        registry.admit_utility(reg)
    with pytest.raises(QueueFull) as caught:
        registry.admit_utility(reg)
    assert caught.value.status == 503 and caught.value.code == "queue_full"
    assert "count queue is full" in caught.value.message
    registry.release_utility(reg)
    registry.admit_utility(reg)
    with pytest.raises(QueueFull):
        registry.admit_utility(reg)
