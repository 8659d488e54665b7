"""Registrations and their lifecycle: the runtime's API between model documents and ready services.

    registering → compiling → preparing → ready          (admission "open")
    registering → compiling → deferred  → preparing → ready   (admission "drained": preparation
                                          waits for undrain or an explicit activate)
    any of them → failed (the error retained) ;  any → removing → gone (re-registrable)

Every call returns at once: compilation, weight preparation, residency operations and
removal run on worker threads, so an event loop calling this never blocks on them. Calls
that start work return a `concurrent.futures.Future` (await it with `asyncio.wrap_future`);
`wait_for` / `until` wait for any state with a deadline, woken by every change. Every
change is also an event (`events`, and the `listeners` callbacks) for logs and metrics.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from loomrt.checkpoints import open_checkpoints
from loomrt.compiler import Executables, code_path, compile_deployment
from loomrt.devices import Devices, parse_device_key
from loomrt.document import ModelDocument, parse_document, resolve_sources
from loomrt.errors import (CompileError, Conflict, Gone, InvalidRequest, LoomError, NotFound,
                           NotImplementedFeature, PrepareError, QueueFull, TooManyRequests, Unavailable,
                           internal_error)
from loomrt.media.image import ImageFormats
from loomrt.package import PackageFiles
from loomrt.prepare import prepare_params
from loomrt.residency import Component, Residency, param_arrays
from loomrt.services import kind_spec, serving_spec
from loomrt.services.base import Job, StageService
from loomrt.state import allocate_state, host_sizes, state_bytes
from loomrt.tokenizer import load_tokenizer, unpadded
from loomrt.variants import Variant, VariantTable, next_variant_id

log = logging.getLogger("loomrt.registry")
COMPONENT_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")   # whole string: fullmatch
MAX_EVENTS = 4096


class Registration:
    """One registered deployment. Fields change under the registry's lock only."""

    def __init__(self, document: ModelDocument, package: PackageFiles | None):
        self.document = document
        self.name = document.model
        self.package = package                     # retained until the model retires
        self.created = time.time()
        self.phase = "registering"
        self.admission = document.admission
        self.error: LoomError | None = None
        self.progress: dict[str, Any] = {}
        self.executables: Executables | None = None
        self.service: StageService | None = None
        self.components: dict[str, Component] = {}
        self.variants = VariantTable(document.variant_capacity) if document.variant_capacity else None
        self.removing: str | None = None
        self.removed: Future = Future()            # resolves when the name is free again
        self.withdrawn = Future()                  # set when unregister starts: waiting readers leave
        self.tasks: list[Future] = []              # compile, prepare and variant work in flight
        self.state_bytes = 0
        self.tokenizer: Any = None                 # loaded at compile time: no weights needed
        self.policy: Any = None                    # the kind's request policy (None when native-only)
        self.spec: Any = None                      # the kind's KindSpec (None when native-only)
        self.utility_in_flight = 0                 # input-token counts running (bounded by pending_capacity)
        self.utilities: dict[int, Utility] = {}    # CPU utility requests running (for /v1/requests)

    @property
    def prepared(self) -> bool:
        return self.phase == "ready"

    @property
    def native_only(self) -> bool:
        """No HTTP inference route serves it: its kind has no service yet, or its program lacks
        the kind's stage. It is served through the Python API only (spec: "native-only")."""
        return self.executables is not None and self.spec is None

    def declared_components(self) -> tuple[str, ...]:
        return ("primary", *self.document.components)

    def status(self) -> dict[str, Any]:
        doc = self.document
        out: dict[str, Any] = {
            "model": self.name, "kind": doc.kind, "phase": self.phase, "admission": self.admission,
            "removing": self.removing, "created": int(self.created), "device": doc.device,
            "progress": dict(self.progress), "error": None,
            "components": [c.describe() for c in self.components.values()],
        }
        if self.error is not None:
            out["error"] = {"code": self.error.code, "message": self.error.message, "status": self.error.status}
        if self.variants is not None and self.phase == "ready":
            out["variants"] = self.variants.summary()
        if self.service is not None:
            out["scheduler"] = self.service.counts()
            out["state_bytes"] = self.state_bytes
        return out


class Utility(Job):
    """A CPU utility request (an input-token count, tokenize, detokenize): no steps and no row,
    but a request all the same (spec: "Utility requests appear in request inspection and
    outcome counters"), listed by `/v1/requests` while it runs and reported by a `request`
    event when it ends. `counts` go into that event (never `prompt_tokens`: a utility
    increments no inference-token counter)."""

    def __init__(self, kind: str, route: str | None):
        super().__init__([], kind=kind)
        self.route = route
        self.counts: dict[str, Any] = {}

    def describe(self, state: str) -> dict[str, Any]:
        return {"id": self.id, "object": "request", "model": self.model, "kind": self.kind, "state": state,
                "created": round(self.created, 3), "utility": True}

    def outcome(self) -> dict[str, Any]:
        return dict(self.counts)


class Registry:
    """All registrations of one server process, their devices and their residency."""

    def __init__(self, devices: Devices | None = None, *, workers: int = 2, cache_dir: Path | None = None,
                 image_formats: ImageFormats | None = None):
        self.devices = devices or Devices()
        self.image_formats = image_formats or ImageFormats()   # what image-input deployments decode
        self.residency = Residency(self.devices)
        self.cache_dir = cache_dir
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loom-build")
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._regs: dict[str, Registration] = {}
        self._variant_owner: dict[int, str] = {}
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    # ---- observation -----------------------------------------------------------------------

    def _event(self, reg: Registration, event: str, phase: str | None = None, **fields: Any) -> None:
        """Record an event; with `phase`, the phase changes in the same critical section, so a
        waiter that sees the new phase also sees its event."""
        with self._changed:
            if phase is not None:
                reg.phase = phase
            record = {"time": time.time(), "event": event, "model": reg.name, "phase": reg.phase, **fields}
            self.events.append(record)
            self._changed.notify_all()
        self._publish(record)

    def _publish(self, record: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            try:
                listener(record)
            except Exception:  # pragma: no cover - a broken listener must not break the caller
                log.exception("a registry listener failed on %s", record.get("event"))

    def _request_outcome(self, reg: Registration, job: Job, error: LoomError | None) -> None:
        """One `request` event per finished request, whoever submitted it (loomd's routes or an
        application embedding loomrt): its id, kind, duration, counts and outcome."""
        record = {"time": time.time(), "event": "request", "model": reg.name, "kind": job.kind, "request": job.id,
                  "duration_ms": round(1000 * (time.time() - job.created), 1), **job.timings(), **job.outcome()}
        if job.route is not None:
            record["route"] = job.route
        if error is not None:
            record["error"] = {"code": error.code, "message": error.message, "status": error.status}
        self._publish(record)

    def _request_progress(self, reg: Registration, job: Job, event: str, fields: dict[str, Any]) -> None:
        """A milestone of a request in flight (a speech block computed, its first audio sent), in
        the same journal as its outcome, so the order of what happened can be read back."""
        self._publish({"time": time.time(), "event": event, "model": reg.name, "kind": job.kind, "request": job.id,
                       **fields})

    def _progress(self, reg: Registration, **fields: Any) -> None:
        """Update a registration's `progress` (kernels compiled, weights prepared): read by
        `/v1/status` and the start-up display; too frequent for the event journal."""
        with self._changed:
            reg.progress.update(fields)
            self._changed.notify_all()

    def _set_phase(self, reg: Registration, phase: str, **fields: Any) -> None:
        self._event(reg, phase, phase=phase, **fields)

    def get(self, name: Any) -> Registration:
        with self._lock:
            reg = self._regs.get(name) if isinstance(name, str) else None
        if reg is None:
            raise NotFound(f"model {name!r} is not registered", param="model")
        return reg

    def registrations(self) -> list[Registration]:
        with self._lock:
            return list(self._regs.values())

    def models(self) -> list[Registration]:
        """What discovery lists: prepared deployments not being removed (drained or evicted included)."""
        return [r for r in self.registrations() if r.prepared and r.removing is None]

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"registrations": [r.status() for r in self._regs.values()],
                    "devices": self.devices.accounting()}

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until `predicate()` holds (checked after every lifecycle change), or the deadline."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
            return True

    async def until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    # ---- registration ---------------------------------------------------------------------------

    def register(self, document: ModelDocument | str | bytes, *, package: PackageFiles | None = None,
                 origin: str = "request.json") -> Registration:
        """Validate the document and start compiling; returns at once (HTTP 202)."""
        doc = document if isinstance(document, ModelDocument) else parse_document(
            document, package=package, origin=origin)
        with self._lock:
            existing = self._regs.get(doc.model)
            if existing is not None:
                what = "is being removed" if existing.removing else "is already registered"
                raise Conflict(f"model '{doc.model}' {what}", param="model")
            reg = Registration(doc, package)
            self._regs[doc.model] = reg
        self._event(reg, "registering", kind=doc.kind)
        self._spawn(reg, self._build, reg)
        return reg

    def _spawn(self, reg: Registration, fn: Callable, *args: Any) -> Future:
        future = self._pool.submit(fn, *args)
        with self._lock:
            reg.tasks.append(future)
        future.add_done_callback(lambda f: self._task_done(reg, f))
        return future

    def _task_done(self, reg: Registration, future: Future) -> None:
        with self._changed:
            if future in reg.tasks:
                reg.tasks.remove(future)
            self._changed.notify_all()

    def _fail(self, reg: Registration, error: LoomError) -> None:
        with self._lock:
            reg.error = error
        self._set_phase(reg, "failed", code=error.code, message=error.message)

    def _build(self, reg: Registration) -> None:
        doc = reg.document
        try:
            device = self.devices.get(doc.device)
            if reg.removing:
                return
            self._set_phase(reg, "compiling")
            try:
                ex = compile_deployment(doc, reg.package, target=device.target, cache_dir=self.cache_dir,
                                        kernels_compiled=lambda done, total: self._progress(
                                            reg, kernels={"compiled": done, "total": total}))
            except NotImplementedFeature as exc:   # the device's target has no runnable back end yet
                raise NotImplementedFeature(f"model '{doc.model}' cannot run on {device.name}: {exc.message}",
                                            param="device") from None
            host_sizes(ex.module, doc)  # a state layout the host cannot size fails now, not at first use
            tokenizer = self._load_tokenizer(reg) if doc.tokenizer is not None else None
            spec = serving_spec(doc.kind, set(ex.programs))
            if spec is not None:
                _check_state_scopes(doc, ex, spec)
            policy = spec.create_policy(reg, ex, tokenizer) if spec is not None else None
            if getattr(policy, "images", None) is not None:
                policy.images.formats = self.image_formats
            with self._lock:
                reg.tokenizer, reg.policy, reg.spec = tokenizer, policy, spec
                reg.executables = ex
                reg.progress["stages"] = len(ex.programs)
                reg.components["primary"] = Component(doc.model, "primary", device,
                                                      lambda: self._prepare(reg, "primary"))
                for name in doc.components:
                    reg.components[name] = Component(doc.model, name, device,
                                                     lambda name=name: self._prepare(reg, name))
                for component in reg.components.values():
                    self.residency.add(component)
                if reg.variants is not None:
                    first = Variant(next_variant_id(), None, "compiling", ex.sources)
                    first.finish(ex)
                    first.users = 1
                    reg.variants.add(first)
                    reg.variants.selected = first.id
                    self._variant_owner[first.id] = reg.name
            if reg.removing:
                return
            if reg.admission == "drained":
                self._set_phase(reg, "deferred")
                return
            self._prepare_service(reg)
        except LoomError as exc:
            self._fail(reg, exc)
        except Exception as exc:  # a bug below us: keep it visible on the registration
            self._fail(reg, internal_error(log, f"internal error while building model '{doc.model}'", exc))

    def _load_tokenizer(self, reg: Registration) -> Any:
        ref = reg.document.tokenizer
        try:
            if ref.where == "package":
                return unpadded(Tokenizer.from_str(reg.package[ref.path].decode("utf-8")))
            return load_tokenizer(code_path(ref), cache_dir=self.cache_dir)
        except LoomError:
            raise
        except Exception as exc:
            raise LoomError(f"model '{reg.name}': cannot load tokenizer {ref.authored!r}: {exc}",
                            param="tokenizer") from None

    def _prepare(self, reg: Registration, component: str) -> dict[str, Any]:
        """Run the component's `prepare` program against its checkpoint (once per activation)."""
        doc = reg.document
        plan = reg.executables.module.components[component]
        if not plan.params:
            return {}
        checkpoint = doc.checkpoint if component == "primary" else doc.components[component].checkpoint
        def prepared(done: int, total: int) -> None:
            self._progress(reg, weights={"component": component, "prepared": done, "total": total})

        if not plan.reads_checkpoint:
            return prepare_params(plan, None, self.cache_dir, prepared)
        if checkpoint is None:
            raise PrepareError(f"model '{doc.model}' declares params but its document names no checkpoint",
                               param="checkpoint")
        adapters = tuple((f"lora.{a}.", code_path(ref)) for a, ref in enumerate(doc.loras.values())
                         if component == "primary")
        with open_checkpoints([code_path(ref) for ref in checkpoint], adapters) as ckpt:
            params = prepare_params(plan, ckpt, self.cache_dir, prepared)
            ckpt.release(param_arrays(params))
            return params

    def _prepare_service(self, reg: Registration) -> None:
        self._set_phase(reg, "preparing")
        component = reg.components["primary"]
        self.residency.load(component)
        state = allocate_state(reg.executables.module, reg.document)
        owner = f"{reg.name}/primary"
        with self._lock:
            reg.state_bytes = state_bytes(state)
            self.devices.set(component.device.key, owner, "state", reg.state_bytes)
            if reg.removing:
                return
            common = dict(variant=reg.variants.selected if reg.variants else None, max_active=reg.document.rows,
                          outcomes=lambda job, error: self._request_outcome(reg, job, error),
                          progress=lambda job, event, fields: self._request_progress(reg, job, event, fields))
            if reg.spec is not None:
                reg.service = reg.spec.create_service(reg, component, self.residency, state, **common)
            else:
                reg.service = StageService(reg.name, reg.executables, component, self.residency, state,
                                           reg.document.pending_capacity, **common)
            reg.service.start()
        self._set_phase(reg, "ready")

    # ---- admission ----------------------------------------------------------------------------

    def check_admission(self, reg: Registration, *, need_service: bool = True) -> None:
        """Unavailable (503) unless the deployment admits requests now. Utilities that need no
        weights (input-token counts, tokenization) pass `need_service=False`: compiled suffices."""
        name = reg.name
        with self._lock:
            if reg.removing:
                raise Unavailable(f"model '{name}' is being removed")
            if reg.phase == "failed":
                raise Unavailable(f"model '{name}' failed to load: {reg.error.message}")
            if reg.admission == "drained":
                raise Unavailable(f"model '{name}' is drained and admits no requests")
            ready = reg.phase == "ready" if need_service else reg.executables is not None
            if not ready:
                raise Unavailable(f"model '{name}' is not ready yet ({reg.phase})")

    def serving(self, name: Any, kind: str, what: str) -> Registration:
        """The registration `name` when it serves `kind` requests now (compiled: its policy runs
        without weights). Another kind, or a program without its kind's stages (native-only),
        is NotFound (404) naming `what` was asked (a route, for HTTP); admission as
        `check_admission`."""
        reg = self.get(name)
        if reg.document.kind != kind:
            raise NotFound(f"model '{reg.name}' is a {reg.document.kind} deployment; it does not serve {what}",
                           param="model")
        self.check_admission(reg, need_service=False)
        if reg.spec is None:
            raise NotFound(f"model '{reg.name}' is native-only (its program lacks the {kind} stages "
                           f"{', '.join(kind_spec(kind).stages)}); it serves no {what}", param="model")
        return reg

    def submit(self, name: str, job: Job) -> Future:
        """Queue a job on the deployment's service (HTTP inference goes through here)."""
        reg = self.get(name)
        with self._lock:
            self.check_admission(reg)
            return reg.service.submit(job)

    def admit_utility(self, reg: Registration) -> None:
        """Count one CPU utility request (an input-token count) against the deployment's bound:
        one running plus `pending_capacity` waiting; more is QueueFull (503)."""
        self.check_admission(reg, need_service=False)
        with self._lock:
            if reg.utility_in_flight >= reg.document.pending_capacity + 1:
                raise QueueFull(f"model '{reg.name}': the count queue is full; retry later")
            reg.utility_in_flight += 1

    def release_utility(self, reg: Registration) -> None:
        with self._lock:
            reg.utility_in_flight -= 1

    @contextlib.contextmanager
    def utility(self, reg: Registration, kind: str, route: str | None = None, *,
                bounded: bool = False) -> Iterator[Utility]:
        """Run one CPU utility request of `reg` inside the block: admitted as utilities are
        (`bounded`: also counted against the count queue, `admit_utility`), listed by
        `requests()` until the block ends, then reported by its `request` event."""
        if bounded:
            self.admit_utility(reg)
        else:
            self.check_admission(reg, need_service=False)
        job = Utility(kind, route)
        job.model = reg.name
        with self._lock:
            reg.utilities[job.id] = job
        error: LoomError | None = None
        try:
            yield job
        except LoomError as exc:
            error = exc
            raise
        except Exception as exc:
            error = LoomError(f"{kind} failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            with self._lock:
                reg.utilities.pop(job.id, None)
            if bounded:
                self.release_utility(reg)
            self._request_outcome(reg, job, error)

    def drain(self, name: str) -> Registration:
        return self._gate(name, "drained")

    def undrain(self, name: str) -> Registration:
        reg = self._gate(name, "open")
        with self._lock:
            start = reg.phase == "deferred"
            if start:
                reg.phase = "preparing"
        if start:
            self._spawn(reg, self._guarded, reg, self._prepare_service, reg)
        return reg

    def _gate(self, name: str, admission: str) -> Registration:
        reg = self.get(name)
        with self._lock:
            if reg.removing:
                raise Conflict(f"model '{name}' is being removed")
            reg.admission = admission
        self._event(reg, admission)
        return reg

    def _guarded(self, reg: Registration, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except LoomError as exc:
            if fn == self._prepare_service:
                self._fail(reg, exc)
            raise
        except Exception as exc:
            error = internal_error(log, f"internal error in model '{reg.name}'", exc)
            if fn == self._prepare_service:
                self._fail(reg, error)
            raise error from exc

    # ---- removal ------------------------------------------------------------------------------

    def unregister(self, name: str, mode: str = "drain") -> Future:
        """Start removal (HTTP 202): `drain` finishes accepted work, `abort` cancels it at the
        next step boundary. The future resolves when the name can be registered again."""
        if mode not in ("drain", "abort"):
            raise InvalidRequest(f"mode: expected \"drain\" or \"abort\", got {mode!r}", param="mode")
        reg = self.get(name)
        with self._lock:
            again = reg.removing is not None
            if again and not (reg.removing == "drain" and mode == "abort"):
                return reg.removed
            reg.removing = mode
            reg.phase = "removing"
            service = reg.service
            if not reg.withdrawn.done():
                reg.withdrawn.set_result(None)
        self._event(reg, "removing", mode=mode)
        if service is not None:
            # Stop the service now, not when `_remove` gets to it after joining pending tasks:
            # an abort applies at the next step boundary, whatever else is still in flight.
            service.stop(mode)
        if again:
            return reg.removed
        threading.Thread(target=self._remove, args=(reg,), name=f"loom-remove-{name}", daemon=True).start()
        return reg.removed

    def _remove(self, reg: Registration) -> None:
        while True:  # join the compiler's actual work on this model before releasing it
            with self._lock:
                tasks = [t for t in reg.tasks if not t.done()]
            if not tasks:
                break
            wait(tasks)
        with self._lock:
            service = reg.service
        if service is not None:
            service.stop(reg.removing).result()
        with self._lock:
            for component in reg.components.values():
                self.residency.retire(component)
            self.devices.release_owner(f"{reg.name}/primary")
            for component in reg.components:
                self.devices.release_owner(f"{reg.name}/{component}")
            if reg.variants is not None:
                for vid in reg.variants.records:
                    self._variant_owner.pop(vid, None)
            if self._regs.get(reg.name) is reg:
                del self._regs[reg.name]
        self._event(reg, "removed")
        reg.removed.set_result(reg.name)

    # ---- residency ------------------------------------------------------------------------------

    def _component(self, reg: Registration, component: Any) -> Component:
        if not isinstance(component, str) or not COMPONENT_NAME.fullmatch(component):
            raise InvalidRequest(f"component: expected a component name such as \"primary\", got {component!r}",
                                 param="component")
        if component not in reg.declared_components():
            raise NotFound(f"model '{reg.name}' declares no component '{component}' "
                           f"(it has: {', '.join(reg.declared_components())})", param="component")
        found = reg.components.get(component)
        if found is None:
            raise Conflict(f"model '{reg.name}' is {reg.phase}; its components exist once it compiled")
        return found

    def _residency_target(self, name: str, component: Any) -> tuple[Registration, Component]:
        reg = self.get(name)
        with self._lock:
            comp = self._component(reg, component)
            if reg.removing or reg.phase not in ("deferred", "ready"):
                raise Conflict(f"model '{name}' is {reg.phase}: residency operations need a healthy registration")
            if reg.admission != "drained":
                raise Conflict(f"model '{name}' admits requests: drain it before changing residency")
        return reg, comp

    def activate(self, name: str, component: Any = "primary") -> Future:
        """Load a component's params now (HTTP 202); a deferred primary prepares its service."""
        reg, comp = self._residency_target(name, component)
        with self._lock:
            deferred = reg.phase == "deferred" and comp.name == "primary"
            if deferred:
                reg.phase = "preparing"
        if deferred:
            return self._spawn(reg, self._guarded, reg, self._prepare_service, reg)
        return self._spawn(reg, self._guarded, reg, self._activated, reg, comp)

    def _activated(self, reg: Registration, comp: Component) -> None:
        self.residency.load(comp)
        self._event(reg, "activated", component=comp.name)

    def deactivate(self, name: str, component: Any = "primary") -> Future:
        """Release a component's params once no step uses them (HTTP 202); they reload on use."""
        reg, comp = self._residency_target(name, component)
        return self._spawn(reg, self._guarded, reg, self._deactivated, reg, comp)

    def _deactivated(self, reg: Registration, comp: Component) -> None:
        self.residency.evict(comp)
        self._event(reg, "deactivated", component=comp.name)

    def pin(self, name: str, component: Any = "primary", pinned: bool = True) -> Registration:
        reg = self.get(name)
        with self._lock:
            comp = self._component(reg, component)
            if reg.removing:
                raise Conflict(f"model '{name}' is being removed")
            self.residency.set_pinned(comp, pinned)
        self._event(reg, "pinned" if pinned else "unpinned", component=comp.name)
        return reg

    def unpin(self, name: str, component: Any = "primary") -> Registration:
        return self.pin(name, component, pinned=False)

    def trim(self, device: Any, target_bytes: Any) -> list[dict[str, Any]]:
        """Evict what is eligible on `device` down to `target_bytes`; returns its accounting."""
        key = parse_device_key(device)
        if isinstance(target_bytes, bool) or not isinstance(target_bytes, int) or target_bytes < 0:
            raise InvalidRequest(f"target_bytes: expected a non-negative integer, got {target_bytes!r}",
                                 param="target_bytes")
        dev = self.devices.get(key)
        self.residency.trim(dev, target_bytes)
        return self.devices.accounting(key)

    # ---- variants ---------------------------------------------------------------------------------

    def _variant_host(self, name: str) -> tuple[Registration, VariantTable]:
        reg = self.get(name)
        if reg.variants is None:
            raise NotImplementedFeature(f"model '{name}' has no native variants (its variant_capacity is 0)")
        if reg.removing or reg.phase != "ready":
            raise Conflict(f"model '{name}' is {reg.phase}: variants need a healthy prepared service")
        return reg, reg.variants

    def list_variants(self, name: str, offset: int = 0) -> dict[str, Any]:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidRequest(f"offset: expected a non-negative integer, got {offset!r}", param="offset")
        with self._lock:
            reg, table = self._variant_host(name)
            data, following = table.page(offset)
            return {"object": "list", "model": name, "selected": table.selected, "count": len(table.records),
                    "offset": offset, "data": data, "next_offset": following}

    def variant(self, name: str, variant: int) -> dict[str, Any]:
        with self._lock:
            reg, table = self._variant_host(name)
            found = table.records.get(variant)
            if found is None:
                raise NotFound(f"model '{name}' has no variant {variant}", param="variant")
            return found.record(detailed=True)

    def stage_variant(self, name: str, base: int, sources: Any, *, base_directory: str | None = None,
                      package: PackageFiles | None = None, origin: str = "request.json") -> Variant:
        """Start compiling a candidate provider set against `base`; never changes the selection."""
        refs = resolve_sources(sources, base_directory=base_directory, package=package, origin=origin)
        with self._lock:
            reg, table = self._variant_host(name)
            base_record = self._own_variant(reg, table, base, "base")
            if base_record.phase != "ready":
                raise Conflict(f"base variant {base} is {base_record.phase}, not ready", param="base")
            if len(table.records) >= table.capacity:
                raise TooManyRequests(f"model '{name}' keeps {table.capacity} variants (variant_capacity); "
                                      "remove one before staging another")
            candidate = Variant(next_variant_id(), base, "compiling",
                                tuple(r.path if r.where == "package" else r.authored for r in refs))
            table.add(candidate)
            self._variant_owner[candidate.id] = name
        self._event(reg, "variant_compiling", variant=candidate.id, base=base)
        self._spawn(reg, self._compile_variant, reg, candidate, base_record, refs, package)
        return candidate

    def _compile_variant(self, reg: Registration, candidate: Variant, base: Variant, refs, package) -> None:
        try:
            ex = compile_deployment(reg.document, reg.package, target=reg.executables.target, sources=refs,
                                    upload=package, cache_dir=self.cache_dir)
            problems = base.executables.contract.differences(ex.contract)
            if problems:
                raise CompileError(f"the candidate does not keep base variant {base.id}'s contract: "
                                   + "; ".join(problems))
            host_sizes(ex.module, reg.document)
            candidate.finish(ex)
        except LoomError as exc:
            # the retained error must not keep the compiler's frames (and with them the
            # candidate's uploaded package) alive: staging releases its source ownership
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            candidate.finish(error=exc)
        except Exception as exc:
            candidate.finish(error=internal_error(log, f"internal error while compiling variant {candidate.id}", exc))
        self._event(reg, "variant_" + candidate.phase, variant=candidate.id)

    def variant_settled(self, name: str, variant: Variant) -> list[Future]:
        """What a waiter for `variant` waits on (either settles it): its compilation ending, or
        the registration being withdrawn. An async caller awaits these without holding a
        thread for a compilation's length, then calls `wait_variant(..., timeout=0)`."""
        return [variant.done, self.get(name).withdrawn]

    def wait_variant(self, name: str, variant: Variant, timeout: float | None = None) -> Variant:
        """Wait for a staged candidate to finish compiling. An unregister withdraws the
        waiter with `Gone` (the compilation itself still runs to its end)."""
        reg = self.get(name)
        wait([variant.done, reg.withdrawn], timeout=timeout, return_when=FIRST_COMPLETED)
        if not variant.done.done():
            if reg.withdrawn.done():
                raise Gone(f"model '{name}' was unregistered while variant {variant.id} compiled")
            raise Unavailable(f"variant {variant.id} is still compiling")
        return variant

    def _own_variant(self, reg: Registration, table: VariantTable, vid: Any, what: str) -> Variant:
        if isinstance(vid, bool) or not isinstance(vid, int):
            raise InvalidRequest(f"{what}: expected a variant ID (integer), got {vid!r}", param=what)
        found = table.records.get(vid)
        if found is None:
            owner = self._variant_owner.get(vid)
            if owner is not None and owner != reg.name:
                raise Conflict(f"variant {vid} belongs to model '{owner}', not '{reg.name}'", param=what)
            raise NotFound(f"model '{reg.name}' has no variant {vid}", param=what)
        return found

    def select_variant(self, name: str, variant: Any, expected: Any) -> Future:
        """Select a ready candidate if `expected` is still the selection; the future resolves
        with the new selection once the service switched at its safe boundary."""
        with self._lock:
            reg, table = self._variant_host(name)
            if isinstance(expected, bool) or not isinstance(expected, int):
                raise InvalidRequest(f"expected: expected a variant ID (integer), got {expected!r}",
                                     param="expected")
            candidate = self._own_variant(reg, table, variant, "variant")
            if table.selecting is not None:
                raise Conflict(f"model '{name}' is already switching to variant {table.selecting}")
            if expected != table.selected:
                raise Conflict(f"stale expected variant {expected}: model '{name}' runs variant {table.selected}",
                               param="expected")
            if candidate.phase != "ready":
                raise Conflict(f"variant {candidate.id} is {candidate.phase}; only a ready variant can be selected",
                               param="variant")
            done: Future = Future()
            if candidate.id == table.selected:
                done.set_result(candidate.id)
                return done
            table.selecting = candidate.id
            candidate.users += 1                       # reserved: removal now conflicts
            switched = reg.service.select(candidate.executables, candidate.id)

        def applied(f: Future) -> None:
            with self._lock:
                table.selecting = None
                if f.exception() is not None:
                    candidate.users -= 1
                else:
                    previous = table.records.get(table.selected)
                    if previous is not None:
                        previous.users -= 1
                    table.selected = candidate.id
            if f.exception() is not None:
                done.set_exception(f.exception())
            else:
                self._event(reg, "variant_selected", variant=candidate.id)
                done.set_result(candidate.id)

        switched.add_done_callback(applied)
        return done

    def remove_variant(self, name: str, variant: Any) -> int:
        with self._lock:
            reg, table = self._variant_host(name)
            if isinstance(variant, bool) or not isinstance(variant, int):
                raise InvalidRequest(f"variant: expected a variant ID (integer), got {variant!r}", param="variant")
            found = table.records.get(variant)
            if found is None:
                raise NotFound(f"model '{name}' has no variant {variant}", param="variant")
            if found.phase == "compiling":
                raise Conflict(f"variant {variant} is still compiling", param="variant")
            if found.users:
                raise Conflict(f"variant {variant} is in use ({found.users} consumer(s))", param="variant")
            del table.records[variant]
            self._variant_owner.pop(variant, None)
        self._event(reg, "variant_removed", variant=variant)
        return variant

    # ---- shutdown -----------------------------------------------------------------------------------

    def requests(self, model: str | None = None) -> list[dict[str, Any]]:
        """Every live request (service jobs, active or pending, and CPU utilities), ordered by id."""
        regs = [self.get(model)] if model is not None else self.registrations()
        out = [r for reg in regs if reg.service is not None for r in reg.service.requests()]
        with self._lock:
            out += [u.describe("active") for reg in regs for u in reg.utilities.values()]
        return sorted(out, key=lambda r: r["id"])

    def sessions(self, model: str | None = None) -> list[dict[str, Any]]:
        """Retained sessions of the deployments whose services keep them (named text histories,
        sequence handles), ordered by `order`, the key `/v1/sessions` pages by. Naming a
        deployment whose service retains no sessions is `NotImplementedFeature` (501)."""
        regs = [self.get(model)] if model is not None else self.registrations()
        out: list[dict[str, Any]] = []
        for reg in regs:
            found = reg.service.sessions() if reg.service is not None else None
            if found is None:
                if model is not None:
                    raise NotImplementedFeature(f"model '{model}' retains no sessions (neither text histories "
                                                "nor sequence handles)", param="model")
                continue
            out += found
        for order, item in enumerate(out, 1):
            item.setdefault("order", order)
        return sorted(out, key=lambda item: item["order"])

    def close(self, mode: str = "drain", timeout: float | None = None) -> None:
        """Remove every registration and stop the workers. Under `drain`, accepted work gets
        `timeout` seconds to finish; what is left then is aborted at its next step boundary."""
        futures = [self.unregister(reg.name, mode) for reg in self.registrations()]
        _, left = wait(futures, timeout=timeout)
        if left and mode == "drain":
            futures = [self.unregister(reg.name, "abort") for reg in self.registrations()]
            wait(futures, timeout=timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["Registration", "Registry", "Utility"]


def _check_state_scopes(doc: ModelDocument, ex: Executables, spec: Any) -> None:
    """A kind's service retains only the state scopes it knows (a text row is a slot of the
    step, not a persistent row): a program asking for another is refused when it compiles."""
    for stage in spec.stages:
        for state in ex.module.stage_states(stage):
            if state.scope not in spec.state_scopes:
                kept = " and ".join(f"`per {scope}`" for scope in spec.state_scopes) or "no"
                raise CompileError(f"model '{doc.model}': stage '{stage}' binds `per {state.scope}` state "
                                   f"'{state.name}', but a {doc.kind} deployment retains {kept} state")
